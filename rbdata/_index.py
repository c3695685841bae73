"""Index arithmetic shared by storages, writers and samplers: pure functions over ints/tensors."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["as_index_tensor", "check_capacity", "normalize_int", "ring_runs"]


def check_capacity(value: Any, name: str = "max_size") -> int:
    """Return ``value`` as a positive ``int`` or raise a ``ValueError`` naming ``name``.

    Examples:
        >>> check_capacity(10)
        10
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def normalize_int(index: int, length: int, what: str = "storage", measure: str = "length") -> int:
    """Map ``index`` (negative allowed) into ``[0, length)`` or raise ``IndexError``.

    Examples:
        >>> normalize_int(-1, 5)
        4
    """
    if -length <= index < length:
        return index + length if index < 0 else index
    raise IndexError(f"index {index} is out of range for a {what} of {measure} {length}")


def as_index_tensor(
    indices: Any, length: int, what: str = "storage", measure: str = "length"
) -> torch.Tensor:
    """Convert ints, lists, arrays or tensors of indices into a checked 1-D ``LongTensor``.

    Negative indices count from ``length``; anything outside ``[-length, length)``
    raises ``IndexError`` naming the first offending index and the length.

    Examples:
        >>> as_index_tensor([0, -1], 4)
        tensor([0, 3])
    """
    if isinstance(indices, torch.Tensor):
        idx = indices
        if idx.dtype == torch.bool:
            raise TypeError("boolean masks are not supported as indices; use mask.nonzero()")
        if idx.is_floating_point() or idx.is_complex():
            raise TypeError(f"indices must be integers, got a tensor of dtype {idx.dtype}")
        if idx.dtype != torch.long:
            idx = idx.long()
    elif isinstance(indices, np.ndarray):
        if indices.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got an array of dtype {indices.dtype}")
        idx = torch.from_numpy(indices.astype(np.int64, copy=False).copy())
    elif isinstance(indices, slice):
        return torch.arange(*indices.indices(length))
    elif isinstance(indices, numbers.Integral) and not isinstance(indices, bool):
        return torch.tensor([normalize_int(int(indices), length, what, measure)])
    elif isinstance(indices, Sequence) and not isinstance(indices, str):
        try:
            idx = torch.as_tensor(indices, dtype=torch.long)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"indices must be integers, got {indices!r:.80}") from err
    else:
        raise TypeError(f"indices must be an int, a sequence or a tensor, got {type(indices)}")
    if idx.dim() != 1:
        idx = idx.reshape(-1)
    if idx.numel() == 0:
        return idx
    lo, hi = torch.aminmax(idx)
    lo_i, hi_i = int(lo), int(hi)
    if lo_i < -length or hi_i >= length:
        bad = hi_i if hi_i >= length else lo_i
        raise IndexError(f"index {bad} is out of range for a {what} of {measure} {length}")
    if lo_i < 0:
        idx = torch.where(idx < 0, idx + length, idx)
    return idx


def ring_runs(cursor: int, n: int, capacity: int) -> list[slice]:
    """Split a write of ``n`` items at ``cursor`` of a ring of ``capacity`` into contiguous runs.

    At most two runs: the tail of the ring, then its head. ``n`` must be in
    ``[0, capacity]``.

    Examples:
        >>> ring_runs(8, 4, 10)
        [slice(8, 10, None), slice(0, 2, None)]
    """
    if n <= 0:
        return []
    end = cursor + n
    if end <= capacity:
        return [slice(cursor, end)]
    return [slice(cursor, capacity), slice(0, end - capacity)]
