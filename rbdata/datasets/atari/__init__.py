"""``AtariDQN``: the DQN Replay Dataset, as frame-stacked transitions, converted once.

The DQN Replay Dataset (Agarwal, Schuurmans and Norouzi, 2020; google-research/batch_rl) is
the replay buffer of a DQN agent trained with Dopamine on 60 Atari games (sticky actions,
frame skip 4), 5 runs each, logged by batch_rl's ``OutOfGraphLoggedReplayBuffer`` every time
it filled: checkpoints ``0`` to ``50`` of 1M records of single 84x84 uint8 frames, one file per
array (``_catalog``). The rules below are those of Dopamine's
``dopamine/replay_memory/circular_replay_buffer.py`` (``OutOfGraphReplayBuffer``), read
there, with ``stack_size`` 4 and ``update_horizon`` 1 (batch_rl's ``dqn.gin``).

**Records.** ``add(observation, action, reward, terminal)`` writes one record at the cursor
(``add_count % capacity``) and increments ``add_count``. The agent's record of step ``t``
holds the frame it acted on, its action, the reward that followed and ``terminal`` (1 where
the episode ended after the action; Dopamine's agent then stored 1 at game over and at the
27,000-step limit alike). Before an episode's first record (buffer empty, or the previous
record terminal) ``add`` writes ``stack - 1`` = 3 padding records: a zero frame, action 0,
reward 0, terminal 0.

**Order.** The buffer is circular. Once ``add_count >= capacity`` (full) the oldest record is
at the cursor: the records run ``cursor .. capacity - 1, 0 .. cursor - 1``; before, they run
``0 .. add_count - 1`` and the rows after hold nothing. Transitions come in that order,
checkpoint after checkpoint in increasing order.

**Stacks.** The observation of index ``i`` is frames ``i - 3, i - 2, i - 1, i``, oldest first,
around the circle (``get_observation_stack``; Dopamine puts the stack axis last, rbdata
first: ``[4, 84, 84]``). The next observation is the stack of ``i + 1``
(``sample_transition_batch``): frames ``i - 2 .. i + 1``, the observation shifted by one frame.

**Valid transitions** (``is_valid_transition``). Index ``i`` is a transition iff: the buffer
is full, or ``3 <= i < cursor - 1`` (the first three rows are the first episode's padding,
and the record after ``i`` must exist); ``i`` is not in ``invalid_range`` (the file's; Dopamine
sets it to ``cursor - 1 .. cursor + 3``: the newest record, which has no next record, and the
records at the cursor, whose stacks would mix the oldest records with the newest); and none of
frames ``i - 3 .. i - 1`` is a terminal (the stack stays in one episode). Every other index,
terminals included, is a transition; padding records never are (their stacks hold the previous
episode's terminal).

**Episode starts and ends.** An episode's first transition is its first real record: its
stack is the three zero padding frames and the first frame, ``[0, 0, 0, o_0]``, then
``[0, 0, o_0, o_1]`` and so on: zero-padded, exactly as Dopamine samples it (the zeros are the
padding records of the file). At a terminal, record ``i + 1`` is the next episode's first
padding record: the next observation's newest frame is zeros (Dopamine: "undefined");
``("next", "done")`` is True there, so no target bootstraps from it.

====================================  ===================================================
key                                   from the checkpoint (index ``i``)
====================================  ===================================================
``"observation"`` ``[N, 4, H, W]``    frames ``i - 3 .. i`` (uint8; 84x84 in the dataset)
``("next", "observation")``           frames ``i - 2 .. i + 1``
``"action"`` ``[N]``                  ``$store$_action`` (the file's dtype: int32)
``("next", "reward")`` ``[N, 1]``     ``$store$_reward`` (float32)
``("next", "done")`` ``[N, 1]``       ``$store$_terminal`` (bool)
``("next", "terminated")`` ``[N, 1]`` the same: the files tell no truncation apart
``"episode"`` ``[N]`` int64           0, 1, 2, ... in order; an episode ends at a done
                                      transition, and each checkpoint starts a new one
====================================  ===================================================

**The last checkpoint.** By batch_rl's code, a checkpoint is saved whenever an ``add`` leaves
the cursor at ``capacity - 1`` (about every 1M records; from the second on, one reads from row
``capacity - 1`` round to ``capacity - 2``), and once more at the end of training with
``add_count`` set to the cursor (``log_final_buffer``): that last one, expected at suffix 50,
reads as not full and holds only the records since the one before. ``info["metadata"]
["checkpoints"]`` gives each checkpoint's capacity, ``add_count``, cursor and transitions.

The files come from the public bucket (behind ``RBDATA_ATARI_DQN_MIRROR`` if set: a mirror of
its ``dqn/`` folder, a URL or a ``file://`` folder) or from a local folder (``file=``, e.g. what
``gsutil -m cp -R gs://atari-replay-datasets/dqn/Pong/1 .`` writes): a local file is
verified like a download (against ``sha256=`` where given) and read in place, never copied,
modified or deleted. The digest of every file is recorded in the entry
(``info["source"]["files"]``).

The package: ``_catalog`` (the catalog and the ``list`` rows; no torch, so
``rbdata datasets list`` reads it alone), ``_convert`` (Dopamine's checkpoint files and the
conversion) and ``_dataset`` (:class:`AtariDQN`, which imports torch: it is imported on first
use of its names here, PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the dataset imports torch: on first use (see __getattr__)
    from rbdata.datasets.atari._dataset import (
        MIRROR_ENV,
        AtariDQN,
        open_atari,
        prepare,
        source_url,
    )

__all__ = ["MIRROR_ENV", "AtariDQN", "open_atari", "prepare", "source_url"]


def __getattr__(name: str) -> Any:
    """Import the dataset's names on first use (PEP 562); plain attributes afterwards."""
    if name not in __all__:
        raise AttributeError(f"module 'rbdata.datasets.atari' has no attribute {name!r}")
    value = getattr(importlib.import_module("rbdata.datasets.atari._dataset"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
