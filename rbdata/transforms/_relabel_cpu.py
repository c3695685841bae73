"""``HindsightRelabel``'s CPU path: numpy views of the batch and one fused numba pass.

Where the batch is on the CPU and the storage holds the goals in a plain CPU column (tensor
and memmap storages), one kernel (:func:`~rbdata.transforms._goals.relabel`) finds each item's
episode, draws its goal step and writes the new desired goals (and ``("next", *desired)``)
straight from the storage's column into the batch's new tensors; a second one
(:func:`~rbdata.transforms._goals.blend`) keeps the stored rewards of the items not
relabeled. :func:`relabel_batch` does a whole plain TensorDict batch of the usual shape with
one pass of checks (the per-batch cost is then a few small allocations and the two kernels:
no column gather, no ``torch.where``, no TensorDict machinery); :func:`relabel_on_cpu` does
the goals of the other CPU batches (no desired goal yet, rewards to convert). Anything else
(GPU batches, list and Arrow storages, dtypes that differ) takes the general path, which
draws the very same goals.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from tensordict import TensorDict

from rbdata._layout import Key
from rbdata.transforms._batch import entry_of
from rbdata.transforms._goals import blend, relabel

if TYPE_CHECKING:
    from rbdata.transforms.hindsight import HindsightRelabel

__all__ = [
    "FAST_DTYPES",
    "ColumnPlan",
    "column_plan",
    "goal_column",
    "relabel_batch",
    "relabel_on_cpu",
    "set_rewards",
]

#: dtypes the kernels copy (numba has no float16 or bfloat16)
FAST_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}
)


class ColumnPlan(NamedTuple):
    """What :func:`goal_column` checked of a storage's goal column."""

    layout: Any  # the storage's layout object the column was found in
    position: int  # the column's place in ``storage.buffers``
    column: torch.Tensor  # the tensor checked (contiguous, CPU, ``capacity`` rows)
    capacity: int  # the storage's (fixed), which the column's rows were checked against
    width: int  # values per goal
    like: np.ndarray  # an empty array of the column's dtype, for the kernel


def column_plan(storage: Any, key: Key, capacity: int) -> ColumnPlan | None:
    """Check the storage's column of ``key`` for the kernel: its plan, or ``None``.

    ``None`` where the storage has no plain backing tensors (list, Arrow), or the column is
    not a contiguous, non-empty CPU tensor of a :data:`FAST_DTYPES` dtype and ``capacity``
    rows.
    """
    layout = getattr(storage, "layout", None)
    keys = getattr(layout, "keys", None)
    if keys is None or key not in keys:
        return None
    buffers = getattr(storage, "buffers", None)
    if buffers is None:
        return None
    position = keys.index(key)
    column = buffers[position]
    if (
        not column.is_cpu
        or column.dtype not in FAST_DTYPES
        or column.numel() == 0
        or not column.is_contiguous()
        or column.shape[0] != capacity
    ):
        return None
    width = math.prod(column.shape[1:])
    return ColumnPlan(layout, position, column, capacity, width, like(column.dtype))


def goal_column(her: HindsightRelabel) -> ColumnPlan | None:
    """The plan of the storage's goal column for this batch, or ``None`` (see ``column_plan``).

    The column is asked anew for every batch (the storage's memory may move): the same
    tensor object in the same layout keeps its checked plan (a tensor's dtype and shape do
    not change, ``share_memory_`` moves its memory in place, and its address is read at each
    call); a new one (a remap, a new layout) is checked again.
    """
    storage = her.storage
    plan = her.column_plan
    if (
        plan is not None
        and plan.layout is storage.layout
        and storage.buffers[plan.position] is plan.column
    ):
        return plan
    plan = her.column_plan = column_plan(storage, her.goal_key, her.episodes.capacity)
    return plan


