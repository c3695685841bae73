"""How many items of a batch each source gives: weights, checked, and largest-remainder counts."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

__all__ = ["check_weights", "largest_remainder"]


def check_weights(weights: Any, names: Sequence[str]) -> tuple[float, ...]:
    """``weights`` (a mapping name -> weight) as a tuple in the order of ``names``.

    Every name needs a weight, and no other name may have one; a weight is a finite real
    number ``>= 0`` (not a bool), and at least one is positive.

    Raises:
        TypeError: ``weights`` is not a mapping, or a weight is not a real number.
        ValueError: missing or unknown names, a negative or non-finite weight, or all zero.

    Examples:
        >>> check_weights({"online": 1, "offline": 0.5}, ["offline", "online"])
        (0.5, 1.0)
    """
    if not isinstance(weights, Mapping):
        raise TypeError(
            f"weights must be a dict of source name -> weight, got {type(weights).__name__}"
        )
    missing = [name for name in names if name not in weights]
    unknown = [repr(name) for name in weights if name not in names]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(map(repr, missing))}")
        if unknown:
            parts.append(f"unknown {', '.join(unknown)}")
        raise ValueError(
            f"weights: one weight per source ({', '.join(map(repr, names))}); {'; '.join(parts)}"
        )
    out = []
    for name in names:
        value = weights[name]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"weights[{name!r}] must be a real number, got {value!r} ({type(value).__name__})"
            )
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"weights[{name!r}] must be finite and >= 0, got {value!r}")
        out.append(value)
    if not any(out):
        raise ValueError(f"weights: at least one weight must be positive, got {dict(weights)}")
    return tuple(out)


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """Split ``total`` into integer counts proportional to ``weights`` (largest remainder).

    Each count is ``floor(w_i / sum(w) * total)`` or one more; the ``total - sum(floors)``
    extra items go to the largest remainders, ties to the earlier position. The counts sum to
    ``total`` exactly and each is within 1 of its exact share. A zero weight gets 0.

    Args:
        weights: non-negative finite numbers, at least one positive.
        total: a non-negative int.

    Examples:
        >>> largest_remainder([0.5, 0.5], 256)
        [128, 128]
        >>> largest_remainder([1, 1, 1], 10)
        [4, 3, 3]
        >>> largest_remainder([0.3, 0.7, 0.0], 5)
        [2, 3, 0]
    """
    shares = [Fraction(w) for w in weights]  # exact: a float is a ratio of integers
    wsum = sum(shares)
    if not wsum > 0:
        raise ValueError(f"weights: at least one must be positive, got {list(weights)}")
    quotas = [share * total / wsum for share in shares]
    counts = [math.floor(q) for q in quotas]
    extra = total - sum(counts)
    if extra:
        order = sorted(range(len(counts)), key=lambda i: (counts[i] - quotas[i], i))
        for i in order[:extra]:
            counts[i] += 1
    return counts
