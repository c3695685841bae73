"""What a storage's two-phase write passes between its phases, and where a batch goes.

- :class:`Prepared`: validated data ready to be committed (what
  :meth:`~rbdata.storages.Storage.prepare` returns and :meth:`~rbdata.storages.Storage.commit`
  writes); writers commit part of a batch with :meth:`Prepared.take`;
- :func:`write_target`: the index of a batched :meth:`~rbdata.storages.Storage.set`,
  normalised to runs of slots or a ``LongTensor`` of slots.

Both are re-exported by :mod:`rbdata.storages.base`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rbdata._index import as_index_tensor
from rbdata._layout import Layout

__all__ = ["Prepared", "write_target"]


class Prepared:
    """Validated data ready to be committed: leaves in layout order (or objects) and a size."""

    __slots__ = ("batched", "layout", "n", "payload")

    def __init__(self, payload: list[Any], n: int, layout: Layout | None, batched: bool) -> None:
        self.payload = payload
        self.n = n
        self.layout = layout
        self.batched = batched

    def take(self, rows: Sequence[int] | torch.Tensor) -> Prepared:
        """The batch rows at ``rows`` (in that order) as a new batched ``Prepared``.

        Tensor leaves are gathered with ``index_select`` on dim 0; lists (objects of a
        :class:`~rbdata.storages.ListStorage`, variable-length leaves of an
        :class:`~rbdata.storages.ArrowStorage`) are picked by position. Writers
        use it to commit only part of a validated batch.

        Raises:
            ValueError: if this is a single item, not a batch.
            IndexError: if a row is out of range for the batch.

        Examples:
            >>> from rbdata.storages import TensorStorage
            >>> prepared = TensorStorage(4).prepare(torch.arange(6.0).view(3, 2), batched=True)
            >>> sub = prepared.take([2, 0])
            >>> sub.n, sub.payload[0].tolist()
            (2, [[4.0, 5.0], [0.0, 1.0]])
        """
        if not self.batched:
            raise ValueError("rows: take needs a batch, this is a single item")
        idx = as_index_tensor(rows, self.n, "batch", "size")
        if self.layout is None:
            payload = [self.payload[i] for i in idx.tolist()]
        else:
            rows = idx.tolist() if any(type(t) is list for t in self.payload) else []
            payload = [
                [t[i] for i in rows] if type(t) is list else t.index_select(0, idx.to(t.device))
                for t in self.payload
            ]
        return Prepared(payload, int(idx.numel()), self.layout, True)


def write_target(index: Any, n: int, capacity: int, length: int) -> list[slice] | torch.Tensor:
    """Where a batch of ``n`` items goes: runs of slots (a list of step-1 slices) or slots.

    ``index`` is what :meth:`~rbdata.storages.Storage.set` was given for a batch: a slice (a
    negative bound counts from ``length``), a list of slices, or indices (negative ones count
    from ``length``), all within ``capacity``.

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
            return write_target(torch.arange(start, stop, step), n, capacity, length)
        stop = max(start, stop)
        if stop - start != n:
            raise ValueError(f"index: {stop - start} slots for a batch of {n} items")
        return [slice(start, stop)]
    if isinstance(index, list) and index and all(isinstance(s, slice) for s in index):
        runs = []
        for run in index:
            start, stop, step = run.indices(cap)
            if step != 1:
                return write_target(torch.arange(start, stop, step), n, capacity, length)
            runs.append(slice(start, max(start, stop)))
        count = sum(r.stop - r.start for r in runs)
        if count != n:
            raise ValueError(f"index: {count} slots for a batch of {n} items")
        return runs
    idx = as_index_tensor(index, cap, "storage", "capacity", negative_base=length)
    if idx.numel() != n:
        raise ValueError(f"index: {idx.numel()} slots for a batch of {n} items")
    return idx
