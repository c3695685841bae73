"""The numba kernels of the CPU sum and block-min trees: update, find, draw, set priorities.

The trees are those of :mod:`rbdata.samplers._trees.sumtree` (8-ary, level by level in one 1-D
array, the block-min tree beside the sum tree): its dispatching functions (``update``, ``find``,
``draw``) call these kernels on CPU tensors, and :class:`~rbdata.samplers._trees.cpu.CpuTrees`
calls the address entry points (``_nb_set_priorities_at``, ``_nb_draw_at``) on every
``update_priority`` and draw. The torch functions of :mod:`~rbdata.samplers._trees.sumtree` and
:mod:`~rbdata.samplers._trees.torch_ops` are their reference (``tests/samplers/test_sumtree.py``).

A kernel only ever sees indices and buffers its caller has already checked: the slots against
the tree's leaves, the addresses and lengths against the tensors they come from
(``NUMBA_BOUNDSCHECK=1``, ``make boundscheck``, runs the kernel tests with numba's checks on).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from rbdata._core.native import voidptr

#: the kernels other modules of ``_trees`` (and the equivalence tests) call; they keep the
#: ``_nb_`` prefix of every numba kernel in rbdata
__all__ = [
    "_nb_draw",
    "_nb_draw_at",
    "_nb_find",
    "_nb_set_one",
    "_nb_set_priorities",
    "_nb_set_priorities_at",
    "_nb_update",
]


@numba.njit(cache=True, nogil=True, inline="always")
def _nb_block_sum(tree: Any, base: int) -> float:  # pragma: no cover
    # a depth-3 add tree in float64: 3 dependent adds instead of 8
    a = np.float64(tree[base]) + np.float64(tree[base + 1])
    b = np.float64(tree[base + 2]) + np.float64(tree[base + 3])
    c = np.float64(tree[base + 4]) + np.float64(tree[base + 5])
    d = np.float64(tree[base + 6]) + np.float64(tree[base + 7])
    return (a + b) + (c + d)


@numba.njit(cache=True, nogil=True)
def _nb_fix_up(tree: Any, offsets: Any, slot: int, is_sum: bool) -> None:  # pragma: no cover
    node = slot
    for level in range(offsets.shape[0] - 2, -1, -1):
        node //= 8
        base = offsets[level + 1] + 8 * node
        if is_sum:
            tree[offsets[level] + node] = _nb_block_sum(tree, base)
        else:
            m = tree[base]
            for c in range(1, 8):
                m = min(m, tree[base + c])
            tree[offsets[level] + node] = m


@numba.njit(cache=True, nogil=True)
def _nb_update(
    tree: Any, offsets: Any, index: Any, values: Any, is_sum: bool
) -> None:  # pragma: no cover
    leaf0 = offsets[offsets.shape[0] - 1]
    for i in range(index.shape[0]):  # sequential: the last duplicate wins
        tree[leaf0 + index[i]] = values[i]
    for i in range(index.shape[0]):
        _nb_fix_up(tree, offsets, index[i], is_sum)


@numba.njit(cache=True, nogil=True)
def _nb_min_offsets(offsets: Any) -> Any:  # pragma: no cover
    # the block-min tree has one level less than the sum tree (but at least the root)
    depth = max(1, offsets.shape[0] - 1)
    out = np.empty(depth, np.int64)
    for level in range(depth):
        out[level] = offsets[level]
    return out


@numba.njit(cache=True, nogil=True)
def _nb_refresh_sums(sum_tree: Any, offsets: Any, index: Any) -> None:  # pragma: no cover
    # level-major: every walk's misses at one level overlap, and children are final
    # before their parents (a parent shared by several walks is recomputed, same value).
    # A level with no more nodes than updates is recomputed whole, once: the walks
    # would otherwise redo its few (cached) nodes n times.
    n = index.shape[0]
    node = index.copy()
    level_width = 8 ** (offsets.shape[0] - 1)  # the number of leaves
    for level in range(offsets.shape[0] - 2, -1, -1):
        level_width //= 8  # the number of nodes at this level
        start = offsets[level + 1]
        if level_width <= n:
            for j in range(level_width):
                sum_tree[offsets[level] + j] = _nb_block_sum(sum_tree, start + 8 * j)
            continue
        for i in range(n):
            parent = node[i] // 8
            node[i] = parent
            sum_tree[offsets[level] + parent] = _nb_block_sum(sum_tree, start + 8 * parent)


@numba.njit(cache=True, nogil=True)
def _nb_set_priorities(
    sum_tree: Any,
    min_tree: Any,
    offsets: Any,
    index: Any,
    priority: Any,
    filled: int,
    eps: float,
    alpha: float,
    vmax: float,
    pmax: float,
) -> tuple[int, int, float]:  # pragma: no cover
    # validate everything first: (0, -1, max) on success, else (code, position, 0).
    # ``filled`` must be <= the number of leaves (the caller's check): every index that
    # passes is a leaf. ``vmax`` is the largest finite value of the tree's dtype and
    # ``pmax`` (slightly below ``vmax ** (1 / alpha)``) the largest ``p + eps`` whose
    # value ``(p + eps) ** alpha`` stays below it: one compare instead of a power.
    n = index.shape[0]
    top = 0.0
    for i in range(n):
        p = priority[i]
        if index[i] < 0 or index[i] >= filled:
            return 1, i, 0.0
        if not np.isfinite(p):
            return 2, i, 0.0
        if p < 0:
            return 3, i, 0.0
        if not np.float64(p) + eps <= pmax:  # its value would be inf in the tree
            return 4, i, 0.0
        top = max(top, p)
    leaf0 = offsets[offsets.shape[0] - 1]
    width = min(8, sum_tree.shape[0] - leaf0)
    # the new total is at most the old one plus n times the largest new value: only
    # near the top of the dtype can it overflow, and only then are old leaves kept
    bound = np.float64(sum_tree[7]) + n * (top + eps) ** alpha if n else 0.0
    careful = not bound <= 0.999 * vmax
    if careful:
        old = np.empty(n, sum_tree.dtype)
        for i in range(n):
            old[i] = sum_tree[leaf0 + index[i]]
    for i in range(n):  # sequential: the last duplicate wins
        sum_tree[leaf0 + index[i]] = (np.float64(priority[i]) + eps) ** alpha
    _nb_refresh_sums(sum_tree, offsets, index)
    if careful and not np.isfinite(sum_tree[7]):  # the total overflowed: undo
        for i in range(n - 1, -1, -1):  # backwards: a duplicate gets its first old value
            sum_tree[leaf0 + index[i]] = old[i]
        _nb_refresh_sums(sum_tree, offsets, index)
        return 5, 0, 0.0
    min_offsets = _nb_min_offsets(offsets)
    min_leaf0 = min_offsets[min_offsets.shape[0] - 1]
    for i in range(n):
        block = index[i] // 8
        base = leaf0 + width * block
        m = np.inf  # the smallest positive value of the block (a line read just above)
        for c in range(width):
            v = sum_tree[base + c]
            if 0 < v < m:
                m = v
        if min_tree[min_leaf0 + block] != m:
            min_tree[min_leaf0 + block] = m
            parent = block
            for level in range(min_offsets.shape[0] - 2, -1, -1):
                parent //= 8
                base = min_offsets[level + 1] + 8 * parent
                m = min_tree[base]
                for c in range(1, 8):
                    m = min(m, min_tree[base + c])
                if min_tree[min_offsets[level] + parent] == m:
                    break  # above an unchanged minimum the path is settled
                min_tree[min_offsets[level] + parent] = m
    return 0, -1, top


@numba.njit(cache=True, nogil=True)
def _nb_find(tree: Any, offsets: Any, targets: Any, out: Any) -> None:  # pragma: no cover
    n = targets.shape[0]
    remaining = targets.copy()
    prefix = np.empty(9, np.float64)  # prefix[c]: the mass of the children before c
    prefix[0] = 0.0
    for i in range(n):
        out[i] = 0
    for level in range(offsets.shape[0] - 1):  # level-major: the walks' loads overlap
        start = offsets[level + 1]
        for i in range(n):
            base = start + 8 * out[i]
            r = remaining[i]
            # branch-free: count the children whose inclusive prefix is <= r (a zero
            # child repeats its prefix, so it is skipped); a random target would make
            # an early exit mispredict about once per level
            acc = 0.0
            chosen = 0
            for c in range(8):
                acc += tree[base + c]
                prefix[c + 1] = acc
                chosen += acc <= r
            if chosen == 8:  # rounded up to the total: the last positive child
                chosen = 7
                while chosen > 0 and tree[base + chosen] <= 0:
                    chosen -= 1
            remaining[i] = r - prefix[chosen]
            out[i] = 8 * out[i] + chosen


@numba.njit(cache=True, nogil=True)
def _nb_draw(
    sum_tree: Any,
    offsets: Any,
    min_root: float,
    targets: Any,
    beta: float,
    index: Any,
    weight: Any,
) -> None:  # pragma: no cover
    _nb_find(sum_tree, offsets, targets, index)
    leaf0 = offsets[offsets.shape[0] - 1]
    for i in range(index.shape[0]):
        weight[i] = (sum_tree[leaf0 + index[i]] / min_root) ** -beta


# Entry points over raw addresses (``tensor.data_ptr()``) of contiguous CPU tensors, checked
# by their caller (``CpuTrees``). A ``.numpy()`` view per argument costs ~0.8 us, and measured,
# slows the kernel that follows by ~3 us more: more than the tree work it saves on 256 items.
_nb_voidptr: Any = voidptr


@numba.njit(cache=True, nogil=True)
def _nb_set_one(
    sum_tree: Any,
    min_tree: Any,
    offsets: Any,
    slot: int,
    priority: float,
    filled: int,
    eps: float,
    alpha: float,
    vmax: float,
    pmax: float,
) -> tuple[int, int, float]:  # pragma: no cover
    # _nb_set_priorities of one slot (the per-step add): a slot and a priority to pass
    # instead of two arrays to fill and type (~0.35 us of a ~1.4 us call)
    index = np.empty(1, np.int64)
    index[0] = slot
    prio = np.empty(1, np.float64)
    prio[0] = priority
    return _nb_set_priorities(
        sum_tree, min_tree, offsets, index, prio, filled, eps, alpha, vmax, pmax
    )


@numba.njit(cache=True, nogil=True)
def _nb_set_priorities_at(
    sum_tree: Any,
    min_tree: Any,
    offsets: Any,
    index_address: int,
    priority_address: int,
    n: int,
    priority_is_f64: bool,
    filled: int,
    eps: float,
    alpha: float,
    vmax: float,
    pmax: float,
) -> tuple[int, int, float]:  # pragma: no cover
    # the caller guarantees: both addresses hold n contiguous items of these dtypes
    index = numba.carray(_nb_voidptr(index_address), (n,), np.int64)
    if priority_is_f64:
        p64 = numba.carray(_nb_voidptr(priority_address), (n,), np.float64)
        return _nb_set_priorities(
            sum_tree, min_tree, offsets, index, p64, filled, eps, alpha, vmax, pmax
        )
    p32 = numba.carray(_nb_voidptr(priority_address), (n,), np.float32)
    return _nb_set_priorities(
        sum_tree, min_tree, offsets, index, p32, filled, eps, alpha, vmax, pmax
    )


@numba.njit(cache=True, nogil=True)
def _nb_draw_at(
    sum_tree: Any,
    offsets: Any,
    min_root: float,
    uniform_address: int,
    n: int,
    total: float,
    beta: float,
    index_address: int,
    weight_address: int,
) -> None:  # pragma: no cover
    targets = numba.carray(_nb_voidptr(uniform_address), (n,), np.float64) * total
    index = numba.carray(_nb_voidptr(index_address), (n,), np.int64)
    weight = numba.carray(_nb_voidptr(weight_address), (n,), np.float32)
    _nb_draw(sum_tree, offsets, min_root, targets, beta, index, weight)
