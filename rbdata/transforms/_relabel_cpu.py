"""``HindsightRelabel``'s CPU path: numpy views of the batch and one fused numba pass.

Where the batch is on the CPU and the storage holds the goals in a plain CPU column (tensor
and memmap storages), one kernel (:func:`~rbdata.transforms._goals.relabel`) finds each item's
episode, draws its goal step and writes the new desired goals (and ``("next", *desired)``)
straight from the storage's column into the batch's new tensors; a second one
(:func:`~rbdata.transforms._goals.blend`) keeps the stored rewards of the items not
relabeled. :class:`CpuRelabel`, which the transform holds, owns this path's state (the goal
column's checked plan, the kernel scratch): its :meth:`~CpuRelabel.relabel_batch` does a
whole plain TensorDict batch of the usual shape with one pass of checks (the per-batch cost
is then a few small allocations and the two kernels: no column gather, no ``torch.where``,
no TensorDict machinery); its :meth:`~CpuRelabel.relabel_goals` does the goals of the other
CPU batches (no desired goal yet, rewards to convert). Anything else (GPU batches, list and
Arrow storages, dtypes that differ) takes the general path, which draws the very same goals;
:func:`blend_rewards` sets the rewards of both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbdata._core.layout import Key
from rbdata.transforms._batch import entry_of, get_entry, put_entry
from rbdata.transforms._goals import blend, relabel
from rbdata.transforms.episodes import EpisodeIndex

__all__ = [
    "FAST_DTYPES",
    "ColumnPlan",
    "CpuRelabel",
    "blend_rewards",
    "column_plan",
    "set_rewards",
]

#: dtypes the kernels copy (numba has no float16 or bfloat16)
FAST_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}
)


class ColumnPlan(NamedTuple):
    """What :meth:`CpuRelabel.goal_column` checked of a storage's goal column."""

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


