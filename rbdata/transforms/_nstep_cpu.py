"""``NStepReturn``'s CPU path: the windows, the returns and the next entries in two numba passes.

Used where the storage holds its fields as plain contiguous CPU tensors (tensor and memmap
storages) and the batch is a plain CPU TensorDict of the storage's gather: one pass finds each
item's window and sums its discounted rewards straight from the reward column, a second copies
the rows of the window's last step from every ``("next", ...)`` column into the batch. Its
reference is the transform's general path (numpy windows, ``read_column``, ``index_select``),
checked equal by the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numba
import numpy as np
import torch
from tensordict import TensorDict

from rbdata._core.layout import Key
from rbdata._core.native import prefetch, voidptr
from rbdata.transforms._batch import entry_of
from rbdata.transforms._relabel_cpu import like

__all__ = ["CpuNStep", "NextPlan", "copy_rows", "nstep_returns"]

#: reward dtypes the kernel sums
_REWARD_DTYPES = frozenset({torch.float32, torch.float64})


@numba.njit(cache=True, nogil=True)
def _first_end(ends: Any, t: int, never: int) -> int:  # pragma: no cover
    """The first of the sorted ``ends`` at or after ``t`` (``never`` where none is)."""
    j = np.searchsorted(ends, t)
    return ends[j] if j < ends.shape[0] else never


@numba.njit(cache=True, nogil=True)
def nstep_returns(
    slots_at: int,
    size: int,
    length: int,
    ends: Any,
    cuts: Any,
    time: int,
    base: int,
    capacity: int,
    discounts: Any,
    column_at: int,
    width: int,
    like: Any,
    out_at: int,
    k_at: int,
    last_at: int,
) -> bool:  # pragma: no cover
    """Each item's window (``k``, last slot) and its discounted return (``out``, ``width`` wide).

    ``False``, having written nothing, if a slot is outside ``[0, length)``. ``slots`` are
    the items' slots, ``ends`` and ``cuts`` the sorted end times of
    the episode indexes (done, truncation), ``discounts`` the ``n`` powers of gamma; the
    column has ``capacity`` rows of ``width`` values of ``like``'s dtype. The sums run in
    float64, in window order, as the general path's.
    """
    slots = numba.carray(voidptr(slots_at), (size,), np.int64)
    column = numba.carray(voidptr(column_at), (capacity, width), like.dtype)
    out = numba.carray(voidptr(out_at), (size, width), like.dtype)
    k_out = numba.carray(voidptr(k_at), (size,), np.int64)
    last_out = numba.carray(voidptr(last_at), (size,), np.int64)
    n = discounts.shape[0]
    oldest = max(0, time - capacity)
    row_bytes = width * like.itemsize
    for i in range(size):
        if slots[i] < 0 or slots[i] >= length:
            return False
    for i in range(size):  # first the windows, prefetching each one's first reward row
        t = oldest + (slots[i] - base - oldest) % capacity
        last = min(t + n - 1, time - 1, _first_end(ends, t, time), _first_end(cuts, t, time))
        k_out[i] = last - t + 1
        last_out[i] = last
        prefetch(column_at + slots[i] * row_bytes)
    for i in range(size):
        k = k_out[i]
        slot = slots[i]
        for j in range(width):
            acc = 0.0
            s = slot
            for q in range(k):
                acc += discounts[q] * column[s, j]
                s = s + 1 if s + 1 < capacity else 0
            out[i, j] = acc
        last_out[i] = (last_out[i] + base) % capacity
    return True


@numba.njit(cache=True, nogil=True)
def copy_rows(last_at: int, size: int, sources: Any, targets: Any, sizes: Any) -> None:  # pragma: no cover
    """``target_c[i] = source_c[last[i]]`` for every column ``c`` (rows of ``sizes[c]`` bytes).

    ``sources`` are the columns' addresses (``capacity`` rows each), ``targets`` those of
    the batch's entries (``size`` rows each).
    """
    last = numba.carray(voidptr(last_at), (size,), np.int64)
    for c in range(sources.shape[0]):
        b = sizes[c]
        for i in range(size):
            src = numba.carray(voidptr(sources[c] + last[i] * b), (b,), np.uint8)
            dst = numba.carray(voidptr(targets[c] + i * b), (b,), np.uint8)
            for x in range(b):
                dst[x] = src[x]


class NextPlan(NamedTuple):
    """What :meth:`CpuNStep.plan` checked of a storage's columns (for one layout)."""

    layout: Any  # the storage's layout object the columns were found in
    reward: int  # the reward column's place in ``storage.buffers``
    width: int  # values per reward
    keys: list[Key]  # the entries taken from the window's last step
    places: list[int]  # their columns' places in ``storage.buffers``
    sizes: np.ndarray  # their bytes per row (int64)


