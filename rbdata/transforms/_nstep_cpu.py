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

__all__ = ["CpuNStep", "NextPlan", "nstep_returns"]

#: reward dtypes the kernel sums
_REWARD_DTYPES = frozenset({torch.float32, torch.float64})


_WORD8, _WORD4, _WORD1 = np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.uint8)


@numba.njit(cache=True, nogil=True)
def _copy_rows(
    source_at: int, target_at: int, last: Any, size: int, rows: int, words: int, like: Any
) -> None:  # pragma: no cover
    """``target[i] = source[last[i]]`` for rows of ``words`` values of ``like``'s dtype."""
    source = numba.carray(voidptr(source_at), (rows, words), like.dtype)
    target = numba.carray(voidptr(target_at), (size, words), like.dtype)
    for i in range(size):
        row = last[i]
        for x in range(words):
            target[i, x] = source[row, x]


@numba.njit(cache=True, nogil=True)
def nstep_returns(
    slots_at: int,
    size: int,
    length: int,
    flags_at: int,
    cuts_at: int,
    time: int,
    base: int,
    capacity: int,
    discounts: Any,
    column_at: int,
    width: int,
    like: Any,
    out_at: int,
    k: Any,
    last: Any,
    sources: Any,
    targets: Any,
    sizes: Any,
) -> bool:  # pragma: no cover
    """Each item's window, its discounted return, and the entries of the window's last step.

    ``False``, having written nothing, if a slot is outside ``[0, length)``. ``slots`` are
    the items' slots; ``flags`` and ``cuts`` the addresses of the done and truncation flag
    columns (one byte per step; ``cuts_at`` 0: none), which end windows, as the newest step
    (``time - 1``, the ring's oldest at ``base``) does; ``discounts`` the ``n`` powers of
    gamma. Each window is scanned from its first step, whose flags the gather has just read
    (no search, no new cache line but where a window crosses one). The reward column has
    ``capacity`` rows of ``width`` values of ``like``'s dtype, ``out`` gets the returns (the
    sums run in float64, in window order, as the general path's). ``k`` and ``last`` get each
    window's length and last slot. Then ``target_c[i] = source_c[last[i]]`` for every column
    ``c`` (``sources``: the columns' addresses, ``capacity`` rows of ``sizes[c]`` bytes each;
    ``targets``: the batch entries', ``size`` rows). The random rows are prefetched ahead of
    their reads, so that the misses overlap.
    """
    slots = numba.carray(voidptr(slots_at), (size,), np.int64)
    column = numba.carray(voidptr(column_at), (capacity, width), like.dtype)
    out = numba.carray(voidptr(out_at), (size, width), like.dtype)
    n = discounts.shape[0]
    oldest = max(0, time - capacity)
    shift = (base + oldest) % capacity  # the slot of the oldest step
    for i in range(size):
        if slots[i] < 0 or slots[i] >= length:
            return False
    flags = numba.carray(voidptr(flags_at), (capacity,), np.uint8)
    cuts = numba.carray(voidptr(cuts_at if cuts_at != 0 else flags_at), (capacity,), np.uint8)
    columns = sources.shape[0]
    for i in range(size):  # the windows; each last step's rows are prefetched once known
        slot = slots[i]
        d = slot - shift
        t = oldest + (d + capacity if d < 0 else d)
        limit = min(n - 1, time - 1 - t)
        s = slot
        j = 0
        while j < limit and flags[s] == 0 and cuts[s] == 0:
            j += 1
            s = s + 1 if s + 1 < capacity else 0
        k[i] = j + 1
        last[i] = s
        for c in range(columns):
            prefetch(sources[c] + s * sizes[c])
    for i in range(size):  # the returns, summed from the column
        slot = slots[i]
        for j in range(width):
            acc = 0.0
            s = slot
            for q in range(k[i]):
                acc += discounts[q] * column[s, j]
                s = s + 1 if s + 1 < capacity else 0
            out[i, j] = acc
    for c in range(columns):  # the last step's entries, in the widest words that fit
        b = sizes[c]
        if b % 8 == 0:
            _copy_rows(sources[c], targets[c], last, size, capacity, b // 8, _WORD8)
        elif b % 4 == 0:
            _copy_rows(sources[c], targets[c], last, size, capacity, b // 4, _WORD4)
        else:
            _copy_rows(sources[c], targets[c], last, size, capacity, b, _WORD1)
    return True


class NextPlan(NamedTuple):
    """What :meth:`CpuNStep.plan` checked of a storage's columns (for one layout)."""

    layout: Any  # the storage's layout object the columns were found in
    reward: torch.Tensor  # the reward column (contiguous, CPU, ``capacity`` rows)
    width: int  # values per reward
    like: np.ndarray  # an empty array of the reward's dtype, for the kernel
    keys: list[Key]  # the entries taken from the window's last step
    places: list[int]  # their columns' places in ``storage.buffers``
    columns: list[torch.Tensor]  # the columns checked (contiguous, CPU, ``capacity`` rows)
    numels: list[int]  # values per row of each
    sizes: np.ndarray  # bytes per row of each (int64)
    flags: torch.Tensor  # the done column (one byte per step), one of ``columns``
    cuts: torch.Tensor | None  # the truncation column so, one of ``columns`` (``None``: none)


def _fits(column: torch.Tensor, capacity: int) -> bool:
    return column.is_cpu and column.is_contiguous() and column.shape[0] == capacity


def _matches(entry: Any, dtype: torch.dtype, numel: int) -> bool:
    """Whether a batch entry is a contiguous CPU tensor of ``dtype`` and ``numel`` values."""
    return (
        type(entry) is torch.Tensor
        and entry.dtype is dtype
        and entry.is_cpu
        and entry.numel() == numel
        and entry.is_contiguous()
    )


class CpuNStep:
    """``NStepReturn``'s CPU path over a tensor or memmap storage (see the module docstring).

    Owns the checked plan of the storage's columns (kept while the storage's layout and
    column objects stay the same; their addresses are read at each call, as memory may move
    in place).

    Args:
        storage: the storage (its ``layout`` and ``buffers`` are read).
        reward_key: the reward.
        done_key: the done flag (taken from the last step, as every ``("next", ...)`` entry).
        truncated_key: the truncation flag that ends windows where the batch has it, or
            ``None``.
        steps_key: the entry of the window lengths (never taken from the last step).
        discounts: ``gamma ** i`` for ``i < n`` (float64).
    """

    def __init__(
        self,
        storage: Any,
        reward_key: Key,
        done_key: Key,
        truncated_key: Key | None,
        steps_key: Key,
        discounts: np.ndarray,
    ) -> None:
        self.storage = storage
        self.reward_key = reward_key
        self.done_key = done_key
        self.truncated_key = truncated_key
        self.steps_key = steps_key
        self.discounts = discounts
        self._plan: NextPlan | None = None

    def plan(self) -> NextPlan | None:
        """The storage's checked columns, or ``None`` where the kernel cannot read them."""
        storage = self.storage
        layout = getattr(storage, "layout", None)
        buffers = getattr(storage, "buffers", None)
        if layout is None or buffers is None:
            return None
        plan = self._plan
        if plan is not None and plan.layout is layout and buffers[plan.places[-1]] is plan.reward:
            for place, column in zip(plan.places, plan.columns, strict=False):
                if buffers[place] is not column:
                    break
            else:
                return plan
        self._plan = plan = self._check(layout, buffers, int(storage.capacity))
        return plan

    def _check(self, layout: Any, buffers: list[torch.Tensor], capacity: int) -> NextPlan | None:
        keys = getattr(layout, "keys", None)
        if keys is None or self.reward_key not in keys or self.done_key not in keys:
            return None
        taken = [
            key
            for key in keys
            if (key[0] == "next" or key == self.done_key)
            and key not in (self.reward_key, self.steps_key)
        ]
        reward = buffers[keys.index(self.reward_key)]
        places = [keys.index(key) for key in taken]
        columns = [buffers[p] for p in places]
        if reward.dtype not in _REWARD_DTYPES or not all(
            _fits(c, capacity) for c in [reward, *columns]
        ):
            return None
        numels = [c[:1].numel() for c in columns]
        sizes = np.array([m * c.element_size() for m, c in zip(numels, columns, strict=True)])
        flags = columns[taken.index(self.done_key)]
        if flags.element_size() != 1 or flags[:1].numel() != 1 or flags.is_floating_point():
            return None  # flags of another dtype: the general path reads them
        cut = self.truncated_key
        cuts = None
        if cut is not None and cut in keys:  # truncations end windows: one byte per step too
            if cut not in taken:
                return None
            cuts = columns[taken.index(cut)]
            if cuts.element_size() != 1 or cuts[:1].numel() != 1 or cuts.is_floating_point():
                return None
        places.append(keys.index(self.reward_key))  # last: the reward's
        return NextPlan(
            layout, reward, reward[:1].numel(), like(reward.dtype), taken, places, columns,
            numels, sizes.astype(np.int64), flags, cuts,
        )  # fmt: skip

    def apply(
        self,
        batch: TensorDict,
        ends: Callable[[bool], tuple[np.ndarray, np.ndarray, int, int]],
        in_place: bool,
    ) -> bool:
        """Turn the batch into n-step transitions here; whether it did.

        ``False``, having changed nothing, where the batch or the storage is not as this path
        needs (the general path then does the batch): the batch a plain, unlocked CPU
        TensorDict whose ``"index"`` is one int64 slot per item in ``[0, len(storage))`` and
        whose reward, done flag and ``("next", ...)`` entries are contiguous CPU tensors of the
        storage's dtypes and sizes, and the done flags (and truncation flags, where the storage
        has them) one byte per step. ``ends(False)`` syncs the episode index and returns its
        time and base slot (the windows are scanned from the flags). ``in_place``: the
        batch's entries are the storage gather's own new tensors (``on_sampled``) and are
        written in place; else new ones replace them.
        """
        if batch.is_locked:
            return False
        entries = batch._tensordict
        index = entries.get("index")
        if (
            type(index) is not torch.Tensor
            or index.dtype is not torch.int64
            or not index.is_cpu
            or index.dim() != 1
            or not index.is_contiguous()
        ):
            return False
        plan = self.plan()
        if plan is None:
            return False
        size = index.shape[0]
        reward_at, reward = entry_of(entries, self.reward_key)
        done = entry_of(entries, self.done_key)[1]
        steps_at = entry_of(entries, self.steps_key)[0]  # where the steps go (made or replaced)
        if (
            not _matches(reward, plan.reward.dtype, size * plan.width)
            or type(done) is not torch.Tensor
            or done.numel() != size
            or not done.is_cpu
            or steps_at is None
        ):
            return False
        holders: list[dict[str, Any]] = []
        olds: list[torch.Tensor] = []
        for key, column, numel in zip(plan.keys, plan.columns, plan.numels, strict=True):
            holder, old = entry_of(entries, key)
            if not _matches(old, column.dtype, size * numel):
                return False
            holders.append(holder)  # type: ignore[arg-type]  # found with its entry
            olds.append(old)
        if in_place:
            out, targets = reward, olds
        else:
            empty_like = torch.empty_like
            out, targets = empty_like(reward), [empty_like(old) for old in olds]
        # the batch has every column of the plan, the truncations' included where it has one
        cuts_at = 0 if plan.cuts is None else plan.cuts.data_ptr()
        k = np.empty(done.shape, np.int64)
        time, base = ends(False)[2:]  # syncs the index (its time and base slot)
        storage = self.storage
        if not nstep_returns(
            index.data_ptr(), size, len(storage), plan.flags.data_ptr(), cuts_at, time, base,
            int(storage.capacity), self.discounts, plan.reward.data_ptr(), plan.width,
            plan.like, out.data_ptr(), k.reshape(size), np.empty(size, np.int64),
            np.array([c.data_ptr() for c in plan.columns], np.int64),
            np.array([t.data_ptr() for t in targets], np.int64), plan.sizes,
        ):  # fmt: skip
            return False  # a slot out of range: the general path raises
        if not in_place:
            assert reward_at is not None
            reward_at[self.reward_key[-1]] = out
            for holder, key, target in zip(holders, plan.keys, targets, strict=True):
                holder[key[-1]] = target
        steps_at[self.steps_key[-1]] = torch.from_numpy(k)
        return True
