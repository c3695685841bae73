"""Where one write goes: a :class:`WriteTarget`, resolved once per write and passed down.

A write's index is resolved once, where it is known (a writer's cursor, the index of
:meth:`~rbdata.storages.Storage.set`, a journal record read back), into a ``WriteTarget``:
one item at a slot, contiguous runs of slots (step-1 slices: what a ring writer writes), or
any slots (an int64 tensor). :meth:`~rbdata.storages.Storage.commit` and every write step
below it (the backends' row writes, their journals, a shared storage's version marks) read
the target's attributes instead of switching on the type of the index.

Re-exported by :mod:`rbdata.storages.base` and :mod:`rbdata.storages`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, final

import numpy as np
import torch

from rbdata._core.index import as_index_tensor

__all__ = ["WriteTarget"]


@final
class WriteTarget(NamedTuple):
    """The slots of one write, resolved once: runs of slots, or any slots (immutable).

    Build one with :meth:`one` (an item), :meth:`of_runs`, :meth:`ring`, :meth:`of_slots`,
    or :meth:`resolve` (the index of a batched :meth:`~rbdata.storages.Storage.set`); the
    fields below are computed there, once.

    Examples:
        >>> target = WriteTarget.ring(6, 4, 8)
        >>> target.runs, target.n, target.top, target.next_slot(8, 0)
        ([slice(6, 8, None), slice(0, 2, None)], 4, 8, 2)
        >>> target.slots_numpy().tolist()
        [6, 7, 0, 1]
        >>> WriteTarget.of_slots(torch.tensor([3, 1])).positions()
        [3, 1]
    """

    #: The slots as contiguous runs (step-1 slices, in write order), or ``None`` when they
    #: are any slots (see :attr:`indices`). An item's slot is one run.
    runs: list[slice] | None
    #: The slots as a 1-D int64 tensor, when they are not runs (else ``None``).
    indices: torch.Tensor | None
    #: Whether the payload is one item (unbatched) at the slot :attr:`first`.
    item: bool
    #: How many rows are written.
    n: int
    #: One past the highest slot written (``0`` for an empty write): the length the storage
    #: has at least afterwards.
    top: int
    #: One past the last slot written, in write order (``None`` for an empty write): where a
    #: ring writer resumes, before wrapping.
    end: int | None
    #: Whether the caller chose the slots (:meth:`~rbdata.storages.Storage.set`, see
    #: :meth:`at_positions`) rather than a writer.
    placed: bool = False

    # --- constructors ------------------------------------------------------------------
    @classmethod
    def one(cls, slot: int) -> WriteTarget:
        """One item (an unbatched payload) at ``slot`` (in ``[0, capacity)``)."""
        return cls([slice(slot, slot + 1)], None, True, 1, slot + 1, slot + 1)

    @classmethod
    def of_runs(cls, runs: list[slice]) -> WriteTarget:
        """A batch written to contiguous ``runs`` (step-1 slices with in-range bounds)."""
        n = top = 0
        for run in runs:
            n += run.stop - run.start
            if run.stop > top:
                top = run.stop
        return cls(runs, None, False, n, top, runs[-1].stop if runs else None)

    @classmethod
    def ring(cls, start: int, n: int, capacity: int) -> WriteTarget:
        """A batch of ``n`` items at ring slots ``start, start + 1, ...`` (at most 2 runs).

        ``n`` is in ``[0, capacity]``; the runs are :func:`rbdata._core.index.ring_runs`'s.
        """
        stop = start + n
        if n <= 0:
            return cls([], None, False, 0, 0, None)
        if stop <= capacity:
            return cls([slice(start, stop)], None, False, n, stop, stop)
        wrapped = stop - capacity
        return cls([slice(start, capacity), slice(0, wrapped)], None, False, n, capacity, wrapped)

    @classmethod
    def of_slots(cls, index: torch.Tensor) -> WriteTarget:
        """A batch written to in-range ``index`` (a 1-D int64 tensor; the last write wins)."""
        count = index.numel()
        if not count:
            return cls(None, index, False, 0, 0, None)
        return cls(None, index, False, count, int(index.max()) + 1, int(index[-1]) + 1)

    @classmethod
    def resolve(cls, index: Any, n: int, capacity: int, length: int) -> WriteTarget:
        """Where a batch of ``n`` items goes, given the index of a batched ``set``.

        ``index`` is a slice (a negative bound counts from ``length``), a list of slices,
        or indices (negative ones count from ``length``), all within ``capacity``. Slices of
        step 1 give runs, anything else slots.

        Raises:
            ValueError: if ``index`` names other than ``n`` slots.
            IndexError: a slot outside ``[-length, capacity)``.
        """
        cap = capacity
        if type(index) is slice:  # the common case first: one run
            lo, hi = index.start, index.stop
            negative = (lo is not None and lo < 0) or (hi is not None and hi < 0)
            start, stop, step = index.indices(length if negative else cap)
            if step != 1:
                return cls.resolve(torch.arange(start, stop, step), n, capacity, length)
            stop = max(start, stop)
            if stop - start != n:
                raise ValueError(f"index: {stop - start} slots for a batch of {n} items")
            return cls.of_runs([slice(start, stop)])
        if isinstance(index, list) and index and all(isinstance(s, slice) for s in index):
            runs = []
            for run in index:
                start, stop, step = run.indices(cap)
                if step != 1:
                    return cls.resolve(torch.arange(start, stop, step), n, capacity, length)
                runs.append(slice(start, max(start, stop)))
            count = sum(r.stop - r.start for r in runs)
            if count != n:
                raise ValueError(f"index: {count} slots for a batch of {n} items")
            return cls.of_runs(runs)
        idx = as_index_tensor(index, cap, "storage", "capacity", negative_base=length)
        if idx.numel() != n:
            raise ValueError(f"index: {idx.numel()} slots for a batch of {n} items")
        return cls.of_slots(idx)

    # --- what the write steps read -------------------------------------------------------
    @property
    def first(self) -> int:
        """The first slot written (an item's slot); ``IndexError`` for an empty write."""
        if self.runs is not None:
            return int(self.runs[0].start)
        assert self.indices is not None
        return int(self.indices[0])

    def at_positions(self) -> WriteTarget:
        """The same write, at positions the caller chose (what ``Storage.set`` writes).

        Such a write moves the ring's cursor only when it continues the ring there: its
        slots are ``cursor, cursor + 1, ...`` in write order (filling a storage from slot 0,
        appending at the cursor). Any other write at positions replaces items where they
        are, and the cursor stays: the ring overwrites its oldest items next, whoever holds
        the storage (one process, or several sharing it). A writer's write always moves it.

        Examples:
            >>> placed = WriteTarget.of_slots(torch.tensor([1, 5])).at_positions()
            >>> placed.next_slot(8, 3), placed.next_slot(8, 1)  # in place: the cursor stays
            (3, 1)
            >>> WriteTarget.for_set([1, 2], 2, 8, 0).next_slot(8, 1)  # continues the ring at 1
            3
            >>> WriteTarget.ring(6, 4, 8).at_positions().next_slot(8, 6)
            2
        """
        return self._replace(placed=True)

    @classmethod
    def for_set(cls, index: Any, n: int, capacity: int, length: int) -> WriteTarget:
        """:meth:`resolve`, :meth:`at_positions`: what a batched ``Storage.set`` writes."""
        return cls.resolve(index, n, capacity, length).at_positions()

    def continues(self, cursor: int, capacity: int) -> bool:
        """Whether the slots are ``cursor, cursor + 1, ...`` (wrapping at ``capacity``)."""
        expect = cursor % capacity
        if self.runs is not None:
            for run in self.runs:
                if run.stop == run.start:
                    continue
                if run.start != expect:
                    return False
                expect = run.stop % capacity
            return True
        index = self.indices
        assert index is not None
        ring = torch.arange(expect, expect + index.numel()).remainder_(capacity)
        return bool(torch.equal(index, ring))

    def next_slot(self, capacity: int, current: int) -> int:
        """Where a ring writer resumes after this write in a ring of ``capacity``.

        The slot after the write (wrapping), or ``current`` for an empty write and for a
        write :meth:`at_positions` that does not continue the ring at ``current``.
        """
        end = self.end
        if end is None or (self.placed and not self.continues(current, capacity)):
            return current
        return end % capacity

    def skips(self, length: int) -> bool:
        """Whether the write leaves a never-written slot between ``length`` and its top.

        Examples:
            >>> WriteTarget.of_runs([slice(3, 5)]).skips(2), WriteTarget.ring(2, 3, 8).skips(2)
            (True, False)
        """
        if self.top <= length or not self.n:
            return False
        slots = np.unique(self.slots_numpy())
        above = slots[slots >= length]
        return int(above[-1]) - length + 1 != above.size

    def touches(self, length: int) -> bool:
        """Whether a slot below ``length`` (a live item) is written."""
        if self.runs is not None:
            return any(run.start < min(run.stop, length) for run in self.runs)
        index = self.indices
        assert index is not None
        return bool(index.numel()) and int(index.min()) < length

    def slots(self) -> torch.Tensor:
        """Every slot written, in write order, as a 1-D int64 tensor (the index itself)."""
        if self.indices is not None:
            return self.indices
        return torch.from_numpy(self.slots_numpy())

    def slots_numpy(self) -> np.ndarray[Any, Any]:
        """Every slot written, in write order, as a C-contiguous int64 array.

        For slots, a view of :attr:`indices` (CPU, contiguous) or a copy; for runs, new.
        """
        if self.runs is not None:
            runs = [np.arange(r.start, r.stop, dtype=np.int64) for r in self.runs]
            return np.concatenate(runs) if runs else np.zeros(0, np.int64)
        index = self.indices
        assert index is not None
        return np.ascontiguousarray(index.detach().cpu().reshape(-1).numpy(), dtype=np.int64)

    def positions(self) -> list[int]:
        """Every slot written, in write order, as Python ints."""
        if self.runs is not None:
            return [i for run in self.runs for i in range(run.start, run.stop)]
        assert self.indices is not None
        return self.indices.tolist()

    def bounds(self) -> list[int]:
        """The runs as ``[start, stop, start, stop, ...]`` (``ValueError`` for slots)."""
        if self.runs is None:
            raise ValueError("bounds: this write goes to slots, not runs")
        return [v for run in self.runs for v in (run.start, run.stop)]

    def selectors(self) -> list[Any]:
        """Numpy indices that cover the slots: each run as a slice, else the slots array."""
        return list(self.runs) if self.runs is not None else [self.slots_numpy()]
