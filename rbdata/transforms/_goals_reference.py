"""The per-item Python references of :mod:`rbdata.transforms._goals`' numba kernels (for tests).

Item by item and branch by branch, in plain Python integers and floats: the kernels' uniforms
(SplitMix64) and goal draws must give exactly these numbers.
"""

from __future__ import annotations

import math

import numpy as np

from rbdata.transforms._goals import GAMMA, MIX1, MIX2

__all__ = ["goal_slots_reference", "uniforms_reference"]


def uniforms_reference(seed: int, n: int) -> np.ndarray:
    """:func:`uniforms` in plain Python: SplitMix64's outputs ``1, 2, ...`` from ``seed``.

    Examples:
        >>> uniforms_reference(0, 1).round(6).tolist()  # SplitMix64(0): 0xe220a8397b1dcdaf...
        [[0.883311, 0.431528, 0.026434, 0.970882]]
    """
    mask = (1 << 64) - 1
    out = np.empty((n, 4), np.float64)
    for k in range(4 * n):
        z = (seed + (k + 1) * GAMMA) & mask
        z = ((z ^ (z >> 30)) * MIX1) & mask
        z = ((z ^ (z >> 27)) * MIX2) & mask
        z ^= z >> 31
        out[k // 4, k % 4] = (z >> 11) / 9007199254740992.0
    return out


def goal_slots_reference(
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
    """:func:`goal_slots` item by item in plain Python (the slow reference).

    Examples:
        >>> u = np.full((2, 4), 0.5)
        >>> slots, ends = np.array([0, 3]), np.array([2, 5])  # episodes [0, 2] and [3, 5]
        >>> goal_slots_reference(slots, u, ends, 6, 0, 10, "future", 2).tolist()
        [1, 4]
        >>> goal_slots_reference(slots, u, ends, 6, 0, 10, "final", 2).tolist()
        [2, 5]
    """
    n = len(slots)
    order = list(range(n))
    for i in range(n_relabel):
        j = i + min(int(u[i, 0] * (n - i)), n - i - 1)
        order[i], order[j] = order[j], order[i]
    out = [-1] * n
    oldest = max(0, time - capacity)
    ends_list = [int(x) for x in ends]
    for i in order[:n_relabel]:
        t = oldest + (int(slots[i]) - base - oldest) % capacity
        later = [x for x in ends_list if x >= t]
        earlier = [x for x in ends_list if x < t]
        e = later[0] if later else time - 1
        s = max(earlier[-1] + 1 if earlier else oldest, oldest)
        v = float(u[i, 1])
        if strategy == "future":
            g = t + min(int(v * (e - t + 1)), e - t)
        elif strategy == "final":
            g = e
        elif strategy == "episode":
            g = s + min(int(v * (e - s + 1)), e - s)
        elif v < goal_probs[0]:
            g = t
        elif v < goal_probs[0] + goal_probs[1]:
            w = float(u[i, 2])
            if geom:
                k = 1 + (int(math.log(1.0 - w) / math.log(discount)) if discount > 0 else 0)
                g = min(t + k, e) if k < e - t + 1 else e
            else:
                a = min(t + 1, e)
                g = round(a * w + e * (1.0 - w))
        else:
            held = time - oldest
            g = oldest + min(int(float(u[i, 3]) * held), held - 1)
        out[i] = (base + g) % capacity
    return np.asarray(out, np.int64)