def relabel_batch(her: HindsightRelabel, batch: TensorDict, in_place: bool = False) -> bool:
    """Relabel a plain CPU TensorDict batch entirely here (goals, rewards), or do nothing.

    The common case in one pass of checks: ``"index"`` a contiguous int64 CPU vector, the
    desired goals (and ``("next", *desired_key)`` where the batch has it) contiguous CPU
    tensors of the storage goal column's dtype and item shape, the stored rewards one
    contiguous CPU value per item of a :data:`FAST_DTYPES` dtype, the goal column one
    :func:`goal_column` takes, and ``reward_fn`` returning a CPU tensor of the rewards'
    dtype (no gradient). Returns ``False``, having drawn nothing and changed nothing, where
    the entries are not all so (the general path then does the batch); ``True`` once done.
    A reward that is not so after the draw is blended by ``her.blend_reward``.

    ``in_place``: the batch's desired goals, next desired goals and rewards are tensors a
    tensor storage's gather has just made, held by nothing else (``on_sampled``): they are
    written in place instead of replaced by new ones (unless one of them is also the
    achieved goal ``reward_fn`` reads).
    """
    if batch.is_locked:
        return False
    entries = batch._tensordict
    index = entries.get("index")
    desired_at, old = entry_of(entries, her.desired_key)
    next_at, old_next = entry_of(entries, her.next_desired_key)
    reward_at, old_reward = entry_of(entries, her.reward_key)
    achieved = entry_of(entries, her.goal_key)[1]
    tensor = torch.Tensor
    if (
        type(index) is not tensor
        or type(old) is not tensor
        or type(old_reward) is not tensor
        or type(achieved) is not tensor
        or desired_at is None
        or reward_at is None
    ):
        return False
    plan = goal_column(her)
    if plan is None:
        return False
    n = index.shape[0]
    u, order, shape, n_relabel = her.scratch(n, plan)
    dtype = plan.column.dtype
    if (
        index.dtype is not torch.int64
        or index.dim() != 1
        or not index.is_cpu
        or old.shape != shape  # n rows (index is then a vector of n) of goals
        or old.dtype is not dtype
        or not old.is_cpu
        or not achieved.is_cpu
        or not old_reward.is_cpu
        or old_reward.numel() != n
        or old_reward.dtype not in FAST_DTYPES
        or not (index.is_contiguous() and old.is_contiguous() and old_reward.is_contiguous())
    ):
        return False
    if old_next is not None and (
        type(old_next) is not tensor
        or old_next.shape != shape
        or old_next.dtype is not dtype
        or not old_next.is_cpu
        or not old_next.is_contiguous()
    ):
        return False
    with her.draw_lock:  # the episode index and the kernel scratch: one at a time
        her.sync()
        empty_like = torch.empty_like
        if in_place and old is not achieved and old_next is not achieved:
            desired, new_next = old, old_next
        else:
            in_place = False
            desired = empty_like(old)
            new_next = None if old_next is None else empty_like(old_next)
        goal = _draw(her, plan, u, order, n_relabel, index, old, desired, old_next, new_next)
    if not in_place:
        desired_at[her.desired_key[-1]] = desired
        if next_at is not None and new_next is not None:
            next_at[her.next_desired_key[-1]] = new_next
    entries["goal_index"] = goal
    reward = her.reward_fn(achieved, desired, batch)
    if (
        type(reward) is tensor
        and reward.dtype is old_reward.dtype
        and reward.is_cpu
        and reward.numel() == n
        and reward.dim() in (1, 2)
        and reward.shape[0] == n
        and reward.is_contiguous()
        and not reward.requires_grad
    ):
        # set_rewards' kernel call, without its checks of old_reward (made above): routing
        # through it measured ~1 us more per batch on this hot path
        out = old_reward if in_place else empty_like(old_reward)
        blend(
            n, 1, like(old_reward.dtype), goal.data_ptr(), reward.data_ptr(),
            old_reward.data_ptr(), out.data_ptr(),
        )  # fmt: skip
        reward_at[her.reward_key[-1]] = out
    else:
        her.blend_reward(batch, reward, goal)
    return True


