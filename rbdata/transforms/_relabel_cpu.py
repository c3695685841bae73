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
    if column.device.type != "cpu" or column.dtype not in FAST_DTYPES:
        return None
    return column if column.is_contiguous() else None


def relabel_on_cpu(
    her: HindsightRelabel,
    index: torch.Tensor,
    old: torch.Tensor | None,
    old_next: Any,
    column: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Draw the goals of a CPU batch and write its desired goals in one kernel.

    ``column``: :func:`goal_column`; ``old``: the batch's desired goals (``None``: every item
    is relabeled, ``her_ratio`` is 1), of the column's dtype and of shape ``(n, *goal
    shape)``; ``old_next``: its
    ``("next", *desired_key)`` entry, blended as well when it is a CPU tensor of the same
    shape and dtype. Returns ``(desired, next desired or None, goal_index)``.
    """
    episodes = her.episodes
    n = index.shape[0]
    u, order = her.uniforms(n)
    goal = torch.empty(n, dtype=torch.int64)
    shape = (n, *column.shape[1:]) if old is None else old.shape
    desired = torch.empty(shape, dtype=column.dtype)
    out = desired.numpy().reshape(n, -1)
    previous = out if old is None else old.numpy().reshape(n, -1)
    if (
        isinstance(old_next, torch.Tensor)
        and old_next.shape == shape
        and old_next.dtype == desired.dtype
        and old_next.device.type == "cpu"
    ):
        new_next: torch.Tensor | None = torch.empty(shape, dtype=desired.dtype)
        next_out = new_next.numpy().reshape(n, -1)  # type: ignore[union-attr]
        next_old = old_next.numpy().reshape(n, -1)
    else:
        new_next, next_out = None, out[:0]
        next_old = next_out
    ints = her.ints
    ints[0], ints[1], ints[2], ints[4] = (
        episodes.time,
        episodes.base,
        episodes.capacity,
        int(her.her_ratio * n),
    )
    slots = index.numpy()
    if slots.dtype != np.int64:
        slots = slots.astype(np.int64)
    rows = column.numpy().reshape(column.shape[0], -1)
    relabel(
        slots, u, episodes.ends, ints, her.floats, order, goal.numpy(), rows, previous, out,
        next_old, next_out,
    )  # fmt: skip
    return desired, new_next, goal


def set_rewards(goal: torch.Tensor, reward: torch.Tensor, old: torch.Tensor) -> torch.Tensor | None:
    """``reward`` on the relabeled items, ``old`` elsewhere, in one kernel (or ``None``).

    ``None`` where the kernel cannot do it (a GPU tensor, dtypes that differ): the caller then
    blends with ``torch.where``.
    """
    if (
        reward.device.type != "cpu"
        or old.device.type != "cpu"
        or reward.dtype != old.dtype
        or old.dtype not in FAST_DTYPES
        or reward.requires_grad
        or reward.shape != old.shape
    ):
        return None
    n = goal.shape[0]
    out = torch.empty(old.shape, dtype=old.dtype)
    blend(
        goal.numpy(),
        reward.numpy().reshape(n, -1),
        old.numpy().reshape(n, -1),
        out.numpy().reshape(n, -1),
    )
    return out
