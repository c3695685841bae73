"""Index arithmetic shared by storages, writers and samplers: pure functions over ints/tensors."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rbdata._core.shown import shown
from rbdata.errors import IndexOutOfRangeError

__all__ = [
    "IndexBatch",
    "as_index_tensor",
    "as_int_index",
    "check_capacity",
    "normalize_int",
    "ring_runs",
]


def check_capacity(value: Any, name: str = "max_size") -> int:
    """Return ``value`` as a positive ``int`` or raise a ``ValueError`` naming ``name``.

    Examples:
        >>> check_capacity(10)
        10
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {shown(value)}")
    return int(value)


def normalize_int(index: int, length: int, what: str = "storage", measure: str = "length") -> int:
    """Map ``index`` (negative allowed) into ``[0, length)`` or raise ``IndexError``.

    Examples:
        >>> normalize_int(-1, 5)
        4
    """
    if -length <= index < length:
        return index + length if index < 0 else index
    raise IndexOutOfRangeError(f"index {index} is out of range for a {what} of {measure} {length}")


def as_int_index(index: Any) -> int | None:
    """``index`` as an ``int`` if it is one integer, else ``None`` (a batch of indices).

    An integer is a Python or numpy integer (not a ``bool``), or a 0-d integer tensor or
    array: ``storage[torch.tensor(2)]`` is the item at 2, like ``storage[2]``.

    Examples:
        >>> as_int_index(3), as_int_index(np.int64(3)), as_int_index(torch.tensor(3))
        (3, 3, 3)
        >>> as_int_index([3]), as_int_index(torch.tensor([3])), as_int_index(True)
        (None, None, None)
    """
    if type(index) is int:
        return index
    if isinstance(index, (torch.Tensor, np.ndarray)):
        if index.ndim != 0 or index.dtype in (torch.bool, np.bool_):
            return None
        if isinstance(index, torch.Tensor):
            if index.is_floating_point() or index.is_complex():
                return None
        elif index.dtype.kind not in "iu":
            return None
        return int(index.item())
    if isinstance(index, numbers.Integral) and not isinstance(index, (bool, np.bool_)):
        return int(index)
    return None


def _out_of_range(bad: int, length: int, what: str, measure: str, base: int) -> IndexError:
    message = f"index {bad} is out of range for a {what} of {measure} {length}"
    if base != length and bad < 0:
        message += f" (negative indices count from the length, {base})"
    return IndexOutOfRangeError(message)


def _check_range_np(arr: np.ndarray, length: int, what: str, measure: str, base: int) -> np.ndarray:
    if arr.size == 0:
        return arr.astype(np.int64, copy=False)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < -base or hi >= length:
        bad = hi if hi >= length else lo
        raise _out_of_range(bad, length, what, measure, base)
    arr = arr.astype(np.int64, copy=False)
    if lo < 0:
        arr = np.where(arr < 0, arr + base, arr)
    return arr


def as_index_tensor(
    indices: Any,
    length: int,
    what: str = "storage",
    measure: str = "length",
    negative_base: int | None = None,
    name: str = "index",
) -> torch.Tensor:
    """Convert ints, lists, arrays or tensors of indices into a checked 1-D ``LongTensor``.

    Negative indices count from ``length`` (or from ``negative_base``, e.g. a storage's
    ``len`` where writes may reach its whole capacity); anything outside
    ``[-base, length)`` raises ``IndexError`` naming the first offending index and the
    length. Lists go through numpy, which converts Python ints ~3x faster than
    ``torch.as_tensor``. A ``TypeError`` (not integers) names the argument ``name``.

    Examples:
        >>> as_index_tensor([0, -1], 4)
        tensor([0, 3])
        >>> as_index_tensor([5, -1], 8, negative_base=3)
        tensor([5, 2])
    """
    base = length if negative_base is None else negative_base
    if isinstance(indices, torch.Tensor):
        idx = indices
        if idx.dtype == torch.bool:
            raise TypeError(f"{name}: expected integers, got a boolean mask (use mask.nonzero())")
        if idx.is_floating_point() or idx.is_complex():
            kind = str(idx.dtype).replace("torch.", "")
            raise TypeError(f"{name}: expected integers, got a tensor of dtype {kind}")
        if idx.dtype != torch.long:
            idx = idx.long()
        if idx.dim() != 1:
            idx = idx.reshape(-1)
        if idx.numel() == 0:
            return idx
        lo, hi = torch.aminmax(idx)
        lo_i, hi_i = int(lo), int(hi)
        if lo_i < -base or hi_i >= length:
            bad = hi_i if hi_i >= length else lo_i
            raise _out_of_range(bad, length, what, measure, base)
        return torch.where(idx < 0, idx + base, idx) if lo_i < 0 else idx
    if isinstance(indices, slice):
        return torch.arange(*indices.indices(length))
    if isinstance(indices, numbers.Integral) and not isinstance(indices, bool):
        i = int(indices)
        if i < 0 and base != length:
            return torch.tensor([normalize_int(i, base, what, "length")])
        return torch.tensor([normalize_int(i, length, what, measure)])
    if isinstance(indices, np.ndarray):
        arr = indices
    elif isinstance(indices, Sequence) and not isinstance(indices, (str, bytes)):
        try:
            arr = np.array(indices)
        except (TypeError, ValueError, OverflowError) as err:
            raise TypeError(f"{name}: expected integers, got {indices!r:.80}") from err
        if arr.size == 0:
            return torch.empty(0, dtype=torch.long)
    else:
        raise TypeError(
            f"{name}: expected integers (an int, a sequence, an array or a tensor), got "
            f"{shown(indices)}"
        )
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got an array of dtype {arr.dtype}")
    arr = _check_range_np(arr.reshape(-1), length, what, measure, base)
    return torch.from_numpy(np.ascontiguousarray(arr))


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


class IndexBatch(list[int]):
    """A list of indices that also carries them as a tensor, with per-item extras.

    :class:`BatchSampler` yields these; a storage's ``__getitems__`` recognises them and adds
    ``"index"`` and the extras (e.g. ``"weight"``) to TensorDict batches, so a ``DataLoader``
    batch carries what ``ReplayBuffer.sample`` carries. Pickles like a list (DataLoader workers).
    """

    def __init__(self, index: torch.Tensor, extras: dict[str, torch.Tensor] | None = None):
        super().__init__(index.tolist())
        self.tensor = index
        self.extras = extras or {}
