"""Drop-in replacements for Stable-Baselines3's ``ReplayBuffer``, backed by rbdata storages.

``from rbdata.compat.sb3 import ReplayBuffer`` instead of
``from stable_baselines3.common.buffers import ReplayBuffer``: same constructor, ``add``,
``sample`` (a :class:`ReplayBufferSamples` with SB3's field names, shapes and dtypes),
``size()``, ``full``, ``pos``, ``reset()``. On top: :meth:`ReplayBuffer.dumps` /
:meth:`ReplayBuffer.loads` checkpoints, ``storage="memmap"`` (files bigger than RAM), and
:class:`PrioritizedReplayBuffer`. stable-baselines3 is not imported; spaces are read by duck
typing (``.shape``, ``.dtype``, ``.n``, ``.nvec`` and the class names).

Layout: one storage item per ``(slot, env)`` transition, at flat index ``slot * n_envs + env``.
Each leaf, viewed as ``[buffer_size, n_envs, ...]``, is exactly SB3's array, one ``add`` is
one contiguous write of ``n_envs`` items, a draw of SB3's ``(batch_inds, env_indices)`` is one
flat uniform draw, and the storage stays an ordinary rbdata dataset of transitions (keys
``observation``, ``action``, ``("next", "observation")``, ``("next", "reward")``,
``("next", "done")``, ``("next", "truncated")``) that priorities, checkpoints and
``DataLoader`` use per transition. See ``docs/compat.md``.
"""

from rbdata.compat._sb3_buffer import (
    PrioritizedReplayBufferSamples,
    ReplayBuffer,
    ReplayBufferSamples,
)
from rbdata.compat._sb3_prioritized import PrioritizedReplayBuffer

__all__ = [
    "PrioritizedReplayBuffer",
    "PrioritizedReplayBufferSamples",
    "ReplayBuffer",
    "ReplayBufferSamples",
]