def _fits(column: torch.Tensor, capacity: int) -> bool:
    return column.is_cpu and column.is_contiguous() and column.shape[0] == capacity


class CpuNStep:
    """``NStepReturn``'s CPU path over a tensor or memmap storage (see the module docstring).

    Args:
        storage: the storage (its ``layout`` and ``buffers`` are read).
        reward_key: the reward.
        done_key: the done flag (taken from the last step, as every ``("next", ...)`` entry).
        skip: keys never taken from the last step (the transform's ``("next", "steps")``).
        discounts: ``gamma ** i`` for ``i < n`` (float64).
    """

    def __init__(
        self, storage: Any, reward_key: Key, done_key: Key, skip: Key, discounts: np.ndarray
    ) -> None:
        self.storage = storage
        self.reward_key = reward_key
        self.done_key = done_key
        self.skip = skip
        self.discounts = discounts
        self._plan: NextPlan | None = None

    def plan(self) -> NextPlan | None:
        """The storage's checked columns (kept while its layout object stays), or ``None``."""
        layout = getattr(self.storage, "layout", None)
        plan = self._plan
        if plan is not None and plan.layout is layout:
            return plan
        keys = getattr(layout, "keys", None)
        if keys is None or self.reward_key not in keys or self.done_key not in keys:
            return None
        taken = [
            key
            for key in keys
            if (key[0] == "next" or key == self.done_key)
            and key not in (self.reward_key, self.skip)
        ]
        buffers = self.storage.buffers
        reward = buffers[keys.index(self.reward_key)]
        if reward.dtype not in _REWARD_DTYPES:
            return None
        places = [keys.index(key) for key in taken]
        sizes = np.array(
            [buffers[p][:1].numel() * buffers[p].element_size() for p in places], np.int64
        )
        width = reward[:1].numel()
        self._plan = NextPlan(layout, keys.index(self.reward_key), width, taken, places, sizes)
        return self._plan

    def apply(
        self,
        batch: TensorDict,
        index: torch.Tensor,
        windows: Callable[[], tuple[np.ndarray, np.ndarray, int, int]],
        in_place: bool,
    ) -> torch.Tensor | None:
        """Turn the batch into n-step transitions here: its ``k`` (int64), or ``None``.

        ``None``, having changed nothing, where the batch or the storage is not as this path
        needs (the general path then does the batch). ``windows()`` syncs the episode indexes
        and returns their ends (done, truncation), the time and the base slot.
        ``in_place``: the batch's entries are the storage gather's own new tensors
        (``on_sampled``) and are written in place; else new ones replace them.
        """
        if batch.is_locked or index.dtype != torch.int64 or not index.is_contiguous():
            return None
        plan = self.plan()
        if plan is None:
            return None
        storage = self.storage
        buffers = storage.buffers
        capacity = int(storage.capacity)
        size = index.shape[0]
        entries = batch._tensordict
        reward_at, reward = entry_of(entries, self.reward_key)
        column = buffers[plan.reward]
        if (
            type(reward) is not torch.Tensor
            or reward.dtype != column.dtype
            or not reward.is_cpu
            or not reward.is_contiguous()
            or reward.numel() != size * plan.width
            or not _fits(column, capacity)
        ):
            return None
        holders, olds, sources = [], [], []
        for key, place in zip(plan.keys, plan.places, strict=True):
            holder, old = entry_of(entries, key)
            source = buffers[place]
            if (
                type(old) is not torch.Tensor
                or old.dtype != source.dtype
                or not old.is_cpu
                or not old.is_contiguous()
                or old.shape[1:] != source.shape[1:]
                or old.shape[0] != size
                or not _fits(source, capacity)
            ):
                return None
            holders.append(holder)
            olds.append(old)
            sources.append(source.data_ptr())
        empty = torch.empty
        out = reward if in_place else torch.empty_like(reward)
        k = empty(size, dtype=torch.int64)
        last = empty(size, dtype=torch.int64)
        targets = olds if in_place else [torch.empty_like(old) for old in olds]
        ends, cuts, time, base = windows()  # syncs (ends are replaced, never changed in place)
        if not nstep_returns(
            index.data_ptr(), size, len(storage), ends, cuts, time, base, capacity,
            self.discounts, column.data_ptr(), plan.width, like(column.dtype), out.data_ptr(),
            k.data_ptr(), last.data_ptr(),
        ):  # fmt: skip
            return None  # a slot out of range: the general path raises
        copy_rows(
            last.data_ptr(),
            size,
            np.array(sources, np.int64),
            np.array([t.data_ptr() for t in targets], np.int64),
            plan.sizes,
        )
        if not in_place:
            assert reward_at is not None
            reward_at[self.reward_key[-1]] = out
            for holder, key, target in zip(holders, plan.keys, targets, strict=True):
                holder[key[-1]] = target
        return k
