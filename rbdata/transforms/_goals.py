"""Goal draws for hindsight relabeling: one numba pass per batch (reference: ``_goals_reference``).

Inputs are an :class:`~rbdata.transforms.EpisodeIndex`'s tables (``ends``, ``time``, ``base``,
``capacity``), the sampled slots and one row of uniforms in ``[0, 1)`` per item (columns:
0 picks the relabeled items, 1 the goal step, 2 and 3 OGBench's choice and its draw). The
output is the slot of each item's goal step (``-1``: not relabeled).

Goal steps (``t`` the item's time, ``[s, e]`` its episode's held steps, ``u`` a uniform):

- ``future``: ``t + floor(u * (e - t + 1))``, uniform over ``[t, e]`` (SB3's, inclusive);
- ``final``: ``e``;
- ``episode``: ``s + floor(u * (e - s + 1))``, uniform over ``[s, e]``;
- ``ogbench``: ``t`` with probability ``p_cur``, a later step of the episode with
  ``p_traj``, a step drawn uniformly from the whole storage otherwise. The later step is
  ``min(t + k, e)`` with ``k`` geometric on ``1, 2, ...`` of parameter ``1 - discount``
  (``geom``), or else OGBench's ``round(a * v + e * (1 - v))`` with ``a = min(t + 1, e)``.

Exactly ``n_relabel`` items are relabeled, a uniformly random subset (a partial Fisher-Yates
shuffle driven by column 0).
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from rbdata._core.native import prefetch, voidptr

__all__ = [
    "GAMMA",
    "MIX1",
    "MIX2",
    "STRATEGIES",
    "blend",
    "goal_draw",
    "goal_slots",
    "relabel",
    "uniforms",
]

#: the strategies and their codes in the kernel
STRATEGIES = {"future": 0, "final": 1, "episode": 2, "ogbench": 3}


@numba.njit(cache=True, nogil=True)
def _lower_bounds(a: Any, x: Any, k: Any, m: int) -> None:  # pragma: no cover
    """``k[:m] = np.searchsorted(a, x[:m])`` (the first ``a`` at or after each ``x``).

    Branch-free halvings taken level by level over the whole batch: the ``m`` searches'
    reads of ``a`` are independent, so they overlap (one search at a time waits on each read
    in turn: 4x slower on a batch of 256).
    """
    n = a.shape[0]
    for r in range(m):
        k[r] = 0
    if n == 0:
        return
    while n > 1:
        half = n >> 1
        for r in range(m):
            b = k[r]
            k[r] = b + half * (a[b + half] < x[r])
        n -= half
    for r in range(m):
        k[r] += a[k[r]] < x[r]


@numba.njit(cache=True, nogil=True)
def _episodes_of(a: Any, x: Any, k: Any, m: int, scratch: Any) -> None:  # pragma: no cover
    """``k[:m] = np.searchsorted(a, x[:m])`` for sorted ``a``: a guess, else :func:`_lower_bounds`.

    Each search starts where ``x`` falls between ``a[0]`` and ``a[-1]`` in proportion (with
    episodes of one length, the usual horizon of goal-conditioned tasks, that guess is the
    answer), steps once either way, and keeps the result only where it checks
    (``a[k - 1] < x <= a[k]``). The rest are searched by halvings over ``a``, all together.
    ``scratch``: ``3 m`` int64.
    """
    n = a.shape[0]
    if n == 0:
        for r in range(m):
            k[r] = 0
        return
    first, last = a[0], a[n - 1]
    scale = (n - 1) / (last - first) if last > first else 0.0
    rows, xs, ks = scratch[:m], scratch[m : 2 * m], scratch[2 * m : 3 * m]
    misses = 0
    for r in range(m):
        t = x[r]
        f = (t - first) * scale
        g = 0 if not f > 0.0 else (n if f >= n else math.ceil(f))
        g += g < n and a[g] < t
        g -= g > 0 and a[g - 1] >= t
        k[r] = g
        if (g < n and a[g] < t) or (g > 0 and a[g - 1] >= t):
            rows[misses] = r
            xs[misses] = t
            misses += 1
    if misses:
        _lower_bounds(a, xs, ks, misses)
        for q in range(misses):
            k[rows[q]] = ks[q]


GAMMA, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


@numba.njit(cache=True, nogil=True, inline="always")
def _splitmix(seed: int, k: int) -> float:  # pragma: no cover
    """SplitMix64's output number ``k`` (from 0) of ``seed``, as a double in ``[0, 1)``."""
    z = np.uint64(seed) + np.uint64(k + 1) * np.uint64(GAMMA)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
    z = z ^ (z >> np.uint64(31))
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@numba.njit(cache=True, nogil=True, inline="always")
def _uniform(u: Any, seed: int, i: int, c: int) -> float:  # pragma: no cover
    """``u[i, c]``, or :func:`uniforms` of ``seed`` at ``[i, c]`` computed here (``seed >= 0``)."""
    return _splitmix(seed, 4 * i + c) if seed >= 0 else u[i, c]