class CpuRelabel:
    """``HindsightRelabel``'s CPU path: the goal column's plan, the kernel scratch, the kernel.

    Owns the state only this path uses: the checked plan of the storage's goal column
    (:class:`ColumnPlan`, kept while the storage's layout and column objects stay the same),
    the kernel's scratch (reused while the batch size, the plan and the ratio stay the same)
    and the kernel's float arguments. What it shares with the transform's general path (the
    episode index, the lock held while it is in use, the sync and the seed stream) is given
    to it; the ratio and the reward function, which the transform's user may change between
    batches, are given per call.

    Args:
        episodes: the transform's episode index (its storage holds the goal column).
        goal_key: the key goals are read from (and the achieved goal ``reward_fn`` gets).
        desired_key: the desired goal (``("next", *desired_key)`` is blended as well).
        reward_key: the reward.
        code: the strategy's code in the kernels (``_goals.STRATEGIES``).
        goal_probs: ``ogbench``'s ``(p_cur, p_traj, p_random)``.
        log_discount: the log of the geometric draw's discount, ``nan`` for uniform later
            steps.
        lock: held while the episode index and the kernel scratch are in use (the general
            path holds it as well).
        sync: brings the episode index up to date (raises if the storage is empty).
        seed: draws a batch's seed (under ``lock``, after ``sync``).

    Examples:
        >>> import math, threading, torch
        >>> from rbdata import ReplayBuffer, TensorStorage
        >>> from rbdata.transforms import EpisodeIndex
        >>> from rbdata.transforms._goals import STRATEGIES
        >>> storage = TensorStorage(10)
        >>> goals = {"achieved_goal": torch.arange(10.0)[:, None]}
        >>> _ = ReplayBuffer(storage).extend({"observation": goals,
        ...     "next": {"done": torch.arange(10).eq(9)[:, None]}})
        >>> episodes = EpisodeIndex(storage)
        >>> cpu = CpuRelabel(episodes, goal_key=("observation", "achieved_goal"),
        ...     desired_key=("observation", "desired_goal"), reward_key=("next", "reward"),
        ...     code=STRATEGIES["final"], goal_probs=(0.2, 0.5, 0.3), log_discount=math.nan,
        ...     lock=threading.Lock(), sync=episodes.sync, seed=lambda: 7)
        >>> desired, _, goal = cpu.relabel_goals(torch.tensor([0, 4]), 1.0, None, None)
        >>> desired.flatten().tolist(), goal.tolist()  # "final": the episode's last step
        ([9.0, 9.0], [9, 9])
    """

    def __init__(
        self,
        episodes: EpisodeIndex,
        *,
        goal_key: Key,
        desired_key: Key,
        reward_key: Key,
        code: int,
        goal_probs: tuple[float, float, float],
        log_discount: float,
        lock: Any,
        sync: Callable[[], None],
        seed: Callable[[], int],
    ) -> None:
        self.episodes = episodes
        self.goal_key = goal_key
        self.desired_key = desired_key
        self.next_desired_key: Key = ("next", *desired_key)
        self.reward_key = reward_key
        self.code = code
        #: the kernel's float arguments: p_cur, p_traj, log(discount) (nan: uniform)
        self.floats = np.array([goal_probs[0], goal_probs[1], log_discount])
        self.lock = lock
        self.sync = sync
        self.seed = seed
        #: the facts of the storage's goal column last checked (:meth:`goal_column`)
        self.column_plan: ColumnPlan | None = None
        self._scratch: tuple[Any, ...] | None = None

    def goal_column(self) -> ColumnPlan | None:
        """The plan of the storage's goal column for this batch, or ``None`` (see ``column_plan``).

        The column is asked anew for every batch (the storage's memory may move): the same
        tensor object in the same layout keeps its checked plan (a tensor's dtype and shape do
        not change, ``share_memory_`` moves its memory in place, and its address is read at
        each call); a new one (a remap, a new layout) is checked again.
        """
        episodes = self.episodes
        storage = episodes.storage
        plan = self.column_plan
        if (
            plan is not None
            and plan.layout is storage.layout
            and storage.buffers[plan.position] is plan.column
        ):
            return plan
        plan = self.column_plan = column_plan(storage, self.goal_key, episodes.capacity)
        return plan

    def scratch(
        self, n: int, plan: ColumnPlan, ratio: float
    ) -> tuple[np.ndarray, np.ndarray, torch.Size, int]:
        """Kernel scratch for ``n`` items of ``plan``'s goals, reused from batch to batch.

        An empty ``(0, 4)`` array of doubles (the kernel makes its uniforms where it uses
        them), ``6 n`` int64, the batch's goal shape ``(n, *goal shape)`` and the count of
        items relabeled (``int(ratio * n)``).
        """
        scratch = self._scratch
        if scratch is None or scratch[0] != n or scratch[1] is not plan or scratch[6] != ratio:
            u, order = np.empty((0, 4), np.float64), np.empty(6 * n, np.int64)
            shape = torch.Size((n, *plan.column.shape[1:]))
            scratch = self._scratch = (n, plan, u, order, shape, int(ratio * n), ratio)
        return scratch[2:6]

    def relabel_batch(
        self, batch: TensorDict, ratio: float, reward_fn: Any, in_place: bool = False
    ) -> bool:
        """Relabel a plain CPU TensorDict batch entirely here (goals, rewards), or do nothing.

        The common case in one pass of checks: ``"index"`` a contiguous int64 CPU vector, the
        desired goals (and ``("next", *desired_key)`` where the batch has it) contiguous CPU
        tensors of the storage goal column's dtype and item shape, the stored rewards one
        contiguous CPU value per item of a :data:`FAST_DTYPES` dtype, the goal column one
        :meth:`goal_column` takes, and ``reward_fn`` returning a CPU tensor of the rewards'
        dtype (no gradient). Returns ``False``, having drawn nothing and changed nothing, where
        the entries are not all so (the general path then does the batch); ``True`` once done.
        A reward that is not so after the draw is blended by :func:`blend_rewards`.

        ``ratio``: the fraction of the batch relabeled; ``reward_fn``: the transform's.
        ``in_place``: the batch's desired goals, next desired goals and rewards are tensors a
        tensor storage's gather has just made, held by nothing else (``on_sampled``): they are
        written in place instead of replaced by new ones (unless one of them is also the
        achieved goal ``reward_fn`` reads).
        """
        if batch.is_locked:
            return False
        entries = batch._tensordict
        index = entries.get("index")
        desired_at, old = entry_of(entries, self.desired_key)
        next_at, old_next = entry_of(entries, self.next_desired_key)
        reward_at, old_reward = entry_of(entries, self.reward_key)
        achieved = entry_of(entries, self.goal_key)[1]
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
        plan = self.goal_column()
        if plan is None:
            return False
        n = index.shape[0]
        u, order, shape, n_relabel = self.scratch(n, plan, ratio)
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
        with self.lock:  # the episode index and the kernel scratch: one at a time
            self.sync()
            empty_like = torch.empty_like
            if in_place and old is not achieved and old_next is not achieved:
                desired, new_next = old, old_next
            else:
                in_place = False
                desired = empty_like(old)
                new_next = None if old_next is None else empty_like(old_next)
            goal = self._draw(plan, u, order, n_relabel, index, old, desired, old_next, new_next)
        if not in_place:
            desired_at[self.desired_key[-1]] = desired
            if next_at is not None and new_next is not None:
                next_at[self.next_desired_key[-1]] = new_next
        entries["goal_index"] = goal
        reward = reward_fn(achieved, desired, batch)
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
            reward_at[self.reward_key[-1]] = out
        else:
            blend_rewards(batch, self.reward_key, reward, goal)
        return True

    def relabel_goals(
        self, index: torch.Tensor, ratio: float, old: Any, old_next: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None:
        """Draw the goals of a CPU batch and write its desired goals in one kernel, or ``None``.

        ``ratio``: the fraction of the batch relabeled; ``old``: the batch's desired goals
        (``None``: every item is relabeled, ``ratio`` is 1); ``old_next``: its ``("next",
        *desired_key)`` entry, blended as well when it is a CPU tensor of the same shape and
        dtype. ``None`` (nothing drawn) where the kernel cannot do it: the storage has no
        plain CPU column of the goals (:meth:`goal_column`), or the index or the desired goals
        are not CPU tensors of the column's dtype and item shape. Otherwise syncs the episode
        index and draws the batch's seed. Returns ``(desired, next desired or None,
        goal_index)``.
        """
        plan = self.goal_column() if index.is_cpu else None
        if plan is None:
            return None
        dtype = plan.column.dtype
        n = index.shape[0]
        u, order, shape, n_relabel = self.scratch(n, plan, ratio)
        if old is not None and (
            type(old) is not torch.Tensor
            or old.dtype != dtype
            or not old.is_cpu
            or old.shape != shape
        ):
            return None
        with self.lock:  # the episode index and the kernel scratch: one at a time
            self.sync()
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
            goal = self._draw(plan, u, order, n_relabel, index, old, desired, old_next, new_next)
        return desired, new_next, goal

    def _draw(
        self,
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
        """The kernel call of both CPU paths (under ``lock``, episodes synced).

        Every tensor checked by the caller: ``index`` contiguous int64, ``old``/``desired``
        (and ``old_next``/``new_next`` where ``new_next`` is not ``None``) contiguous CPU goals
        of the column's dtype and item shape. Returns the new goal slots (``-1``: kept).
        """
        goal = torch.empty_like(index)
        next_old_ptr = next_ptr = 0
        if new_next is not None:
            next_old_ptr, next_ptr = old_next.data_ptr(), new_next.data_ptr()
        episodes = self.episodes
        relabel(
            self.seed(), index.shape[0], plan.width, episodes.time, episodes.base, plan.capacity,
            self.code, n_relabel, self.floats, episodes.ends, u, order, plan.like,
            index.data_ptr(), goal.data_ptr(), plan.column.data_ptr(), old.data_ptr(),
            desired.data_ptr(), next_old_ptr, next_ptr,
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


def blend_rewards(batch: TensorDictBase, key: Key, reward: Any, goal_index: torch.Tensor) -> None:
    """Set the batch's rewards at ``key``: ``reward`` where relabeled, the stored ones elsewhere.

    ``reward``: ``reward_fn``'s, one per item; ``goal_index``: the batch's goal slots (``-1``:
    kept). A batch without rewards gets ``reward`` as ``(n, 1)``. On the CPU the blend is one
    kernel (:func:`set_rewards`), elsewhere a ``torch.where``.

    Raises:
        TypeError: if ``reward`` is not a tensor or an array.
        ValueError: if it is not one reward per item.
    """
    n = goal_index.shape[0]
    cpu = goal_index.is_cpu
    try:
        if type(reward) is not torch.Tensor or (
            reward.is_cpu is not cpu or (not cpu and reward.device != goal_index.device)
        ):
            reward = torch.as_tensor(reward, device=goal_index.device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(
            f"reward_fn must return one reward per item (a tensor or array), got "
            f"{type(reward).__name__}"
        ) from err
    shape = reward.shape
    if shape != (n,) and shape != (n, 1):
        raise ValueError(
            f"reward_fn returned shape {tuple(reward.shape)}; expected one reward per item: "
            f"({n},) or ({n}, 1)"
        )
    old = get_entry(batch, key)
    if isinstance(old, torch.Tensor):
        if reward.dtype != old.dtype:
            reward = reward.to(old.dtype)
        blended = set_rewards(goal_index, reward, old) if cpu else None
        if blended is None:
            if reward.shape != old.shape:
                reward = reward.reshape(old.shape)
            mask = (goal_index >= 0).view((-1,) + (1,) * (old.dim() - 1))
            blended = torch.where(mask, reward, old)
        reward = blended
    else:
        reward = reward.reshape(n, 1)
    put_entry(batch, key, reward)
