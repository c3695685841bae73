"""``MixedDataset``: the sources of a mixture as one map-style dataset over combined indices.

Source ``i``'s row ``r`` is combined index ``offset_i + r``, ``offset_i`` the sum of the
capacities of the sources before it: an index never changes while sources fill up.
``DataLoader(mixed.dataset, batch_sampler=mixed.batch_sampler())`` then gathers each batch
in one ``__getitems__`` call, in the main process or in workers.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import torch
from torch.utils.data import Dataset

from rbdata._core.index import IndexBatch
from rbdata._core.layout import Layout
from rbdata.errors import IndexOutOfRangeError
from rbdata.mixed._batch import assemble
from rbdata.mixed._priorities import split_index
from rbdata.mixed._rows import RowGather
from rbdata.mixed._sources import STORAGE, Source
from rbdata.storages import wrap_for_collate

__all__ = ["MixedDataset"]


class MixedDataset(Dataset[Any]):
    """A mixture's sources as one map-style dataset (``mixed.dataset``).

    ``len`` is the combined capacity (the index space), ``ds[i]`` the row at combined index
    ``i`` and ``__getitems__`` a batch with ``"index"`` (combined) and ``"source"`` (the
    source's position): what :meth:`~rbdata.MixedBuffer.sample` returns for the same indices.
    Pickled into ``DataLoader`` workers, it sends the storages and the batch layout (offline
    datasets' storages map the same files); a worker sees the rows written before it started.

    Args:
        sources: the mixture's sources.
        layout: the batches' layout (``None`` while every source is empty).
    """

    def __init__(self, sources: list[Source], layout: Layout | None = None) -> None:
        self.sources = sources
        self._layout = layout
        self.owner: Any = None  # the MixedSampler that keeps the layout up to date
        self.row_gather = RowGather()  # the CPU kernel gather (pickled empty)

    @property
    def layout(self) -> Layout | None:
        """The batches' keys, shapes and dtypes (``None`` while every source is empty)."""
        return self.owner.layout if self.owner is not None else self._layout

    def __len__(self) -> int:
        last = self.sources[-1]
        return last.offset + last.capacity

    def __getstate__(self) -> dict[str, Any]:
        bare = [
            dataclasses.replace(s, obj=s.storage, kind=STORAGE, sampler=None)  # type: ignore[arg-type]
            for s in self.sources
        ]
        return {"sources": bare, "_layout": self.layout, "owner": None, "row_gather": RowGather()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __getitem__(self, index: Any) -> Any:
        """The row at combined index ``index`` (an int), else the batch at ``index``."""
        if isinstance(index, int) and not isinstance(index, bool):
            return self.__getitems__([index])[0]
        return self.__getitems__(index)

    def __getitems__(self, indices: Any) -> Any:
        """The rows at combined ``indices`` as one batch (``"index"``, ``"source"``, extras).

        Raises:
            IndexError: an index outside ``[0, len)`` or past its source's filled rows.
        """
        extras: dict[str, torch.Tensor] = {}
        if type(indices) is IndexBatch:
            extras = dict(indices.extras)
            indices = indices.tensor
        position, idx = split_index(indices, self.sources, "indices")
        if self.owner is not None:
            self.owner.check_layouts()
        layout = self.layout
        if layout is None:
            raise IndexError("the mixture is empty: no source holds data")
        inverse = None
        if idx.numel() > 1 and not bool((position[1:] >= position[:-1]).all()):
            order = torch.argsort(position, stable=True)
            inverse = torch.argsort(order)
            idx, position = idx[order], position[order]
            extras = {k: v[order] for k, v in extras.items()}
        counts = torch.bincount(position, minlength=len(self.sources)).tolist()
        parts, start = [], 0
        for source, count in zip(self.sources, counts, strict=True):
            if not count:
                continue
            local = idx[start : start + count] - source.offset
            start += count
            filled = len(source.storage)
            high = int(local.max())
            if high >= filled or source.columns is None:
                raise IndexOutOfRangeError(
                    f"index {high + source.offset} is row {high} of source {source.name!r}, "
                    f"which holds {filled} items"
                )
            parts.append((source, local))
        extras.setdefault("source", position)
        extras["index"] = idx
        device = self.sources[0].storage.device
        batch = assemble(parts, layout, idx.numel(), device, extras, self.row_gather)
        if inverse is not None:
            batch = batch[inverse]
        return wrap_for_collate(batch, sys._getframe(1))
