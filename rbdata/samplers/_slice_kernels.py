"""The numba kernel of a CPU item update of :class:`~rbdata.samplers.PrioritizedSliceSampler`.

One call checks the items, writes their priorities (in order: the last of duplicates wins) and
lists the starts whose slices hold an updated item with their slices' priorities, the work
that :class:`~rbdata.samplers._slice_priorities.ItemPriorities` does in torch ops on a device
(its reference: ``tests/samplers/test_prioritized_slice.py`` runs both paths and compares them
bit for bit). The caller turns the slice priorities into masses and hands them to the trees.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

__all__ = ["AGGREGATES", "_nb_update_items"]

#: the kernel's code of each ``slice_priority``
AGGREGATES = {"start": 0, "max": 1, "mean": 2}


@numba.njit(cache=True, nogil=True)
def _nb_update_items(
    prio: Any,
    span: Any,
    idx: Any,
    p: Any,
    filled: int,
    eps: float,
    pmax: float,
    length: int,
    how: int,
    old: Any,
    starts: Any,
    q: Any,
    mark: Any,
) -> tuple[int, int, int]:  # pragma: no cover - compiled
    """Check, write and list; returns ``(code, position, count)``.

    ``code`` is the first bad item's refusal code (1 an index outside ``[0, filled)``, 2 a
    non-finite, 3 a negative priority, 4 one whose value overflows: ``p + eps > pmax``) at
    ``position``, 0 if none; then nothing was written. Otherwise ``old[k]`` holds item ``k``'s
    former priority, and the first ``count`` entries of ``starts``/``q`` the starts covering
    an updated item (``how`` 0: the item's own slot; else also the ``length - 1`` slots before
    it, filled ones only), each once, and their slice's priority (start item, max or mean
    over the ``span`` real items; -1 where no slice starts). ``old`` holds ``len(idx)``
    entries, ``starts``/``q`` ``len(idx) * length``; ``mark`` (one byte per slot, all 0)
    flags the starts listed and is all 0 again on return.
    """
    n = idx.shape[0]
    capacity = prio.shape[0]
    for k in range(n):  # the checks, in update_priority's order of precedence
        i = idx[k]
        v = np.float64(p[k])
        if i < 0 or i >= filled:
            return 1, k, 0
        if not np.isfinite(v):
            return 2, k, 0
        if v < 0:
            return 3, k, 0
        if v + eps > pmax:
            return 4, k, 0
    for k in range(n):
        old[k] = prio[idx[k]]
    for k in range(n):  # in order: the last of duplicates wins
        prio[idx[k]] = p[k]
    reach = 1 if how == 0 or length == 1 else length
    m = 0
    for k in range(n):
        i = idx[k]
        for b in range(reach):
            c = i - b
            if c < 0:
                c %= capacity  # (slices longer than the ring: more than one lap)
            if c >= filled or mark[c]:
                continue
            mark[c] = 1
            s = span[c]
            if s <= 0:
                value = -1.0
            elif reach == 1:
                value = prio[c]
            else:
                value = prio[c]
                item = c
                for _ in range(1, s):
                    item += 1
                    if item == capacity:
                        item = 0
                    if how == 1:
                        value = max(value, prio[item])
                    else:  # a sequential sum, as the torch path adds the columns
                        value += prio[item]
                if how == 2:
                    value /= s
            starts[m] = c
            q[m] = value
            m += 1
    for t in range(m):
        mark[starts[t]] = 0
    return 0, 0, m
