"""One batch from several sources: gather each source's rows straight into the batch's leaves.

:func:`assemble` takes each source's local indices (in batch order, source after source) and
returns the user-facing batch: the selected leaves, ``"index"`` (the combined index),
``"source"`` (the source's position) and the samplers' extras. Where a storage exposes its
backing tensors (``buffers``) and is not written by other processes, each source's rows are
gathered with one ``index_select`` per leaf and each leaf concatenated: no per-source batch
(TensorDict) is built. Other storages gather through their ``gather`` contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rbdata._layout import Layout
from rbdata.mixed._sources import Source

__all__ = ["assemble", "fill_extras", "gather_leaves"]


def _leaves_of(batch: Any, layout: Layout) -> list[torch.Tensor]:
    if layout.kind == "tensor":
        return [batch]
    return [batch.get(leaf.key) for leaf in layout.leaves]


def gather_leaves(
    parts: Sequence[tuple[Source, torch.Tensor]], layout: Layout, n: int, device: torch.device
) -> list[torch.Tensor]:
    """The batch's leaves (in ``layout`` order): the rows at each part's indices, in turn."""
    if len(parts) == 1:
        source, idx = parts[0]
        return _slow_part(source, idx, layout)
    if all(s.columns is not None and s.columns.fast and not s.storage.shared for s, _ in parts):
        # per leaf: one index_select per source, then one cat (measured cheaper than
        # gathering into slices of a preallocated leaf: a slice costs about an index_select)
        select = torch.index_select
        pieces = []
        for source, idx in parts:
            buffers = source.storage.buffers  # type: ignore[attr-defined]
            if idx.device != device:
                idx = idx.to(device, non_blocking=idx.is_cpu)
            positions = source.columns.positions  # type: ignore[union-attr]
            pieces.append([select(buffers[p], 0, idx) for p in positions])
    else:
        pieces = [_slow_part(source, idx, layout) for source, idx in parts]
    return [torch.cat(column) for column in zip(*pieces, strict=True)]


def _slow_part(source: Source, idx: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """One source's rows through the storage's ``gather`` contract."""
    return _leaves_of(source.storage.gather(idx, None), layout)


def fill_extras(
    extras: Sequence[dict[str, torch.Tensor]], counts: Sequence[int], weight: bool = False
) -> dict[str, torch.Tensor]:
    """The samplers' per-item extras of each part, concatenated.

    A part whose sampler has no such extra gets a neutral value: 1 for floating extras
    (``"weight"``: a row drawn uniformly needs no importance correction), ``True`` for
    booleans (``"mask"``: not padding) and -1 for integers (``"slice"``: in no slice).
    With ``weight`` (a source samples with priorities) ``"weight"`` is always there, so a
    batch has the same keys whichever sources it came from.

    Examples:
        >>> out = fill_extras([{}, {"weight": torch.tensor([0.5, 1.0])}], [1, 2])
        >>> out["weight"].tolist()
        [1.0, 0.5, 1.0]
    """
    if all(not e for e in extras) and not weight:
        return {}
    names: dict[str, torch.Tensor] = {}
    for e in extras:
        for key, value in e.items():
            names.setdefault(key, value)
    if weight and "weight" not in names:
        names["weight"] = torch.ones(0)
    out = {}
    for key, like in names.items():
        columns = []
        for e, count in zip(extras, counts, strict=True):
            found = e.get(key)
            if found is None:
                fill = 1 if like.is_floating_point() or like.dtype == torch.bool else -1
                found = torch.full((count,), fill, dtype=like.dtype, device=like.device)
            columns.append(found)
        out[key] = columns[0] if len(columns) == 1 else torch.cat(columns)
    return out


def assemble(
    parts: Sequence[tuple[Source, torch.Tensor]],
    layout: Layout,
    n: int,
    device: torch.device,
    extra: dict[str, torch.Tensor],
) -> Any:
    """The user-facing batch of ``parts`` with the per-item entries ``extra``."""
    leaves = gather_leaves(parts, layout, n, device)
    if device.type != "cpu" or any(not v.is_cpu for v in extra.values()):
        for key, value in extra.items():
            if value.device != device:
                extra[key] = value.to(device, non_blocking=value.is_cpu)
    return layout.assemble(leaves, torch.Size((n,)), device, extra)
