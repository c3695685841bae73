"""Batched sum/min-tree operations in plain torch: the reference of the device trees.

The prioritized sampler's device trees run the fused Triton kernels of
:mod:`rbdata.samplers._trees.triton_ops` where Triton can run, and these ops otherwise (no Triton,
``RBDATA_TRITON=0``); tests hold the two to the same results.

The trees are those of :mod:`rbdata.samplers._trees.sumtree` (8-ary, level by level in one 1-D
tensor). Every function here works on a whole batch and loops over the tree's *levels* only
(``log8`` of the capacity: 8 for 10M slots), never over items:

- a **draw** descends all targets together, one step per level: gather the 8 children of every
  current node, take their float64 prefix sums, pick the child, subtract the mass before it;
- an **update** writes the leaves (duplicate slots: the last write wins), then recomputes only
  the ancestors of the written slots, level by level from the leaves up. A level with no more
  nodes than the batch has slots is recomputed whole from the level below (one contiguous
  read: cheaper than gathering as many scattered blocks), exactly as the numba kernel does;
  the others are gathered and scattered at the touched parents only. Never the whole tree.

Nothing reads a device value on the host: no ``.item()``, no data-dependent Python branch, no
boolean-mask indexing (its output size would need one), no ``torch.unique``. On CUDA the ops
queue without a host synchronisation; on CPU the same code is the reference that CI checks
against the numba kernels.

**Same results as the numba kernels.** For the same stored values and the same targets the
trees, indices and weights are the ones of :mod:`rbdata.samplers._trees.sumtree`'s kernels:

- a node's sum is the same float64 pairwise add tree of its 8 children,
  ``((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7))``, rounded once to the tree's dtype;
  minima are exact;
- a search compares the same float64 *sequential* prefix sums ``c0, c0 + c1, ...`` with the
  remaining target. They come from ``cumsum`` along dim 0 of an ``(8, batch)`` block, which
  on CPU and on CUDA alike runs one thread per column adding the 8 children in order (a
  ``cumsum`` along the last dim would use a parallel scan on CUDA, whose different
  association could round differently). A target rounded up to a block's total takes the last
  child of positive mass, or child 0 if there is none, as the kernel does;
- duplicate slots in one update: the last one wins (each slot takes the value of its highest
  position, a ``scatter_reduce`` amax into a scratch vector), so no sort and no ``unique``.

What can differ is ``pow``: the stored values ``(p + eps) ** alpha`` and the weights
``(v / v_min) ** -beta`` are float64 powers computed by torch (CPU or CUDA libdevice) instead
of numba's libm; they may differ in the last bit of the float64 result, which survives the
rounding to a float32 tree or weight about once in 2**29 (exact for ``alpha`` or ``beta`` of
0 and 1). Indices then differ only for a target within that rounding of a boundary between
two slots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "Levels",
    "draw",
    "find",
    "last_writes",
    "new_scratch",
    "refresh",
    "set_values",
    "update",
]

ARITY = 8
ROOT = ARITY - 1  # the root's element (see _sumtree: padding aligns the blocks of children)


class Levels:
    """The constants of one tree for the batched ops, built once per tree and device.

    Args:
        offsets: the level offsets of the tree, root level first (``_sumtree.layout``).
        size: the number of elements of the tree tensor.
        device: where the tree lives (the index vectors below are put there once).
    """

    __slots__ = ("block_rows", "child_rows", "leaf0", "leaves", "offsets", "positions")

    def __init__(self, offsets: Sequence[int], size: int, device: torch.device | str) -> None:
        self.offsets = tuple(int(o) for o in offsets)
        self.leaf0 = self.offsets[-1]
        self.leaves = int(size) - self.leaf0
        children = torch.arange(ARITY, dtype=torch.long, device=device).unsqueeze(1)
        #: ``positions[c, 0] = c``: the child positions of a block, as a column
        self.positions = children
        #: per parent level ``l``: the column of element indices of a block's children at
        #: level ``l + 1`` (add ``8 * node`` to get the children of ``node``)
        self.child_rows = [children + o for o in self.offsets[1:]]
        #: the block of leaves that a block-min slot summarises (``min(8, leaves)`` wide)
        self.block_rows = children[: min(ARITY, self.leaves)] + self.leaf0

    @property
    def block_width(self) -> int:
        """Leaves per block-min slot: 8, or the single leaf of a one-slot tree."""
        return int(self.block_rows.shape[0])


def new_scratch(leaves: int, device: torch.device | str) -> torch.Tensor:
    """The scratch vector of :func:`last_writes`: one position per leaf (never initialised)."""
    dtype = torch.int32 if leaves < 2**31 else torch.int64
    return torch.empty(leaves, dtype=dtype, device=device)


def last_writes(index: torch.Tensor, values: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """For each position, the value of the *last* position with the same slot.

    Writing the result at ``index`` then stores, for duplicated slots, the last value given:
    every duplicate writes that same value, so the order in which the device applies the
    writes does not matter. ``scratch`` has one entry per leaf (:func:`new_scratch`); it
    holds anything beforehand (``include_self=False``: only this batch's positions count).

    Examples:
        >>> index = torch.tensor([2, 5, 2, 2])
        >>> last_writes(index, torch.tensor([1.0, 7.0, 3.0, 4.0]), new_scratch(8, "cpu"))
        tensor([4., 7., 4., 4.])
    """
    positions = torch.arange(index.shape[0], dtype=scratch.dtype, device=index.device)
    scratch.scatter_reduce_(0, index, positions, "amax", include_self=False)
    return values[scratch[index]]


def _pairwise_sum(block: torch.Tensor, dim: int) -> torch.Tensor:
    """The float64 pairwise sum of the 8 entries along ``dim`` (0 or 1) of ``block``.

    ``((b0 + b1) + (b2 + b3)) + ((b4 + b5) + (b6 + b7))``, the association of the numba
    kernels' ``_nb_block_sum`` (:mod:`rbdata.samplers._trees.numba_kernels`): three sums over
    a dimension of 2 (``x + y`` exactly, in any order), the first one casting to float64 on
    the way.
    """
    if dim == 0:
        s = block.view(4, 2, -1).sum(1, dtype=torch.float64)
        return s.view(2, 2, -1).sum(1).sum(0)
    s = block.view(-1, 4, 2).sum(2, dtype=torch.float64)
    return s.view(-1, 2, 2).sum(2).sum(1)


def _combine(block: torch.Tensor, op: str, dim: int) -> torch.Tensor:
    return _pairwise_sum(block, dim) if op == "sum" else block.amin(dim)


def refresh(tree: torch.Tensor, levels: Levels, slots: torch.Tensor, op: str) -> None:
    """Recompute the ancestors of ``slots`` (leaf positions), level by level from the leaves.

    Children are final before their parents are computed, so a parent shared by several
    slots gets the same value from each (duplicates are harmless). A level whose node count
    is at most the number of slots is recomputed whole from the level below, like the numba
    kernel; the values are the same either way, for a consistent tree.
    """
    n = int(slots.shape[0])
    offsets = levels.offsets
    node = slots
    for level in range(len(offsets) - 2, -1, -1):
        width = ARITY**level  # the number of nodes at this level
        parents = tree.narrow(0, offsets[level], width)
        if width <= n:  # every level above is narrower still: whole levels from here on
            below = tree.narrow(0, offsets[level + 1], ARITY * width).view(width, ARITY)
            parents.copy_(_combine(below, op, 1))
            continue
        node = torch.div(node, ARITY, rounding_mode="floor")
        block = tree[torch.add(levels.child_rows[level], node, alpha=ARITY)]  # (8, n)
        parents.index_put_((node,), _combine(block, op, 0).to(tree.dtype))


def update(
    tree: torch.Tensor,
    levels: Levels,
    index: torch.Tensor,
    values: torch.Tensor,
    op: str,
    scratch: torch.Tensor,
) -> None:
    """Set slots ``index`` to ``values`` (the last of duplicates wins) and refresh ancestors.

    ``index`` must be in range (the caller checks it); ``values`` are cast to the tree's dtype.
    """
    if index.shape[0] == 0:
        return
    leaves = tree.narrow(0, levels.leaf0, levels.leaves)
    leaves.index_put_((index,), last_writes(index, values, scratch).to(tree.dtype))
    refresh(tree, levels, index, op)


def set_values(
    sum_tree: torch.Tensor,
    min_tree: torch.Tensor,
    sum_levels: Levels,
    min_levels: Levels,
    index: torch.Tensor,
    values: torch.Tensor,
    scratch: torch.Tensor,
    keep: torch.Tensor | None = None,
) -> None:
    """Store ``values`` at slots ``index`` in the sum tree and refresh the block-min tree.

    Args:
        sum_tree: the sum tree (``_sumtree.new_tree``).
        min_tree: its block-min tree (``_sumtree.new_block_min_tree``).
        sum_levels: the sum tree's :class:`Levels`.
        min_levels: the block-min tree's :class:`Levels`.
        index: 1-D int64 slots, in range (duplicates: the last one wins).
        values: the values to store (any float dtype; cast to the tree's).
        scratch: :func:`new_scratch` over the sum tree's leaves.
        keep: ``None``, or a 0-d bool tensor: where it is false the current values are
            written back instead, so nothing changes (a refused update, decided on the device
            without a host synchronisation).
    """
    if index.shape[0] == 0:
        return
    leaves = sum_tree.narrow(0, sum_levels.leaf0, sum_levels.leaves)
    new = last_writes(index, values, scratch).to(sum_tree.dtype)
    if keep is not None:
        new = torch.where(keep, new, leaves[index])
    leaves.index_put_((index,), new)
    refresh(sum_tree, sum_levels, index, "sum")
    # block j of the min tree: the smallest positive value among leaves 8j .. 8j + 7
    width = sum_levels.block_width
    blocks = torch.div(index, width, rounding_mode="floor")
    rows = sum_tree[torch.add(sum_levels.block_rows, blocks, alpha=width)]  # (width, n)
    block_min = torch.where(rows > 0, rows, math.inf).amin(0)
    min_tree.narrow(0, min_levels.leaf0, min_levels.leaves).index_put_((blocks,), block_min)
    refresh(min_tree, min_levels, blocks, "min")


def find(tree: torch.Tensor, levels: Levels, targets: torch.Tensor) -> torch.Tensor:
    """The slot of each prefix-sum target: ``sum(v[:s]) <= target < sum(v[:s + 1])``.

    All targets descend together, one step per level. A child of zero mass is never entered;
    a target rounded up to (or past) a block's total takes the block's last child of positive
    mass (child 0 if it has none, so an all-zero tree yields slot 0).
    """
    remaining = targets.double()
    node = torch.zeros(targets.shape, dtype=torch.long, device=tree.device)
    positions = levels.positions
    for rows in levels.child_rows:
        block = tree[torch.add(rows, node, alpha=ARITY)]  # (8, n): children of every node
        prefix = block.cumsum(0, dtype=torch.float64)  # sequential per column (module notes)
        chosen = (prefix <= remaining).sum(0)  # children whose inclusive prefix is <= target
        last_positive = ((block > 0) * positions).amax(0)
        # ``chosen`` < 8 is a positive child, so <= last_positive; 8 (rounded up) becomes it
        chosen = torch.minimum(chosen, last_positive)
        before = F.pad(prefix, (0, 0, 1, 0)).gather(0, chosen.unsqueeze(0)).squeeze(0)
        remaining = remaining - before
        node = torch.add(chosen, node, alpha=ARITY)
    return node


def draw(
    sum_tree: torch.Tensor,
    min_root: torch.Tensor,
    levels: Levels,
    targets: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots of ``targets`` and their weights ``(v / v_min) ** -beta`` as float32.

    ``min_root`` is the block-min tree's root (a 0-d tensor: the smallest positive value),
    read on the device.
    """
    index = find(sum_tree, levels, targets)
    values = sum_tree.narrow(0, levels.leaf0, levels.leaves)[index].double()
    return index, (values / min_root).pow_(-beta).to(torch.float32)
