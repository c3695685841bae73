"""``HindsightRelabel``'s CPU path: numpy views of the batch and one fused numba pass.

Where the batch is on the CPU and the storage holds the goals in a plain CPU column (tensor
and memmap storages), one kernel (:func:`~rbdata.transforms._goals.relabel`) finds each item's
episode, draws its goal step and writes the new desired goals (and ``("next", *desired)``)
straight from the storage's column into the batch's new tensors; a second one
(:func:`~rbdata.transforms._goals.blend`) keeps the stored rewards of the items not
relabeled. The per-batch cost is then a few small allocations, the uniforms and the two
kernels: no column gather, no ``torch.where``, no TensorDict machinery. Anything else (GPU
batches, list and Arrow storages, dtypes that differ) takes the general path, which draws the
very same goals.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rbdata._layout import Key
from rbdata.transforms._goals import blend, relabel

if TYPE_CHECKING:
    from rbdata.transforms.hindsight import HindsightRelabel

__all__ = ["FAST_DTYPES", "goal_column", "relabel_on_cpu", "set_rewards"]

#: dtypes the kernels copy (numba has no float16 or bfloat16)
FAST_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}
)


def goal_column(storage: Any, key: Key) -> torch.Tensor | None:
    """The storage's backing tensor of ``key`` where the kernel can read it, or ``None``.

    ``None`` where the storage has no plain backing tensors (list, Arrow), or the column is
    not a contiguous CPU tensor of a :data:`FAST_DTYPES` dtype. It is asked anew for every
    batch: the storage's memory may move (``share_memory_``, a remap).
    """
    keys = getattr(getattr(storage, "layout", None), "keys", None)
    if keys is None or key not in keys:
        return None
    buffers = getattr(storage, "buffers", None)
    if buffers is None:
        return None
    column = buffers[keys.index(key)]
    if not column.is_cpu or column.dtype not in FAST_DTYPES:
        return None
    return column if column.is_contiguous() else None


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def relabel_on_cpu(
    her: HindsightRelabel,
    index: torch.Tensor,
    old: torch.Tensor | None,
    old_next: Any,
    column: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Draw the goals of a CPU batch and write its desired goals in one kernel.

    ``column``: :func:`goal_column`, of the episode index's ``capacity`` rows; ``old``: the
    batch's desired goals (``None``: every item is relabeled, ``her_ratio`` is 1), of the
    column's dtype and of shape ``(n, *goal shape)``; ``old_next``: its ``("next",
    *desired_key)`` entry, blended as well when it is a CPU tensor of the same shape and
    dtype. Draws the batch's seed from the generator. Returns ``(desired, next desired or
    None, goal_index)``.
    """
    episodes = her.episodes
    n = index.shape[0]
    if index.dtype != torch.int64:
        index = index.to(torch.int64)
    index = _contiguous(index)
    dtype = column.dtype
    if old is None:
        old = desired = torch.empty((n, *column.shape[1:]), dtype=dtype)
    else:
        old = _contiguous(old)
        desired = torch.empty_like(old)  # empty_like: ~0.7 us less than empty(shape)
    shape = old.shape
    if (
        isinstance(old_next, torch.Tensor)
        and old_next.shape == shape
        and old_next.dtype == dtype
        and old_next.is_cpu
    ):
        old_next = _contiguous(old_next)
        new_next: torch.Tensor | None = torch.empty_like(old_next)
        next_at = new_next.data_ptr()  # type: ignore[union-attr]
    else:
        new_next, next_at = None, 0
    goal = torch.empty_like(index)
    ints = her.ints
    ints[0], ints[1], ints[2] = episodes.time, episodes.base, column.shape[0]
    ints[4] = int(her.her_ratio * n)
    u, order = her.scratch(n)
    relabel(
        her.seed(), n, math.prod(column.shape[1:]), ints, her.floats, episodes.ends, u, order,
        like(dtype), index.data_ptr(), goal.data_ptr(), column.data_ptr(), old.data_ptr(),
        desired.data_ptr(), old_next.data_ptr() if next_at else 0, next_at,
    )  # fmt: skip
    return desired, new_next, goal


_LIKE: dict[torch.dtype, np.ndarray] = {}


def like(dtype: torch.dtype) -> np.ndarray:
    """An empty numpy array of ``dtype``: what types a kernel's views of raw addresses."""
    arr = _LIKE.get(dtype)
    if arr is None:
        arr = _LIKE[dtype] = torch.empty(0, dtype=dtype).numpy()
    return arr


def set_rewards(goal: torch.Tensor, reward: torch.Tensor, old: torch.Tensor) -> torch.Tensor | None:
    """``reward`` on the relabeled items, ``old`` elsewhere, in one kernel (or ``None``).

    ``goal``: the batch's int64 goal slots (``-1``: kept). ``None`` where the kernel cannot
    do it (a GPU tensor, dtypes or shapes that differ, a reward that needs its gradient): the
    caller then blends with ``torch.where``.
    """
    if (
        not reward.is_cpu
        or not old.is_cpu
        or reward.dtype != old.dtype
        or old.dtype not in FAST_DTYPES
        or reward.requires_grad
        or reward.shape != old.shape
    ):
        return None
    n = goal.shape[0]
    reward, old = _contiguous(reward), _contiguous(old)
    out = torch.empty_like(old)
    blend(
        n, old.numel() // n if n else 0, like(old.dtype), goal.data_ptr(), reward.data_ptr(),
        old.data_ptr(), out.data_ptr(),
    )  # fmt: skip
    return out
