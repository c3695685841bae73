"""Trajectory-slice arithmetic: pure functions over tensors, with a numba kernel for the draw.

Times are absolute step counters; the buffer holds ``[max(0, time - capacity), time)`` and a
time ``t`` lives in slot ``(base + t) % capacity``. ``ends`` are the (sorted) times of episode
ends still in the buffer.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch

__all__ = ["draw", "draw_reference", "segments", "segments_reference"]


def segments_reference(
    ends: torch.Tensor, time: int, capacity: int, length: int, strict: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-segment draw tables for slices of ``length`` steps (torch).

    A segment is a maximal run of retained times inside one episode. Returns ``cumsum`` (the
    running count of valid slice starts), ``shift`` (start time of draw ``r`` in segment
    ``s`` is ``r + shift[s]``) and ``stops`` (one past each segment's last time).

    Examples:
        >>> cumsum, shift, stops = segments_reference(torch.tensor([4]), 10, 100, 3, True)
        >>> cumsum.tolist(), (torch.tensor([0, 3]) + shift).tolist(), stops.tolist()
        ([3, 6], [0, 5], [5, 10])
    """
    oldest = max(0, time - capacity)
    # ends are sorted: those before the newest step start a segment after them
    inner = ends[: int(torch.searchsorted(ends, time - 1))] + 1
    starts = torch.cat([torch.tensor([oldest]), inner])
    stops = torch.cat([inner, torch.tensor([time])])
    lengths = stops - starts
    if strict:
        counts = (lengths - length + 1).clamp_(min=0)
    else:
        counts = torch.where(lengths >= length, lengths - length + 1, (lengths > 0).long())
    cumsum = torch.cumsum(counts, 0)
    return cumsum, starts - (cumsum - counts), stops


@numba.njit(cache=True, nogil=True)
def _nb_segments(
    ends: Any, time: int, capacity: int, length: int, strict: bool
) -> tuple[Any, Any, Any]:  # pragma: no cover
    oldest = max(0, time - capacity)
    k = np.searchsorted(ends, time - 1)  # ends before the newest step start a segment
    cumsum = np.empty(k + 1, np.int64)
    shift = np.empty(k + 1, np.int64)
    stops = np.empty(k + 1, np.int64)
    total = 0
    start = oldest
    for s in range(k + 1):
        stop = ends[s] + 1 if s < k else time
        n = stop - start
        if strict:
            count = max(0, n - length + 1)
        else:
            count = n - length + 1 if n >= length else (1 if n > 0 else 0)
        total += count
        cumsum[s] = total
        shift[s] = start - (total - count)
        stops[s] = stop
        start = stop
    return cumsum, shift, stops


def segments(
    ends: np.ndarray, time: int, capacity: int, length: int, strict: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Like :func:`segments_reference` over a sorted int64 array, in one numba pass."""
    cumsum, shift, stops = _nb_segments(ends, time, capacity, length, strict)
    return torch.from_numpy(cumsum), torch.from_numpy(shift), torch.from_numpy(stops)


def draw_reference(
    cumsum: torch.Tensor,
    shift: torch.Tensor,
    stops: torch.Tensor,
    r: torch.Tensor,
    length: int,
    base: int,
    capacity: int,
    strict: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Slots of the slices that start at draws ``r``, flat, and the padding mask (or None)."""
    seg = torch.searchsorted(cumsum, r, right=True)
    times = ((r + shift[seg]).unsqueeze(1) + torch.arange(length)).reshape(-1)
    mask = None
    if not strict:
        last = (stops[seg] - 1).repeat_interleave(length)
        mask = times <= last
        times = torch.minimum(times, last)
    return (times + base) % capacity, mask


@numba.njit(cache=True, nogil=True)
def _nb_draw(
    cumsum: Any,
    shift: Any,
    stops: Any,
    r: Any,
    length: int,
    base: int,
    capacity: int,
    strict: bool,
    out: Any,
    mask: Any,
) -> int:  # pragma: no cover
    # every draw must pick a segment: 0 <= r < cumsum[-1] (else -1 - its position)
    total = cumsum[cumsum.shape[0] - 1]
    for i in range(r.shape[0]):
        if r[i] < 0 or r[i] >= total:
            return -1 - i
    k = 0
    for i in range(r.shape[0]):
        seg = np.searchsorted(cumsum, r[i], side="right")
        start = r[i] + shift[seg]
        last = stops[seg] - 1
        for j in range(length):
            t = start + j
            valid = strict or t <= last
            if not valid:
                t = last
            mask[k] = valid
            out[k] = (base + t) % capacity
            k += 1
    return 0


def _check_tables(
    cumsum: torch.Tensor, shift: torch.Tensor, stops: torch.Tensor, r: torch.Tensor
) -> None:
    """Raise unless the draw tables are 1-D, non-empty, of one length, and ``r`` is 1-D."""
    if cumsum.dim() != 1 or cumsum.shape[0] == 0 or shift.shape != cumsum.shape:
        raise ValueError(
            f"cumsum, shift: expected non-empty 1-D tables of one length, got "
            f"{tuple(cumsum.shape)} and {tuple(shift.shape)}"
        )
    if stops.shape != cumsum.shape or r.dim() != 1:
        raise ValueError(
            f"stops, r: expected {tuple(cumsum.shape)} stops and 1-D draws, got "
            f"{tuple(stops.shape)} and {tuple(r.shape)}"
        )


def draw(
    cumsum: torch.Tensor,
    shift: torch.Tensor,
    stops: torch.Tensor,
    r: torch.Tensor,
    length: int,
    base: int,
    capacity: int,
    strict: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Like :func:`draw_reference`, in one numba kernel.

    Raises:
        ValueError: for tables of different lengths or a draw outside ``[0, cumsum[-1])``
            (checked before any table is indexed with it).
    """
    _check_tables(cumsum, shift, stops, r)
    n = r.shape[0] * length
    out = np.empty(n, np.int64)
    mask = np.empty(n, np.bool_)
    bad = _nb_draw(
        cumsum.numpy(),
        shift.numpy(),
        stops.numpy(),
        r.numpy(),
        length,
        base,
        capacity,
        strict,
        out,
        mask,
    )
    if bad:
        raise ValueError(
            f"r: draw {int(r[-1 - bad])} is outside [0, {int(cumsum[-1])}), the number of "
            "slice starts"
        )
    return torch.from_numpy(out), None if strict else torch.from_numpy(mask)