@numba.njit(cache=True, nogil=True)
def _nb_draw(
    slots: Any,
    u: Any,
    ends: Any,
    time: int,
    base: int,
    capacity: int,
    code: int,
    n_relabel: int,
    p_cur: float,
    p_traj: float,
    log_discount: float,
    order: Any,
    goal: Any,
    seed: int,
    column_at: int,
    row_bytes: int,
) -> None:  # pragma: no cover
    """Fill ``goal`` (the goal slot of each item, ``-1``: kept); ``order``: ``6 n`` of scratch.

    ``column_at`` (``0``: none): the address of the goal column (rows of ``row_bytes``),
    whose row ``goal[i]`` is prefetched as soon as it is drawn: the rows, random reads all
    over the storage, are then on their way while the next goals are drawn.

    ``log_discount`` is ``nan`` for OGBench's uniform later steps (``geom_sample=False``).
    ``seed < 0``: the uniforms are ``u``; ``seed >= 0``: :func:`uniforms` of ``seed``,
    each computed where it is used (``u`` is not read).
    """
    n = slots.shape[0]
    oldest = max(0, time - capacity)
    held = time - oldest
    for i in range(n):
        goal[i] = -1
        order[i] = i
    for i in range(n_relabel):  # a uniformly random subset of n_relabel items
        j = i + min(int(_uniform(u, seed, i, 0) * (n - i)), n - i - 1)
        order[i], order[j] = order[j], order[i]
    nends = ends.shape[0]
    geom = not math.isnan(log_discount)
    times, found = order[n : 2 * n], order[2 * n : 3 * n]
    # slot and time differ by ``off`` (the slot of time ``oldest``) modulo the capacity: a
    # compare where the slot is in range, not a 64-bit division per item
    off = (base + oldest) % capacity
    for r in range(n_relabel):
        x = slots[order[r]] - off
        x += capacity * (x < 0)
        if x < 0 or x >= capacity:  # a slot outside [0, capacity): the general rule
            x = (slots[order[r]] - base - oldest) % capacity
        times[r] = oldest + x
    # the first end at or after each time
    _episodes_of(ends, times, found, n_relabel, order[3 * n : 6 * n])
    for r in range(n_relabel):
        i = order[r]
        t = times[r]
        k = found[r]
        e = ends[k] if k < nends else time - 1
        s = ends[k - 1] + 1 if k > 0 else oldest
        if s < oldest:
            s = oldest
        v = _uniform(u, seed, i, 1)
        if code == 0:
            g = t + min(int(v * (e - t + 1)), e - t)
        elif code == 1:
            g = e
        elif code == 2:
            g = s + min(int(v * (e - s + 1)), e - s)
        else:
            if v < p_cur:
                g = t
            elif v < p_cur + p_traj:
                w = _uniform(u, seed, i, 2)  # made where used: the same number as up front
                if geom:
                    # k >= 1 with P(k > m) = discount ** m: 1 + floor(log(1 - w) / log(discount))
                    g = e
                    if log_discount < 0.0:
                        steps = math.log(1.0 - w) / log_discount
                        if steps < e - t - 1:
                            g = t + 1 + int(steps)
                    if g > e:
                        g = e
                else:
                    a = min(t + 1, e)
                    g = int(np.rint(a * w + e * (1.0 - w)))
            else:
                g = oldest + min(int(_uniform(u, seed, i, 3) * held), held - 1)
        x = off + (g - oldest)  # (base + g) % capacity, g in [oldest, oldest + capacity)
        x -= capacity * (x >= capacity)
        if x < 0 or x >= capacity:
            x = (base + g) % capacity
        goal[i] = x
        if column_at != 0:
            prefetch(column_at + x * row_bytes)


@numba.njit(cache=True, nogil=True)
def _nb_uniforms(seed: int, u: Any, ncols: int) -> None:  # pragma: no cover
    """``u[i, c]`` for ``c < ncols``: SplitMix64's output number ``4 * i + c`` from ``seed``."""
    for i in range(u.shape[0]):
        for c in range(ncols):
            u[i, c] = _splitmix(seed, 4 * i + c)


