"""The frames side of a :class:`~rbdata.storages.FrameStackStorage` write: :class:`FrameWriter`.

Every write path of the storage (``commit``, the per-step ``add_fast`` and ``extend_fast``)
does the same three things around writing its steps:

1. read the refs of the stored steps it overwrites (:meth:`FrameWriter.old_refs`);
2. :meth:`FrameWriter.admit` the new steps' stacks: plan which frames are new
   (``_streams.py``), store those in fresh slots of the pool, take a reference on every frame
   the new steps use, and let the tracker keep this write's next observations;
3. write the steps with their refs, *then* :meth:`FrameWriter.release` the old refs, so a
   slot freed by a write is never reused by that same write (a kill between the frames and
   the steps never leaves old steps over new frames).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rbdata.storages.base import Storage
from rbdata.storages.frames._pool import FramePool
from rbdata.storages.frames._streams import StreamTracker

__all__ = ["FrameWriter"]

_NONE = np.zeros(0, np.int64)
_NONE32 = np.zeros(0, np.int32)


class FrameWriter:
    """Frame references of a storage's writes (see the module docstring).

    Args:
        pool: the storage's frames.
        tracker: the stacks kept as candidates across writes.
        steps: the storage of the steps, whose last leaf holds each step's refs.
        stack: frames per stack.
    """

    def __init__(self, pool: FramePool, tracker: StreamTracker, steps: Storage, stack: int) -> None:
        self.pool = pool
        self.tracker = tracker
        self.stack = stack
        self._steps = steps
        self.word: Any = pool.word
        words = pool.frame_bytes // np.dtype(pool.word).itemsize
        self._scratch = np.empty((2 * stack, words), pool.word)  # admit_one's new frames
        self._mark = 0  # the pool's free-stack mark of the last admit_one (see undrop)
        self._refs_cache: tuple[torch.Tensor, int, np.ndarray] | None = None

    def words(self, data: Any, n: int) -> np.ndarray:
        """Stacks (a tensor or an array, ``[n, stack, *frame]``) as ``[n, stack, words]``.

        A view where the data is contiguous on the CPU, else a copy.
        """
        if type(data) is np.ndarray and data.flags.c_contiguous:  # an env's own array
            return data.reshape(n, self.stack, -1).view(self.word)
        if isinstance(data, torch.Tensor):
            data = data.detach().contiguous().view(torch.uint8).numpy()
        arr = np.ascontiguousarray(data).view(np.uint8).reshape(n, self.stack, -1)
        return arr.view(self.word)

    def admit_one(self, obs: Any, nxt: Any, old: np.ndarray) -> np.ndarray | None:
        """:meth:`admit` and :meth:`release` of one step of one stream in one kernel call.

        ``obs``, ``nxt``: the step's stacks ``[S, *frame]`` (numpy arrays or tensors). Returns the
        step's refs ``[1, 2, S]``, its frames stored and ``old`` (the refs of the step it
        overwrites, from :meth:`old_ref`) already dropped: if the step is then not written,
        :meth:`undrop` takes them back. ``None`` (nothing changed) where the kernel does not apply:
        more than one stream followed, device frames, zstd, a pool that must grow. Then
        :meth:`admit` does it, and :meth:`release` follows the steps' write.
        """
        tracker = self.tracker
        if tracker.count > 1 or tracker.last >= 0:
            return None
        if not (type(obs) is np.ndarray and obs.flags.c_contiguous):
            obs = self.words(obs, 1)
        if not (type(nxt) is np.ndarray and nxt.flags.c_contiguous):
            nxt = self.words(nxt, 1)
        refs = np.empty((1, 2, self.stack), np.int64)
        kept, kept_refs, scratch = tracker.data, tracker.refs, self._scratch
        mark = self.pool.admit_one((obs, nxt, refs, old), kept, kept_refs, tracker.count, scratch)
        if mark < 0:
            return None
        self._mark = mark
        tracker.kept_one()
        return refs

    def undrop(self, old: np.ndarray) -> None:
        """Take back the references :meth:`admit_one` dropped (its step was not written)."""
        self.pool.undrop(old, self._mark)

    def admit(self, obs: np.ndarray, nxt: np.ndarray, slots: np.ndarray | None = None) -> Any:
        """Store a write's new frames and take references: its refs ``[n, 2, stack]`` int64.

        ``slots``: the write's slots when an item may repeat one (the last write wins: the
        references of the items written over within the write are dropped).
        """
        pool, tracker = self.pool, self.tracker
        refs = np.empty((obs.shape[0], 2, self.stack), np.int64)
        frames = tracker.plan(obs, nxt, refs)
        fresh = pool.take(frames.shape[0])
        pool.store(fresh, frames)
        pool.settle(refs, fresh, _NONE)  # placeholders resolved, references taken
        tracker.keep(nxt, refs, pool)  # pins first: it may keep a dropped item's frames
        if slots is not None:
            _, last = np.unique(slots[::-1], return_index=True)
            keep = np.zeros(slots.size, bool)
            keep[slots.size - 1 - last] = True
            if not keep.all():
                pool.release(refs[~keep])
        return refs

    def release(self, old: np.ndarray) -> None:
        """Drop the references of the steps a write overwrote (after it wrote its steps)."""
        self.pool.release(old)

    def old_refs(self, slots: np.ndarray, length: int) -> np.ndarray:
        """The refs of the stored steps (below ``length``) that ``slots`` overwrite, once each."""
        live = slots[slots < length]
        if not live.size:
            return _NONE
        if live.size > 1:
            live = np.unique(live)
        refs = self._steps.buffers[-1]  # type: ignore[attr-defined]
        if not refs.is_cpu:  # gather on the device, copy only these rows
            index = torch.from_numpy(live).to(refs.device)
            return refs.index_select(0, index).cpu().numpy().astype(np.int64)
        return self._rows()[live].astype(np.int64)

    def old_ref(self, slot: int, length: int) -> np.ndarray:
        """:meth:`old_refs` of one slot of CPU steps (the per-step path), 1-D int32."""
        return self._rows()[slot].flatten() if slot < length else _NONE32  # a copy

    def _rows(self) -> np.ndarray:
        """The CPU steps' refs as numpy ``[capacity, 2, stack]`` int32 (a view).

        The view is cached with the data pointer of the steps' refs buffer and rebuilt when
        that moved (see ``rbdata/storages/_memory.py``).
        """
        refs = self._steps.buffers[-1]  # type: ignore[attr-defined]
        cached = self._refs_cache
        if cached is not None and cached[0] is refs and cached[1] == refs.data_ptr():
            return cached[2]
        view = refs.numpy()
        self._refs_cache = (refs, refs.data_ptr(), view)
        return view

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a FrameWriter is its storage's: pickle the storage")
