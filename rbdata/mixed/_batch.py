"""One batch from several sources: gather each source's rows straight into the batch's leaves.

:func:`assemble` takes each source's local indices (in batch order, source after source) and
returns the user-facing batch: the selected leaves, ``"index"`` (the combined index),
``"source"`` (the source's position) and the samplers' extras. Where every storage exposes
its backing tensors (``buffers``) on the CPU and is not written by other processes, one
numba kernel call (:class:`~rbdata.mixed._rows.RowGather`) copies every leaf's rows of
every source, and the ``"index"`` and ``"source"`` columns, into the batch's fresh tensors.
On other devices each source's rows are gathered with one ``index_select`` per leaf and each
leaf concatenated; other storages gather through their ``gather`` contract. No per-source
batch (TensorDict) is built on the first two paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rbdata._core.layout import Layout
from rbdata.mixed._rows import RowGather
from rbdata.mixed._sources import Source

__all__ = ["assemble", "combine", "fill_extras", "gather_leaves"]

Columns = tuple[torch.Tensor, torch.Tensor]


def _leaves_of(batch: Any, layout: Layout) -> list[torch.Tensor]:
    if layout.kind == "tensor":
        return [batch]
    return [batch.get(leaf.key) for leaf in layout.leaves]


def _buffers(parts: Sequence[tuple[Source, torch.Tensor]]) -> list[list[torch.Tensor]] | None:
    """Each part's backing tensors in output order, ``None`` unless every source has them."""
    out = []
    for source, _ in parts:
        columns = source.columns
        if columns is None or not columns.fast or source.storage.shared:
            return None
        buffers = source.storage.buffers  # type: ignore[attr-defined]
        out.append([buffers[p] for p in columns.positions])
    return out


def gather_leaves(
    parts: Sequence[tuple[Source, torch.Tensor]],
    layout: Layout,
    n: int,
    device: torch.device,
    rows: RowGather | None = None,
    columns: bool = False,
) -> tuple[list[torch.Tensor], Columns | None]:
    """The batch's leaves (in ``layout`` order): the rows at each part's indices, in turn.

    ``rows``: the CPU kernel gather, tried first. With ``columns``, the kernel also makes
    the ``"index"`` and ``"source"`` columns (returned second; ``None`` where it did not).
    """
    buffers = _buffers(parts)
    if buffers is None:
        pieces = [_slow_part(source, idx, layout) for source, idx in parts]
    elif rows is not None and device.type == "cpu":
        got = rows(parts, buffers, n, layout, columns)
        if got is not None:
            return got
        pieces = [_slow_part(source, idx, layout) for source, idx in parts]
    else:  # per leaf: one index_select per source, then one cat
        select = torch.index_select
        pieces = []
        for bufs, (_, idx) in zip(buffers, parts, strict=True):
            if idx.device != device:
                idx = idx.to(device, non_blocking=idx.is_cpu)
            pieces.append([select(b, 0, idx) for b in bufs])
    if len(pieces) == 1:
        return pieces[0], None
    return [torch.cat(column) for column in zip(*pieces, strict=True)], None


def _slow_part(source: Source, idx: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """One source's rows through the storage's ``gather`` contract."""
    return _leaves_of(source.storage.gather(idx, None), layout)


def combine(parts: Sequence[tuple[Source, torch.Tensor]], plan: Columns) -> Columns:
    """The batch's combined ``"index"`` and its ``"source"`` column (new tensors).

    ``plan``: the batch's cached ``"source"`` and offset columns (``MixedSampler.plan``).
    """
    column, offset_column = plan
    index = torch.cat([idx for _, idx in parts]) if len(parts) > 1 else parts[0][1]
    return index + offset_column.to(index.device), column.clone()


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
                found = _neutral(count, like)
            columns.append(found)
        if len(columns) > 1:
            out[key] = torch.cat(columns)
        else:  # never hand out a cached neutral column itself
            out[key] = columns[0] if key in extras[0] else columns[0].clone()
    return out


#: neutral columns by (count, dtype, device): only ever concatenated (copied), never handed out
_NEUTRAL: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}


def _neutral(count: int, like: torch.Tensor) -> torch.Tensor:
    """``count`` neutral values of ``like``'s dtype and device (1, ``True`` or -1), cached."""
    key = (count, like.dtype, like.device)
    got = _NEUTRAL.get(key)
    if got is None:
        fill = 1 if like.is_floating_point() or like.dtype == torch.bool else -1
        got = torch.full((count,), fill, dtype=like.dtype, device=like.device)
        if len(_NEUTRAL) > 64:  # batch sizes and dtypes seen: a handful
            _NEUTRAL.clear()
        _NEUTRAL[key] = got
    return got


def assemble(
    parts: Sequence[tuple[Source, torch.Tensor]],
    layout: Layout,
    n: int,
    device: torch.device,
    extra: dict[str, torch.Tensor],
    rows: RowGather | None = None,
    plan: Columns | None = None,
) -> Any:
    """The user-facing batch of ``parts`` with the per-item entries ``extra``.

    With ``plan`` (see :func:`combine`), ``"index"`` and ``"source"`` are added to ``extra``.
    """
    leaves, columns = gather_leaves(parts, layout, n, device, rows, plan is not None)
    if plan is not None:
        extra["index"], extra["source"] = combine(parts, plan) if columns is None else columns
    if device.type != "cpu" or any(not v.is_cpu for v in extra.values()):
        for key, value in extra.items():
            if value.device != device:
                extra[key] = value.to(device, non_blocking=value.is_cpu)
    return layout.assemble(leaves, torch.Size((n,)), device, extra)
