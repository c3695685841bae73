"""Sum and min trees over per-slot values: pure functions over tensors, on any device.

The trees are **8-ary**, stored level by level in one 1-D tensor of any float dtype: the 8
children of a node are contiguous and start on a multiple of 8 elements (at most one 64-byte
cache line), so a root-to-leaf walk over 1M slots touches 7 lines instead of the 20 of a
binary tree; random walks miss cache, and the misses are the cost. A node's sum is a float64
pairwise sum of its 8 children, rounded once; searches run in float64.

``layout(tree)`` gives the level offsets: level ``l`` holds ``8**l`` nodes from
``offsets[l]``, node ``j`` of level ``l`` has children ``offsets[l + 1] + 8 * j + c``, slot
``s`` is leaf ``offsets[-1] + s``, the root is element ``ROOT``. Padding leaves hold the
identity of the operation (0 for sums, ``+inf`` for minima).

For prioritized sampling a *block-min tree* sits beside the sum tree: a min tree whose slot
``j`` holds the smallest positive value of the sum tree's leaf block ``j`` (slots ``8j`` to
``8j + 7``, one cache line that an update has just read), so its root is the smallest positive
stored value at an eighth of the memory of a per-slot min tree.

The torch functions are the reference and run on CPU and CUDA tensors alike: they are the
batched operations of :mod:`rbdata.samplers._trees.torch_ops` (vectorised over a batch, one level
at a time, no host synchronisation), the reference of the prioritized sampler's device trees
(which run fused Triton kernels where they can: :mod:`rbdata.samplers._trees.triton_ops`). On
CPU tensors the public functions check their arguments and dispatch to the numba kernels of
:mod:`rbdata.samplers._trees.numba_kernels`, with the same semantics.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch

__all__ = [
    "ARITY",
    "ROOT",
    "draw",
    "draw_reference",
    "find",
    "find_reference",
    "largest_base",
    "layout",
    "leaf_count",
    "leaf_offset",
    "new_block_min_tree",
    "new_tree",
    "rebuild",
    "set_priorities_reference",
    "update",
    "update_reference",
]

from rbdata.samplers._trees import torch_ops as _torch_tree
from rbdata.samplers._trees.numba_kernels import _nb_draw, _nb_find, _nb_update
from rbdata.samplers.saved import TREE_ARITY, TREE_ROOT

ARITY = TREE_ARITY
ROOT = TREE_ROOT  # padding before the root aligns every block of children to ARITY elements


def leaf_count(capacity: int) -> int:
    """The number of leaves: the smallest power of ``ARITY`` that is ``>= capacity``.

    Examples:
        >>> [leaf_count(c) for c in (1, 2, 8, 9, 1000)]
        [1, 8, 8, 64, 4096]
    """
    leaves = 1
    while leaves < capacity:
        leaves *= ARITY
    return leaves


@functools.lru_cache(maxsize=64)
def _offsets(size: int) -> tuple[int, ...]:
    offsets, start, width = [], ROOT, 1
    while start < size:
        offsets.append(start)
        start += width
        width *= ARITY
    if start != size:
        raise ValueError(f"a tree has {ROOT} + (8**(d+1) - 1) / 7 elements, got {size}")
    return tuple(offsets)


def layout(tree: torch.Tensor) -> tuple[int, ...]:
    """Offsets of the levels of ``tree``, root level first.

    Examples:
        >>> layout(new_tree(10, "sum"))
        (7, 8, 16)
    """
    return _offsets(int(tree.shape[0]))


def leaf_offset(tree: torch.Tensor) -> int:
    """Index of slot 0's leaf."""
    return layout(tree)[-1]


def new_tree(
    capacity: int, op: str, dtype: torch.dtype = torch.float64, device: Any = "cpu"
) -> torch.Tensor:
    """An empty tree over ``capacity`` slots for ``op`` (``"sum"``: zeros, ``"min"``: ``+inf``)."""
    size = ROOT + (leaf_count(capacity) * ARITY - 1) // (ARITY - 1)
    fill = 0.0 if op == "sum" else math.inf
    return torch.full((size,), fill, dtype=dtype, device=device)


