"""What a storage's two-phase write passes between its phases: :class:`Prepared`.

Validated data ready to be committed (what :meth:`~rbdata.storages.Storage.prepare` returns
and :meth:`~rbdata.storages.Storage.commit` writes, where a
:class:`~rbdata.storages.WriteTarget` says); writers commit part of a batch with
:meth:`Prepared.take`. Re-exported by :mod:`rbdata.storages.base`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rbdata._core.index import as_index_tensor
from rbdata._core.layout import Layout

__all__ = ["Prepared"]


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
