"""Priority updates on a mixture: combined indices split into each source's rows, checked first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rbdata._core.index import as_index_tensor
from rbdata.errors import IndexOutOfRangeError
from rbdata.mixed._sources import Source

__all__ = ["as_priorities", "route_priorities", "split_index"]


def split_index(
    index: Any, sources: Sequence[Source], what: str = "index"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combined indices as 1-D tensors of source positions and combined indices.

    Raises:
        TypeError: not integers.
        IndexError: an index outside ``[0, combined capacity)``.
    """
    total = sources[-1].offset + sources[-1].capacity
    try:
        idx = as_index_tensor(
            index, total, "mixture", "combined capacity", negative_base=0, name=what
        )
    except IndexError as err:
        raise IndexOutOfRangeError(
            f"{what}: combined indices are in [0, {total}) (the sum of the sources' "
            f"capacities); {err}"
        ) from None
    starts = torch.tensor([s.offset for s in sources], device=idx.device)
    position = torch.searchsorted(starts, idx, right=True) - 1
    return position, idx


def as_priorities(priority: Any, n: int) -> torch.Tensor:
    """``priority`` (scalar, list, array or tensor) as ``n`` flat float priorities, checked.

    Raises:
        TypeError: not real numbers.
        ValueError: a count other than 1 or ``n``, or a NaN, infinite or negative value.
    """
    if isinstance(priority, torch.Tensor):  # computed with grad, often: no autograd here
        priority = priority.detach()
    elif isinstance(priority, (list, tuple)):  # numpy would call numpy() on grad tensors
        priority = [p.detach() if isinstance(p, torch.Tensor) else p for p in priority]
    if isinstance(priority, np.ndarray) or not isinstance(priority, torch.Tensor):
        try:
            priority = torch.as_tensor(np.asarray(priority, dtype=np.float64))
        except (TypeError, ValueError) as err:
            raise TypeError(f"priority must be real numbers, got {priority!r:.80}") from err
    elif priority.is_complex() or priority.dtype == torch.bool:
        raise TypeError(f"priority must be real numbers, got a tensor of dtype {priority.dtype}")
    p = priority.reshape(-1)
    if not p.is_floating_point():
        p = p.double()
    if p.numel() == 1 and n != 1:
        p = p.expand(n)
    elif p.numel() != n:
        raise ValueError(f"priority: expected 1 or {n} values (one per index), got {p.numel()}")
    if n and not bool(torch.isfinite(p).all() and (p >= 0).all()):
        bad = p[~(torch.isfinite(p) & (p >= 0))][0].item()
        raise ValueError(f"priority must be finite and >= 0, got {bad}")
    return p


def route_priorities(
    sources: Sequence[Source], index: Any, priority: Any
) -> list[tuple[Source, torch.Tensor, torch.Tensor]]:
    """Each prioritized source's local indices and priorities; everything checked first.

    Rows of sources whose sampler has no ``update_priority`` (uniform sources) are left out.

    Raises:
        TypeError: no source samples with priorities, or bad types.
        IndexError: an index outside every source's filled rows (naming the source).
        ValueError: bad priorities.
    """
    if not any(callable(getattr(s.sampler, "update_priority", None)) for s in sources):
        kinds = ", ".join(f"{s.name!r}: {type(s.sampler).__name__}" for s in sources)
        raise TypeError(f"no source samples with priorities ({kinds}): use a PrioritizedSampler")
    position, idx = split_index(index, sources)
    p = as_priorities(priority, idx.numel())
    out = []
    for source in sources:
        if not callable(getattr(source.sampler, "update_priority", None)):
            continue
        mask = position == source.position
        if not bool(mask.any()):
            continue
        local = idx[mask] - source.offset
        filled = len(source)
        high = int(local.max())
        if high >= filled:
            raise IndexOutOfRangeError(
                f"index {high + source.offset} is row {high} of source {source.name!r}, which "
                f"holds {filled} items"
            )
        out.append((source, local, p[mask].to(torch.float64)))
    return out
