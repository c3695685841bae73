"""Drop-in replacements for Stable-Baselines3's replay buffers, backed by rbdata storages.

``from rbdata.compat.sb3 import ReplayBuffer`` instead of
``from stable_baselines3.common.buffers import ReplayBuffer`` (and ``DictReplayBuffer`` for
``Dict`` observation spaces): same constructor, ``add``, ``sample`` (a
:class:`ReplayBufferSamples` with SB3's field names, shapes and dtypes), ``size()``, ``full``,
``pos``, ``reset()``, ``_maybe_cast_dtype``, and SB3's arrays ``observations``,
``next_observations``, ``actions``, ``rewards``, ``dones``, ``timeouts``
(``[buffer_size, n_envs, ...]``), which are views of the storage's memory: reads see what
``add`` wrote and writes land in the storage, without a copy. On top:
:meth:`ReplayBuffer.dumps` / :meth:`ReplayBuffer.loads` checkpoints, ``storage="memmap"``
(files bigger than RAM), ``storage="frames"`` (image stacks in a
:class:`~rbdata.storages.FrameStackStorage`: each frame stored once, optionally compressed; a
1M-step Atari buffer is built at once and takes memory as it is written), and
:class:`PrioritizedReplayBuffer`.

:class:`PrioritizedDQN` is SB3's ``DQN`` trained on a :class:`PrioritizedReplayBuffer`:
importance-weighted loss, priorities updated from the TD errors (SB3's own ``DQN`` never
updates them, and a prioritized buffer sampled many times with no update warns once). It is
the one name here that imports stable-baselines3, on first use.

Otherwise stable-baselines3 is not imported; spaces are read by duck typing (``.shape``,
``.dtype``, ``.n``, ``.nvec``, ``.spaces`` and the class names). When SB3 is imported, its
``isinstance`` checks accept these classes (virtual subclasses of SB3's abstract buffers; see
:func:`register_with_sb3`), so SB3's algorithms take them as ``replay_buffer_class`` and
``load_replay_buffer`` takes them back.

Layout: one storage item per ``(slot, env)`` transition, at flat index ``slot * n_envs + env``.
Each leaf, viewed as ``[buffer_size, n_envs, ...]``, is exactly SB3's array, one ``add`` is
one contiguous write of ``n_envs`` items, a draw of SB3's ``(batch_inds, env_indices)`` is one
flat uniform draw, and the storage stays an ordinary rbdata dataset of transitions (keys
``observation``, ``action``, ``("next", "observation")``, ``("next", "reward")``,
``("next", "done")``, ``("next", "truncated")``; ``("observation", key)`` per key of a
``Dict`` space) that priorities, checkpoints and ``DataLoader`` use per transition. See
``docs/compat.md``.
"""

from typing import TYPE_CHECKING

from rbdata._core.lazy import lazy_names
from rbdata.compat.sb3._buffer import (
    DictReplayBuffer,
    DictReplayBufferSamples,
    ReplayBuffer,
    ReplayBufferSamples,
)
from rbdata.compat.sb3._prioritized import PrioritizedReplayBuffer, PrioritizedReplayBufferSamples
from rbdata.compat.sb3._register import register_if_loaded, register_with_sb3

if TYPE_CHECKING:  # imports stable-baselines3: on first use (below)
    from rbdata.compat.sb3._dqn import PrioritizedDQN

__all__ = [
    "DictReplayBuffer",
    "DictReplayBufferSamples",
    "PrioritizedDQN",
    "PrioritizedReplayBuffer",
    "PrioritizedReplayBufferSamples",
    "ReplayBuffer",
    "ReplayBufferSamples",
    "register_with_sb3",
]


__getattr__, __dir__ = lazy_names(__name__, {"PrioritizedDQN": "rbdata.compat.sb3._dqn"}, globals())

register_if_loaded()  # SB3 imported first: its isinstance checks accept ours from now on
