"""Valid slice starts as pure functions over the episode index (time coordinates).

The episode index of :class:`~rbdata.samplers.SliceSampler` holds ``time`` (the absolute time
of the next step) and ``ends`` (the sorted times of the episode ends still in a ring of
``capacity`` steps); the ring holds the times ``[max(0, time - capacity), time)``. A *span* is
the number of real steps of the slice of ``length`` steps that starts at a time: ``length``
for a start whose ``length`` steps are retained and in one episode, the whole (shorter)
segment for the first step of a segment shorter than ``length`` when ``strict`` is false, and
0 for every other time (not a valid start). The prioritized and the epoch slice samplers read
spans instead of per-segment draw tables: they need the validity of given times.
"""

from __future__ import annotations

import numpy as np

__all__ = ["all_spans", "refresh_window", "spans"]


def spans(
    ends: np.ndarray, time: int, capacity: int, length: int, strict: bool, times: np.ndarray
) -> np.ndarray:
    """The span (real steps, 0: not a valid start) of the slice starting at each of ``times``.

    Vectorised: one ``searchsorted`` over the ends for all times; never reads the data.

    Examples:
        >>> ends = np.array([3, 5])  # episodes [0, 3], [4, 5], then [6, 9) still running
        >>> spans(ends, 9, 100, 3, True, np.arange(9)).tolist()
        [3, 3, 0, 0, 0, 0, 3, 0, 0]
        >>> spans(ends, 9, 100, 3, False, np.arange(9)).tolist()
        [3, 3, 0, 0, 2, 0, 3, 0, 0]
    """
    times = np.asarray(times, np.int64)
    oldest = max(0, time - capacity)
    k = np.searchsorted(ends, times, side="left")  # the first end at or after each time
    padded = np.append(np.asarray(ends, np.int64), time - 1)  # the running episode's last step
    stop = np.minimum(padded[k] + 1, time)
    start = np.maximum(np.where(k > 0, padded[np.maximum(k - 1, 0)] + 1, oldest), oldest)
    inside = (times >= oldest) & (times < time)
    full = inside & (times + length <= stop)
    out = np.where(full, length, 0)
    if not strict:
        seg = stop - start
        out = np.where(inside & (seg < length) & (times == start), seg, out)
    return out.astype(np.int32)


def all_spans(
    ends: np.ndarray, time: int, capacity: int, length: int, strict: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Every retained time and its span (one pass over the ring: a full rebuild)."""
    times = np.arange(max(0, time - capacity), time, dtype=np.int64)
    return times, spans(ends, time, capacity, length, strict, times)


def refresh_window(old_time: int, time: int, capacity: int, length: int) -> np.ndarray:
    """The times whose span a write of the steps ``[old_time, time)`` may have changed.

    The new steps and the ``length - 1`` before them (slices that now reach further, or that
    an episode end found by this write cuts), and, if the ring dropped steps, the first
    ``length`` retained ones (the oldest segment lost its head); disjoint, in time order.
    Every slot whose span changes holds one of these times (an overwritten step's slot holds
    a new one).

    Examples:
        >>> refresh_window(10, 12, 100, 3).tolist()
        [8, 9, 10, 11]
        >>> refresh_window(10, 12, 5, 3).tolist()  # the ring: times [7, 12) retained
        [7, 8, 9, 10, 11]
    """
    oldest = max(0, time - capacity)
    recent = max(oldest, old_time - length + 1)
    moved = oldest > max(0, old_time - capacity)  # the ring dropped steps
    head = np.arange(oldest, min(oldest + length, recent) if moved else oldest, dtype=np.int64)
    return np.concatenate([head, np.arange(recent, time, dtype=np.int64)])
