"""The frames side of a :class:`~rbdata.storages.FrameStackStorage` write: :class:`FrameWriter`.

Every write path of the storage (:meth:`FrameWriter.commit`, the per-step
:meth:`FrameWriter.put_row` of ``add_fast`` and :meth:`FrameWriter.write_rows` of
``extend_fast``) does the same three things around writing its steps:

1. read the refs of the stored steps it overwrites (:meth:`FrameWriter.old_refs`);
2. :meth:`FrameWriter.admit` the new steps' stacks: plan which frames are new
   (``_streams.py``), store those in fresh slots of the pool, take a reference on every frame
   the new steps use, and let the tracker keep this write's next observations;
3. write the steps with their refs, *then* :meth:`FrameWriter.release` the old refs, so a
   slot freed by a write is never reused by that same write (a kill between the frames and
   the steps never leaves old steps over new frames).

The writer writes the steps too (the storage of the steps it was given, through its public
write methods); the storage keeps its own counts (length, next slot, items written).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rbdata._core.layout import Layout
from rbdata.storages.base import Prepared, Storage, WriteTarget
from rbdata.storages.frames._pool import FramePool
from rbdata.storages.frames._streams import StreamTracker

__all__ = ["FrameWriter"]

_NONE = np.zeros(0, np.int64)


class FrameWriter:
    """Frame references of a storage's writes (see the module docstring).

    Args:
        pool: the storage's frames.
        tracker: the stacks kept as candidates across writes.
        steps: the storage of the steps, whose last leaf holds each step's refs.
        stack: frames per stack.
        places: where the storage's layout has the stacks and the other leaves: ``(obs_at,
            next_at, others)``.
        steps_layout: the steps' layout (the other leaves, then the refs).
    """

    def __init__(
        self,
        pool: FramePool,
        tracker: StreamTracker,
        steps: Storage,
        stack: int,
        places: tuple[int, int, list[int]],
        steps_layout: Layout,
    ) -> None:
        self.pool = pool
        self.tracker = tracker
        self.stack = stack
        self.places = places
        self.steps_layout = steps_layout
        self._steps = steps
        self.word: Any = pool.word
        words = pool.frame_bytes // np.dtype(pool.word).itemsize
        self._scratch = np.empty((2 * stack, words), pool.word)  # admit_one's new frames
        self._both = np.empty((2, 2, stack), np.int64)  # admit_one's refs and overwritten refs
        self._no_row = np.zeros((0, stack), np.int32)  # admit_one's overwritten refs: none
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

    def admit_one(self, obs: Any, nxt: Any, stored: np.ndarray) -> np.ndarray | None:
        """:meth:`admit` and :meth:`release` of one step of one stream in one kernel call.

        ``obs``, ``nxt``: the step's stacks ``[S, *frame]`` (numpy arrays or tensors); ``stored``:
        the refs of the step it overwrites, as stored (a view ``[2, S]``, or ``[0, S]``: none).
        Returns ``[2, 2, S]`` int64, this writer's scratch (valid until the next call): the step's
        refs ``[0]``, its frames stored, and a copy of ``stored`` ``[1]`` (flattened), already
        dropped: if the step is then not written, :meth:`undrop` takes them back. ``None``
        (nothing changed) where the kernel does not apply: more than one stream followed, device
        frames, zstd, a pool that must grow. Then :meth:`admit` does it, and :meth:`release`
        follows the steps' write.
        """
        tracker = self.tracker
        if tracker.count > 1 or tracker.last >= 0:
            return None
        if not (type(obs) is np.ndarray and obs.flags.c_contiguous):
            obs = self.words(obs, 1)
        if not (type(nxt) is np.ndarray and nxt.flags.c_contiguous):
            nxt = self.words(nxt, 1)
        both = self._both
        step = (obs, nxt, both, stored)
        mark = self.pool.admit_one(step, tracker.data, tracker.refs, tracker.count, self._scratch)
        if mark < 0:
            return None
        self._mark = mark
        tracker.kept_one()
        return both

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
        frames = tracker.plan(obs, nxt, refs, pool)
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

    # --- the write paths: frames, steps, then the old frames released ---------------------
    def commit(self, target: WriteTarget, prepared: Prepared, length: int) -> None:
        """Write a prepared batch (the storage's layout) at ``target``; ``length``: steps held."""
        obs_at, next_at, others = self.places
        payload, n = prepared.payload, target.n
        obs, nxt = self.words(payload[obs_at], n), self.words(payload[next_at], n)
        slots = target.slots_numpy()
        old = self.old_refs(slots, length)  # released once the steps are committed
        refs = self.admit(obs, nxt, None if target.indices is None else slots)
        rows = torch.from_numpy(refs.astype(np.int32))
        inner = [payload[i] for i in others]
        inner.append(rows if prepared.batched else rows[0])
        first = self._steps.layout is None
        steps = Prepared(inner, n, self.steps_layout if first else None, prepared.batched)
        self._steps.commit(target, steps)
        self.release(old)  # after the commit: a kill never leaves old steps over new frames

    def put_row(self, slot: int, values: list[Any], length: int) -> None:
        """Write one checked step (numpy leaves in layout order) at ``slot`` of CPU steps."""
        obs_at, next_at, others = self.places
        obs, nxt = values[obs_at], values[next_at]
        stored = self._rows()[slot] if slot < length else self._no_row  # a view
        both = self.admit_one(obs, nxt, stored)  # old dropped too (undone if the write fails)
        late = None
        if both is not None:
            refs = both[0]
        else:
            late = stored.flatten()  # a copy, released after the steps' write
            refs = self.admit(self.words(obs, 1), self.words(nxt, 1))[0]
        rows = [values[i] for i in others]
        rows.append(refs)  # cast to int32 by the row assignment
        steps = self._steps
        try:
            if not steps.write_row(slot, rows):  # e.g. the steps' views were dropped
                payload = [torch.as_tensor(np.asarray(r)) for r in rows]
                payload[-1] = payload[-1].to(torch.int32)
                steps.commit(WriteTarget.one(slot), Prepared(payload, 1, None, False))
        except BaseException:  # the step was not written: the old one keeps its frames
            if late is None:  # the kernel's copy of the dropped refs
                self.undrop(both[1].reshape(-1)[: stored.size])  # type: ignore[index]
            self.release(refs)
            raise
        if late is not None:
            self.release(late)  # after the steps: a freed frame is never reused by this write

    def write_rows(self, start: int, n: int, values: list[Any], length: int) -> None:
        """Write ``n`` checked steps (numpy leaves) at the ring slots from ``start``."""
        steps = self._steps
        slots = np.arange(start, start + n) % steps.capacity
        obs_at, next_at, others = self.places
        obs, nxt = self.words(values[obs_at], n), self.words(values[next_at], n)
        old = self.old_refs(slots, length)  # read before the steps are overwritten
        refs = self.admit(obs, nxt)
        rows = [values[i] for i in others]
        rows.append(refs.astype(np.int32))
        if not steps.write_rows(start, n, rows):  # e.g. the steps' views were dropped
            payload = [torch.from_numpy(np.ascontiguousarray(r)) for r in rows]
            target = WriteTarget.ring(start, n, steps.capacity)
            steps.commit(target, Prepared(payload, n, None, True))
        self.release(old)  # after the steps: a freed frame is never reused by this write

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a FrameWriter is its storage's: pickle the storage")