def relabel_on_cpu(
    her: HindsightRelabel, index: torch.Tensor, old: Any, old_next: Any
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None:
    """Draw the goals of a CPU batch and write its desired goals in one kernel, or ``None``.

    ``old``: the batch's desired goals (``None``: every item is relabeled, ``her_ratio`` is
    1); ``old_next``: its ``("next", *desired_key)`` entry, blended as well when it is a CPU
    tensor of the same shape and dtype. ``None`` (nothing drawn) where the kernel cannot do
    it: the storage has no plain CPU column of the goals (:func:`goal_column`), or the index
    or the desired goals are not CPU tensors of the column's dtype and item shape.
    Otherwise syncs the episode index and draws the batch's seed. Returns ``(desired, next
    desired or None, goal_index)``.
    """
    plan = goal_column(her) if index.is_cpu else None
    if plan is None:
        return None
    dtype = plan.column.dtype
    n = index.shape[0]
    u, order, shape, n_relabel = her.scratch(n, plan)
    if old is not None and (
        type(old) is not torch.Tensor or old.dtype != dtype or not old.is_cpu or old.shape != shape
    ):
        return None
    with her.draw_lock:  # the episode index and the kernel scratch: one at a time
        her.sync()
        if index.dtype != torch.int64 or not index.is_contiguous():
            index = index.to(torch.int64).contiguous()
        if old is None:
            old = desired = torch.empty(shape, dtype=dtype)
        else:
            if not old.is_contiguous():
                old = old.contiguous()
            desired = torch.empty_like(old)  # empty_like: ~0.7 us less than empty(shape)
        new_next: torch.Tensor | None = None
        if (
            type(old_next) is torch.Tensor
            and old_next.dtype == dtype
            and old_next.is_cpu
            and old_next.shape == shape
        ):
            if not old_next.is_contiguous():
                old_next = old_next.contiguous()
            new_next = torch.empty_like(old_next)
        goal = _draw(her, plan, u, order, n_relabel, index, old, desired, old_next, new_next)
    return desired, new_next, goal


def _draw(
    her: HindsightRelabel,
    plan: ColumnPlan,
    u: np.ndarray,
    order: np.ndarray,
    n_relabel: int,
    index: torch.Tensor,
    old: torch.Tensor,
    desired: torch.Tensor,
    old_next: Any,
    new_next: torch.Tensor | None,
) -> torch.Tensor:
    """The kernel call of both CPU paths (under ``her.draw_lock``, episodes synced).

    Every tensor checked by the caller: ``index`` contiguous int64, ``old``/``desired`` (and
    ``old_next``/``new_next`` where ``new_next`` is not ``None``) contiguous CPU goals of the
    column's dtype and item shape. Returns the new goal slots (``-1``: kept).
    """
    goal = torch.empty_like(index)
    next_old_ptr = next_ptr = 0
    if new_next is not None:
        next_old_ptr, next_ptr = old_next.data_ptr(), new_next.data_ptr()
    episodes = her.episodes
    relabel(
        her.seed(), index.shape[0], plan.width, episodes.time, episodes.base, plan.capacity,
        her.code, n_relabel, her.floats, episodes.ends, u, order, plan.like, index.data_ptr(),
        goal.data_ptr(), plan.column.data_ptr(), old.data_ptr(), desired.data_ptr(),
        next_old_ptr, next_ptr,
    )  # fmt: skip
    return goal


_LIKE: dict[torch.dtype, np.ndarray] = {}


def like(dtype: torch.dtype) -> np.ndarray:
    """An empty numpy array of ``dtype``: what types a kernel's views of raw addresses."""
    arr = _LIKE.get(dtype)
    if arr is None:
        arr = _LIKE[dtype] = torch.empty(0, dtype=dtype).numpy()
    return arr


def set_rewards(goal: torch.Tensor, reward: torch.Tensor, old: torch.Tensor) -> torch.Tensor | None:
    """``reward`` on the relabeled items, ``old`` elsewhere, in one kernel (or ``None``).

    ``goal``: the batch's int64 goal slots (``-1``: kept); ``reward`` holds as many values
    as ``old``, in row order (its shape may differ: ``(n,)`` for ``(n, 1)``); the result has
    ``old``'s shape. ``None`` where the kernel cannot do it (a GPU tensor, dtypes or sizes
    that differ, a reward that needs its gradient, an empty batch): the caller then blends
    with ``torch.where``.
    """
    n = goal.shape[0]
    dtype = old.dtype
    size = old.numel()
    if (
        reward.dtype != dtype
        or not reward.is_cpu
        or not old.is_cpu
        or reward.numel() != size
        or not n
        or dtype not in FAST_DTYPES
        or reward.requires_grad
    ):
        return None
    if not reward.is_contiguous():
        reward = reward.contiguous()
    if not old.is_contiguous():
        old = old.contiguous()
    out = torch.empty_like(old)
    blend(
        n, size // n, like(dtype), goal.data_ptr(), reward.data_ptr(), old.data_ptr(),
        out.data_ptr(),
    )  # fmt: skip
    return out
