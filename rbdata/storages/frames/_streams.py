"""Which frames of a write are new: :class:`StreamTracker` and the planning kernel.

A write brings, per step, two stacks (observation and next observation) of ``stack`` frames.
Most of them are stored already: the observation of a step is the next observation of the
step before it *in the same env stream*, and the next observation shares all but its newest
frame with the observation. The plan finds every frame it can reuse by comparing bytes (so a
guess can cost space, never correctness), and numbers the rest as new frames.

Candidates for step ``j``'s observation, in order: the next observation of step ``j - 1`` of
the same write (a trajectory written in chunks), then the stack the tracker kept for position
``j`` of the previous write (vectorised envs: one write of ``n_envs`` steps per env step,
stream ``j`` at position ``j``), then, for ``j == 0``, the previous write's last step. With no
full match the stack's frames are stored, a frame equal to the one before it in the stack
once (a reset with repeated frames stores one frame). The next observation reuses the
observation's frames shifted by one where they are equal, else a repeat of its own previous
frame, else a new frame.

The tracker keeps the next observations of the last write's first :data:`TRACKED` positions
and of its last step (for a write of more than one step): their slots in the pool (``refs``),
on which it holds a reference, so a candidate's frames are always still stored.

Kept by reference or by copy: the invariant. A pinned slot is never freed, reused nor written
(only a free slot is taken and stored to), so ``pool words[refs[j]]`` *are* kept stack ``j``'s
frames for as long as the tracker keeps it. Where the pool has them as raw CPU words
(:meth:`FramePool.words` is not ``None``) the tracker compares there and keeps no bytes of its
own (``data`` is empty: by reference); else (a codec's blobs, device frames) ``data`` holds a
byte copy of each kept stack, which ``keep`` (and the per-step kernel) write and the plan
compares (by copy). The mode is the pool's, asked at each call and fixed for its life (its
codec and device), so ``keep`` and the next ``plan`` always agree, whatever came between:
a pickled or reopened storage (the pins travel with the pool's counts, or are forgotten with
the counts rebuilt), ``clear()`` (forgotten), pool growth (the frames move with their slots:
the words view is taken at each call, never kept). Both modes read the same stacks: with a
copy, the pinned slots hold the same bytes.
"""

from __future__ import annotations

import numpy as np

from rbdata.storages.frames._kernels import plan
from rbdata.storages.frames._pool import FramePool

__all__ = ["TRACKED", "StreamTracker"]

_NONE = np.zeros(0, np.int64)

#: Env streams followed across writes (positions of a batched write; SB3's ``n_envs``).
TRACKED = 64


class StreamTracker:
    """The last write's next observations (bytes and pinned slots), as candidates.

    Args:
        stack: frames per stack.
        pool: the frames: their word (``uint64`` where the frame bytes allow, else ``uint8``)
            and length, and whether the stacks are kept by reference or by copy (the module
            docstring).
    """

    def __init__(self, stack: int, pool: FramePool) -> None:
        words = pool.frame_bytes // np.dtype(pool.word).itemsize
        rows = 0 if pool.words() is not None else TRACKED + 1  # by reference: no copies
        self.data = np.zeros((rows, stack, words), pool.word)
        self.refs = np.zeros((TRACKED + 1, stack), np.int64)
        self.count = 0  # positions kept
        self.last = -1  # row of the last write's last step (a write of 2 steps or more), or -1

    def pinned(self) -> np.ndarray:
        """The slots this tracker holds a reference on."""
        rows = self.count + (1 if self.last >= 0 else 0)
        return self.refs[:rows]

    def plan(
        self, obs: np.ndarray, nxt: np.ndarray, refs: np.ndarray, pool: FramePool
    ) -> np.ndarray:
        """Plan a write (see ``_kernels.plan``): the new frames, as ``uint8`` rows."""
        rows = np.empty((refs.size, obs.shape[2]), obs.dtype)
        source = pool.words()
        index: np.ndarray = self.refs
        if source is None:  # by copy: kept stack j's frame k is data row j * S + k
            source = self.data.reshape(-1, obs.shape[2])
            index = np.arange(source.shape[0]).reshape(self.refs.shape)
        count = plan(obs, nxt, source, index, self.refs, self.count, self.last, refs, rows)
        return rows[:count].view(np.uint8)

    def keep(self, nxt: np.ndarray, refs: np.ndarray, pool: FramePool) -> None:
        """Keep this write's next observations (``refs``: its final ``[n, 2, S]`` slots)."""
        n = nxt.shape[0]
        copies = pool.words() is None
        if n == 1 and self.count <= 1 and self.last < 0:  # the per-step case: one stream
            old = self.refs[:1].copy() if self.count else _NONE
            if copies:
                self.data[0] = nxt[0]
            self.refs[0] = refs[0, 1]
            self.count = 1
            pool.settle(self.refs[:1], _NONE, old)
            return
        old = self.pinned().copy()
        count = min(n, TRACKED)
        if copies:
            self.data[:count] = nxt[:count]
        self.refs[:count] = refs[:count, 1]
        self.count = count
        self.last = -1
        if n > 1:  # a trajectory written in chunks continues from the last step
            if copies:
                self.data[count] = nxt[n - 1]
            self.refs[count] = refs[n - 1, 1]
            self.last = count
        pool.acquire(self.pinned())
        pool.release(old)

    def kept_one(self) -> None:
        """One step's next observation was kept at position 0 (``FramePool.admit_one``).

        Its slots are in ``refs[0]`` and, by copy, its bytes in ``data[0]``.
        """
        self.count = 1
        self.last = -1

    def forget(self, pool: FramePool | None) -> None:
        """Drop every kept stack (and, with ``pool``, their references)."""
        if pool is not None:
            pool.release(self.pinned().copy())
        self.count = 0
        self.last = -1