# --- torch reference (any device) -----------------------------------------------------------
def _last_occurrence(index: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Keep the last of duplicated indices (last write wins), vectorised."""
    order = torch.argsort(index, stable=True)
    sorted_index = index[order]
    keep = torch.ones_like(sorted_index, dtype=torch.bool)
    keep[:-1] = sorted_index[1:] != sorted_index[:-1]
    return sorted_index[keep], values[order[keep]]


def _pairwise_sum(block: torch.Tensor) -> torch.Tensor:
    """``((b0 + b1) + (b2 + b3)) + ((b4 + b5) + (b6 + b7))`` per row: a depth-3 add tree."""
    b = block
    return ((b[:, 0] + b[:, 1]) + (b[:, 2] + b[:, 3])) + ((b[:, 4] + b[:, 5]) + (b[:, 6] + b[:, 7]))


def _levels(tree: torch.Tensor) -> _torch_tree.Levels:
    return _torch_tree.Levels(layout(tree), int(tree.shape[0]), tree.device)


def update_reference(
    tree: torch.Tensor, index: torch.Tensor, values: torch.Tensor, op: str
) -> None:
    """Set slots ``index`` to ``values`` and recompute their ancestors (duplicates: last wins).

    The batched torch update of :mod:`rbdata.samplers._trees.torch_ops`: the written leaves, then
    only their ancestors, level by level; sums in float64, pairwise, rounded once, exactly
    like the kernels (the same bits on every path and for every tree dtype).
    """
    if index.numel() == 0:
        return
    levels = _levels(tree)
    index = index.reshape(-1).to(device=tree.device, dtype=torch.long)
    scratch = _torch_tree.new_scratch(levels.leaves, tree.device)
    _torch_tree.update(tree, levels, index, values.reshape(-1).to(tree.device), op, scratch)


def find_reference(tree: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Slot of each prefix-sum target in a sum tree.

    Returns the slot ``s`` with ``sum(v[:s]) <= target < sum(v[:s + 1])``. A child of zero
    mass is never entered, so a slot of value 0 is never returned while the root is positive;
    a target rounded up to (or past) the total lands on the last positive slot. All targets
    descend together, one level at a time (:func:`rbdata.samplers._trees.torch_ops.find`).
    """
    return _torch_tree.find(tree, _levels(tree), targets)


def new_block_min_tree(
    capacity: int, dtype: torch.dtype = torch.float64, device: Any = "cpu"
) -> torch.Tensor:
    """An empty block-min tree for a sum tree over ``capacity`` slots (one slot per 8)."""
    return new_tree(max(1, leaf_count(capacity) // ARITY), "min", dtype, device)


def set_priorities_reference(
    sum_tree: torch.Tensor,
    min_tree: torch.Tensor,
    index: torch.Tensor,
    priority: torch.Tensor,
    eps: float,
    alpha: float,
) -> None:
    """Store ``(priority + eps) ** alpha`` at ``index`` and refresh the block-min tree."""
    if index.numel() == 0:
        return
    levels = _levels(sum_tree)
    values = (priority.double() + eps).pow(alpha)
    _torch_tree.set_values(
        sum_tree,
        min_tree,
        levels,
        _levels(min_tree),
        index.reshape(-1).to(device=sum_tree.device, dtype=torch.long),
        values.reshape(-1).to(sum_tree.device),
        _torch_tree.new_scratch(levels.leaves, sum_tree.device),
    )


def rebuild(sum_tree: torch.Tensor, min_tree: torch.Tensor) -> None:
    """Recompute every inner node of both trees from the sum tree's leaves, in place.

    The same float64 pairwise sums, rounded once per node, as the incremental updates: a
    consistent tree comes out bit for bit unchanged, and a tampered one becomes consistent
    (the tree walks then only ever reach leaves that hold mass).

    Examples:
        >>> tree, mins = new_tree(10, "sum"), new_block_min_tree(10)
        >>> tree[leaf_offset(tree) + 3] = 2.0
        >>> rebuild(tree, mins)
        >>> float(tree[ROOT]), float(mins[ROOT])
        (2.0, 2.0)
    """
    offsets = layout(sum_tree)
    sum_tree[:ROOT] = 0.0  # the alignment padding before the root, as new_tree leaves it
    min_tree[:ROOT] = math.inf
    for level in range(len(offsets) - 2, -1, -1):
        start, width = offsets[level + 1], ARITY ** (level + 1)
        block = sum_tree[start : start + width].view(-1, ARITY).double()
        sum_tree[offsets[level] : offsets[level] + width // ARITY] = _pairwise_sum(block)
    leaf0 = offsets[-1]
    leaves = sum_tree[leaf0:]
    width = min(ARITY, leaves.shape[0])
    rows = leaves.view(-1, width)
    block_min = torch.where(rows > 0, rows, math.inf).amin(1)
    min_offsets = layout(min_tree)
    min_tree[min_offsets[-1] : min_offsets[-1] + block_min.shape[0]] = block_min
    for level in range(len(min_offsets) - 2, -1, -1):
        start, width = min_offsets[level + 1], ARITY ** (level + 1)
        block = min_tree[start : start + width].view(-1, ARITY)
        min_tree[min_offsets[level] : min_offsets[level] + width // ARITY] = block.amin(1)


def draw_reference(
    sum_tree: torch.Tensor, min_tree: torch.Tensor, targets: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots of ``targets`` and their weights ``(v / v_min) ** -beta`` as float32."""
    return _torch_tree.draw(sum_tree, min_tree[ROOT], _levels(sum_tree), targets, beta)


def largest_base(vmax: float, alpha: float) -> float:
    """The largest ``p + eps`` whose ``(p + eps) ** alpha`` is safely ``<= vmax`` (float64).

    A relative margin of 1e-9 keeps the power's rounding below ``vmax``.

    Examples:
        >>> largest_base(1e300, 2.0) < 1e150
        True
        >>> largest_base(1e300, 0.0)
        inf
    """
    if alpha <= 0:
        return math.inf  # x ** 0 == 1
    try:
        base = vmax ** (1.0 / alpha)
    except OverflowError:
        return math.inf
    return base * (1.0 - 1e-9) if math.isfinite(base) else math.inf


def _np_offsets(tree: torch.Tensor) -> np.ndarray:
    return np.asarray(layout(tree), dtype=np.int64)


def _check_slots(tree: torch.Tensor, index: torch.Tensor, count: int) -> None:
    """Raise unless ``index`` is 1-D, has ``count`` entries and every slot is a leaf of ``tree``.

    What a kernel indexes with is checked here, vectorised, before any kernel runs.
    """
    if index.dim() != 1 or index.is_floating_point() or index.dtype is torch.bool:
        raise ValueError(
            f"index: expected a 1-D integer tensor, got {index.dtype} {tuple(index.shape)}"
        )
    if index.numel() != count:
        raise ValueError(f"values: expected {index.numel()} values (one per index), got {count}")
    if index.numel():
        lo, hi = torch.aminmax(index)
        leaves = int(tree.shape[0]) - leaf_offset(tree)
        if int(lo) < 0 or int(hi) >= leaves:
            bad = int(hi) if int(hi) >= leaves else int(lo)
            raise IndexError(f"index {bad} is out of range for a tree of {leaves} slots")


def _check_targets(targets: torch.Tensor) -> None:
    if targets.dim() != 1:
        raise ValueError(f"targets: expected a 1-D tensor, got shape {tuple(targets.shape)}")


# --- dispatching API -------------------------------------------------------------------------
def update(tree: torch.Tensor, index: torch.Tensor, values: torch.Tensor, op: str) -> None:
    """Set slots ``index`` to ``values`` and recompute ancestors (numba on CPU, else torch).

    Raises:
        IndexError: for a slot outside the tree's leaves (nothing is changed).
        ValueError: if ``index`` is not 1-D integers or ``values`` has another length.
    """
    layout(tree)  # a well-formed tree (the kernels derive every offset from it)
    _check_slots(tree, index, values.numel())
    if tree.device.type == "cpu":
        _nb_update(
            tree.numpy(),
            _np_offsets(tree),
            np.ascontiguousarray(index.numpy().astype(np.int64, copy=False)),
            np.ascontiguousarray(values.double().reshape(-1).numpy()),
            op == "sum",
        )
    else:
        update_reference(tree, index, values, op)


def find(tree: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Slot of each prefix-sum target in a sum tree (numba on CPU, else torch)."""
    _check_targets(targets)
    if tree.device.type == "cpu":
        out = torch.empty(targets.shape, dtype=torch.long)
        _nb_find(tree.numpy(), _np_offsets(tree), targets.double().numpy(), out.numpy())
        return out
    return find_reference(tree, targets)


def draw(
    sum_tree: torch.Tensor, min_tree: torch.Tensor, targets: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Like :func:`draw_reference`; on CPU one numba kernel walks and weighs."""
    _check_targets(targets)
    if sum_tree.device.type == "cpu":
        index = torch.empty(targets.shape, dtype=torch.long)
        weight = torch.empty(targets.shape, dtype=torch.float32)
        _nb_draw(
            sum_tree.numpy(),
            _np_offsets(sum_tree),
            float(min_tree[ROOT]),
            targets.double().numpy(),
            beta,
            index.numpy(),
            weight.numpy(),
        )
        return index, weight
    return draw_reference(sum_tree, min_tree, targets, beta)
