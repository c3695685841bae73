"""Sequence windows: pure functions over the episode index, with a numba kernel for the draw.

Times are absolute step counters as in :mod:`._slices`: the buffer holds the times
``[oldest, time)`` with ``oldest = max(0, time - capacity)``, time ``t`` lives in slot
``(base + t) % capacity`` and ``ends`` are the sorted times of the episode ends still held.

The window of an anchor ``a`` has ``burn_in + length + bootstrap`` positions ``k`` in
``[-burn_in, length + bootstrap)``, at times ``a + dilation * k``. A position is *valid* when its
time lies in the anchor's *allowed region* ``[lo, hi]``: the anchor's episode (its run of held
times between two ends, so the ring's oldest and newest held steps bound it too) for the
``"pad"`` and ``"stop"`` boundaries, every held time for ``"cross"``. The allowed region is an
interval that holds the anchor, so the valid positions are one run ``[k_lo, k_hi]`` around
``k = 0``; an invalid position takes the time of the nearest valid one (``k`` clamped into the
run), so every index of a window is a held slot.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch

__all__ = ["BOUNDARIES", "anchor_span", "regions_reference", "windows", "windows_reference"]

#: the boundary policies, in the order of their kernel codes
BOUNDARIES = ("pad", "stop", "cross")


def anchor_span(boundary: str, length: int, dilation: int) -> int:
    """Held steps an anchor needs in its episode: the learning part for ``"stop"``, else 1.

    Examples:
        >>> anchor_span("stop", 4, 2), anchor_span("pad", 4, 2)
        (7, 1)
    """
    return dilation * (length - 1) + 1 if boundary == "stop" else 1


def regions_reference(
    ends: torch.Tensor, time: int, capacity: int, anchors: torch.Tensor, boundary: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The allowed region ``[lo, hi]`` (times, inclusive) of each anchor time (torch).

    Examples:
        >>> ends = torch.tensor([3, 7])
        >>> lo, hi = regions_reference(ends, 10, 100, torch.tensor([0, 5, 9]), "pad")
        >>> lo.tolist(), hi.tolist()
        ([0, 4, 8], [3, 7, 9])
    """
    oldest = max(0, time - capacity)
    if boundary == "cross":
        return torch.full_like(anchors, oldest), torch.full_like(anchors, time - 1)
    seg = torch.searchsorted(ends, anchors)  # ends before the anchor
    before = torch.cat([torch.tensor([oldest - 1]), ends])[seg] + 1
    after = torch.cat([ends, torch.tensor([time - 1])])[seg]
    return before.clamp(min=oldest), after.clamp(max=time - 1)


def windows_reference(
    ends: torch.Tensor,
    time: int,
    capacity: int,
    base: int,
    anchors: torch.Tensor,
    shape: tuple[int, int, int, int],
    boundary: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Slots, validity and learning masks of the windows of ``anchors`` (times), flat (torch).

    ``shape`` is ``(burn_in, length, bootstrap, dilation)``.

    Examples:
        >>> ends = torch.tensor([3])  # episodes [0, 3] and [4, 9]
        >>> slots, valid, learn = windows_reference(
        ...     ends, 10, 100, 0, torch.tensor([4]), (2, 2, 1, 1), "pad"
        ... )
        >>> slots.tolist(), valid.tolist(), learn.tolist()
        ([4, 4, 4, 5, 6], [False, False, True, True, True], [False, False, True, True, False])
    """
    burn_in, length, bootstrap, dilation = shape
    lo, hi = regions_reference(ends, time, capacity, anchors, boundary)
    k = torch.arange(-burn_in, length + bootstrap)
    k_lo = torch.maximum(-((anchors - lo) // dilation), torch.tensor(-burn_in))
    k_hi = torch.minimum((hi - anchors) // dilation, torch.tensor(length + bootstrap - 1))
    valid = (k >= k_lo.unsqueeze(1)) & (k <= k_hi.unsqueeze(1))
    kk = torch.minimum(torch.maximum(k, k_lo.unsqueeze(1)), k_hi.unsqueeze(1))
    times = anchors.unsqueeze(1) + dilation * kk
    learn = valid & (k >= 0) & (k < length)
    return ((times + base) % capacity).reshape(-1), valid.reshape(-1), learn.reshape(-1)


@numba.njit(cache=True, nogil=True)
def _nb_windows(
    ends: Any,
    time: int,
    capacity: int,
    base: int,
    anchors: Any,
    burn_in: int,
    length: int,
    bootstrap: int,
    dilation: int,
    cross: bool,
    out: Any,
    valid: Any,
    learn: Any,
) -> None:  # pragma: no cover
    oldest = max(0, time - capacity)
    n_ends = ends.shape[0]
    width = burn_in + length + bootstrap
    i = 0
    for b in range(anchors.shape[0]):
        a = anchors[b]
        lo, hi = oldest, time - 1
        if not cross:
            seg = np.searchsorted(ends, a)
            if seg > 0:
                lo = max(lo, ends[seg - 1] + 1)
            if seg < n_ends:
                hi = min(hi, ends[seg])
        k_lo = max(-burn_in, -((a - lo) // dilation))
        k_hi = min(length + bootstrap - 1, (hi - a) // dilation)
        for j in range(width):
            k = j - burn_in
            ok = k_lo <= k <= k_hi
            kk = min(max(k, k_lo), k_hi)
            out[i] = (base + a + dilation * kk) % capacity
            valid[i] = ok
            learn[i] = ok and 0 <= k < length
            i += 1


def windows(
    ends: np.ndarray,
    time: int,
    capacity: int,
    base: int,
    anchors: np.ndarray,
    shape: tuple[int, int, int, int],
    boundary: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Like :func:`windows_reference` over a sorted int64 array, in one numba pass."""
    burn_in, length, bootstrap, dilation = shape
    n = anchors.shape[0] * (burn_in + length + bootstrap)
    out = np.empty(n, np.int64)
    valid = np.empty(n, np.bool_)
    learn = np.empty(n, np.bool_)
    _nb_windows(
        ends,
        time,
        capacity,
        base,
        anchors,
        burn_in,
        length,
        bootstrap,
        dilation,
        boundary == "cross",
        out,
        valid,
        learn,
    )
    return torch.from_numpy(out), torch.from_numpy(valid), torch.from_numpy(learn)
