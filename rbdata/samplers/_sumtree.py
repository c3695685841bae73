"""Sum and min trees over per-slot values: pure functions over tensors, on any device.

A tree over ``capacity`` slots is one 1-D tensor of ``2 * P`` nodes, ``P`` the smallest power
of two ``>= capacity``: node 1 is the root, node ``i`` has children ``2i`` and ``2i + 1``, slot
``s`` is leaf ``P + s`` (node 0 is unused). Padding leaves hold the identity of the operation
(0 for sums, ``+inf`` for minima), so the root is the sum / minimum over all slots.

The torch functions are the reference and run on CPU and CUDA tensors alike (level-synchronous
and vectorised). On CPU tensors, :func:`update` and :func:`find` dispatch to numba kernels with
the same semantics when numba is importable: a tree walk touches one random node per level, and
per-op dispatch of ~20 levels of torch ops costs far more than the walk itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "HAS_NUMBA",
    "find",
    "find_reference",
    "leaf_count",
    "new_tree",
    "update",
    "update_pair",
    "update_reference",
]

try:  # pragma: no cover - exercised by whichever environment runs the tests
    import numba

    HAS_NUMBA = True
except ImportError:  # pragma: no cover
    HAS_NUMBA = False


def leaf_count(capacity: int) -> int:
    """``P``: the number of leaves, the smallest power of two ``>= capacity``.

    Examples:
        >>> [leaf_count(c) for c in (1, 2, 3, 8, 9)]
        [1, 2, 4, 8, 16]
    """
    return 1 << max(0, (capacity - 1).bit_length())


def new_tree(
    capacity: int, op: str, dtype: torch.dtype = torch.float64, device: Any = "cpu"
) -> torch.Tensor:
    """An empty tree for ``op`` (``"sum"``: zeros, ``"min"``: ``+inf``)."""
    fill = 0.0 if op == "sum" else float("inf")
    return torch.full((2 * leaf_count(capacity),), fill, dtype=dtype, device=device)


def _last_occurrence(index: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Keep the last of duplicated indices (last write wins), vectorised."""
    order = torch.argsort(index, stable=True)
    sorted_index = index[order]
    keep = torch.ones_like(sorted_index, dtype=torch.bool)
    keep[:-1] = sorted_index[1:] != sorted_index[:-1]
    return sorted_index[keep], values[order[keep]]


def update_reference(
    tree: torch.Tensor, index: torch.Tensor, values: torch.Tensor, op: str
) -> None:
    """Set slots ``index`` to ``values`` and recompute their ancestors (torch, any device).

    Duplicated indices: the last value wins.
    """
    if index.numel() == 0:
        return
    leaves = tree.shape[0] // 2
    index, values = _last_occurrence(index, values)
    tree[index + leaves] = values.to(tree.dtype)
    node = index + leaves
    combine = torch.add if op == "sum" else torch.minimum
    for _ in range(leaves.bit_length() - 1):
        node = torch.unique(node // 2)
        tree[node] = combine(tree[2 * node], tree[2 * node + 1])


def find_reference(tree: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Slot of each prefix-sum target in a sum tree (torch, any device).

    Returns the slot ``s`` with ``sum(v[:s]) <= target < sum(v[:s + 1])``; a subtree of zero
    mass is never entered, so a slot of value 0 is never returned while the root is positive
    (targets rounded up to the total land on the last positive slot).
    """
    leaves = tree.shape[0] // 2
    node = torch.ones(targets.shape, dtype=torch.long, device=tree.device)
    remaining = targets.to(tree.dtype)
    for _ in range(leaves.bit_length() - 1):
        left = tree[2 * node]
        right = tree[2 * node + 1]
        go_right = (remaining >= left) & (right > 0)
        remaining = torch.where(go_right, remaining - left, remaining)
        node = 2 * node + go_right.long()
    return node - leaves


if HAS_NUMBA:

    @numba.njit(cache=True, nogil=True)
    def _nb_update(tree: Any, index: Any, values: Any, is_sum: bool) -> None:  # pragma: no cover
        leaves = tree.shape[0] // 2
        for i in range(index.shape[0]):  # sequential: the last duplicate wins
            tree[leaves + index[i]] = values[i]
        for i in range(index.shape[0]):
            node = (leaves + index[i]) // 2
            while node >= 1:
                a = tree[2 * node]
                b = tree[2 * node + 1]
                tree[node] = a + b if is_sum else min(a, b)
                node //= 2

    @numba.njit(cache=True, nogil=True)
    def _nb_update_pair(
        sum_tree: Any, min_tree: Any, index: Any, values: Any, min_values: Any
    ) -> None:  # pragma: no cover
        leaves = sum_tree.shape[0] // 2
        n = index.shape[0]
        node = np.empty(n, np.int64)
        for i in range(n):  # sequential: the last duplicate wins
            node[i] = leaves + index[i]
            sum_tree[node[i]] = values[i]
            min_tree[node[i]] = min_values[i]
        level = leaves
        while level > 1:  # level-major: children are final before their parents
            for i in range(n):
                parent = node[i] // 2
                node[i] = parent
                sum_tree[parent] = sum_tree[2 * parent] + sum_tree[2 * parent + 1]
                min_tree[parent] = min(min_tree[2 * parent], min_tree[2 * parent + 1])
            level //= 2

    @numba.njit(cache=True, nogil=True)
    def _nb_find(tree: Any, targets: Any, out: Any) -> None:  # pragma: no cover
        leaves = tree.shape[0] // 2
        n = targets.shape[0]
        remaining = targets.copy()
        for i in range(n):
            out[i] = 1
        level = leaves
        while level > 1:  # level-major: the walks' memory loads overlap
            for i in range(n):
                node = out[i]
                left = tree[2 * node]
                if remaining[i] >= left and tree[2 * node + 1] > 0:
                    remaining[i] -= left
                    out[i] = 2 * node + 1
                else:
                    out[i] = 2 * node
            level //= 2
        for i in range(n):
            out[i] -= leaves


def update(tree: torch.Tensor, index: torch.Tensor, values: torch.Tensor, op: str) -> None:
    """Set slots ``index`` to ``values`` and recompute ancestors (numba on CPU, else torch)."""
    if HAS_NUMBA and tree.device.type == "cpu":
        _nb_update(
            tree.numpy(),
            index.numpy().astype(np.int64, copy=False),
            values.to(tree.dtype).numpy(),
            op == "sum",
        )
    else:
        update_reference(tree, index, values, op)


def update_pair(
    sum_tree: torch.Tensor,
    min_tree: torch.Tensor,
    index: torch.Tensor,
    values: torch.Tensor,
    min_values: torch.Tensor,
) -> None:
    """Update a sum tree and a min tree over the same slots in one pass (CPU: one kernel)."""
    if HAS_NUMBA and sum_tree.device.type == "cpu":
        _nb_update_pair(
            sum_tree.numpy(),
            min_tree.numpy(),
            index.numpy().astype(np.int64, copy=False),
            values.to(sum_tree.dtype).numpy(),
            min_values.to(min_tree.dtype).numpy(),
        )
    else:
        update_reference(sum_tree, index, values, "sum")
        update_reference(min_tree, index, min_values, "min")


def find(tree: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Slot of each prefix-sum target in a sum tree (numba on CPU, else torch)."""
    if HAS_NUMBA and tree.device.type == "cpu":
        out = torch.empty(targets.shape, dtype=torch.long)
        _nb_find(tree.numpy(), targets.to(tree.dtype).numpy(), out.numpy())
        return out
    return find_reference(tree, targets)