@numba.njit(cache=True, nogil=True)
def _nb_relabel(
    seed: int,
    n: int,
    d: int,
    time: int,
    base: int,
    capacity: int,
    code: int,
    n_relabel: int,
    floats: Any,
    ends: Any,
    u: Any,
    order: Any,
    like: Any,
    slots_at: int,
    goal_at: int,
    column_at: int,
    old_at: int,
    out_at: int,
    next_old_at: int,
    next_out_at: int,
) -> None:  # pragma: no cover
    """:func:`_nb_draw` on the uniforms of ``seed``, then each item's desired goal.

    Addresses (``*_at``) of checked, contiguous CPU memory: ``n`` int64 slots and goal
    slots, the storage's goal column (``capacity`` rows of ``d`` values of ``like``'s dtype),
    the batch's desired goals ``old`` and the new ones ``out`` (``n`` rows), the same for
    ``("next", *desired)`` (``next_out_at`` 0: none). ``floats`` is ``(p_cur, p_traj,
    log_discount)``; ``u`` (``n`` rows of 4) and ``order`` (``6 n``) are scratch.
    ``out[i]`` is the column's row ``goal[i]`` where relabeled, else ``old[i]``.
    """
    slots = numba.carray(voidptr(slots_at), (n,), np.int64)
    goal = numba.carray(voidptr(goal_at), (n,), np.int64)
    _nb_draw(
        slots, u, ends, time, base, capacity, code, n_relabel, floats[0], floats[1], floats[2],
        order, goal, seed, column_at, d * like.itemsize,
    )  # fmt: skip
    column = numba.carray(voidptr(column_at), (capacity, d), like.dtype)
    old = numba.carray(voidptr(old_at), (n, d), like.dtype)
    out = numba.carray(voidptr(out_at), (n, d), like.dtype)
    # ``order[:n_relabel]`` are the relabeled items: two loops without a data-dependent
    # branch, so the column's random rows (cache misses) are read in parallel
    for r in range(n_relabel):
        i = order[r]
        g = goal[i]
        for j in range(d):
            out[i, j] = column[g, j]
    if out_at != old_at:  # else in place: the kept rows are already there
        for r in range(n_relabel, n):
            i = order[r]
            for j in range(d):
                out[i, j] = old[i, j]
    if next_out_at != 0:
        next_old = numba.carray(voidptr(next_old_at), (n, d), like.dtype)
        next_out = numba.carray(voidptr(next_out_at), (n, d), like.dtype)
        for r in range(n if next_out_at != next_old_at else n_relabel):
            i = order[r]
            for j in range(d):
                next_out[i, j] = out[i, j] if r < n_relabel else next_old[i, j]


@numba.njit(cache=True, nogil=True)
def _nb_blend(
    n: int, d: int, like: Any, goal_at: int, new_at: int, old_at: int, out_at: int
) -> None:  # pragma: no cover
    """``out[i] = new[i]`` where ``goal[i] >= 0`` (relabeled), else ``old[i]`` (addresses)."""
    goal = numba.carray(voidptr(goal_at), (n,), np.int64)
    new = numba.carray(voidptr(new_at), (n, d), like.dtype)
    old = numba.carray(voidptr(old_at), (n, d), like.dtype)
    out = numba.carray(voidptr(out_at), (n, d), like.dtype)
    for i in range(n):
        if goal[i] >= 0:
            for j in range(d):
                out[i, j] = new[i, j]
        else:
            for j in range(d):
                out[i, j] = old[i, j]


#: the fused draw and goal copy of a batch (the numba dispatcher itself: no wrapper's call)
relabel = _nb_relabel
#: rows of ``new`` where relabeled, of ``old`` elsewhere
blend = _nb_blend


def uniforms(seed: int, n: int) -> np.ndarray:
    """The ``(n, 4)`` uniforms in ``[0, 1)`` of a batch's ``seed`` (SplitMix64, one pass)."""
    u = np.empty((n, 4), np.float64)
    _nb_uniforms(seed, u, 4)
    return u


def goal_draw(
    slots: np.ndarray,
    u: np.ndarray,
    ends: np.ndarray,
    time: int,
    base: int,
    capacity: int,
    code: int,
    n_relabel: int,
    goal_probs: tuple[float, float, float],
    geom: bool,
    log_discount: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`goal_slots` for the hot path: also the slots to read and the relabeled mask.

    Returns ``(goal, read, mask)``: the goal slots (``-1``: kept), the slot to read each
    item's goal from (its own slot where kept) and ``goal >= 0``.
    """
    out = np.empty(slots.shape[0], np.int64)
    _nb_draw(
        slots, u, ends, time, base, capacity, code, n_relabel, goal_probs[0], goal_probs[1],
        log_discount if geom else math.nan, np.empty(6 * out.shape[0], np.int64), out, -1, 0, 0,
    )  # fmt: skip
    mask = out >= 0
    return out, np.where(mask, out, slots), mask


def goal_slots(
    slots: np.ndarray,
    u: np.ndarray,
    ends: np.ndarray,
    time: int,
    base: int,
    capacity: int,
    strategy: str,
    n_relabel: int,
    goal_probs: tuple[float, float, float] = (0.0, 1.0, 0.0),
    geom: bool = False,
    discount: float = 0.99,
) -> np.ndarray:
    """The goal slot of each item (``-1``: not relabeled), in one numba pass (see the module)."""
    log_discount = math.log(discount) if discount > 0 else -math.inf
    code = STRATEGIES[strategy]
    return goal_draw(
        slots, u, ends, time, base, capacity, code, n_relabel, goal_probs, geom, log_discount
    )[0]
