"""Slice priority updates as pure functions: items of drawn slices -> one priority per start.

``update_priority`` of :class:`~rbdata.samplers.PrioritizedSliceSampler` receives the flat
items of whole slices (``[num_slices * slice_len]``, each slice's steps in order, as a draw
returns them) and one priority per item. A slice's priority is the **largest** priority of its
real items (padding, which repeats the slice's last slot, is left out) and is stored at the
slice's start slot (its first item); of two slices with the same start, the last one wins.
Every function here is vectorised torch ops, with no host read of device values.
"""

from __future__ import annotations

from typing import Any

import torch

from rbdata.samplers._prioritized_checks import check_state_capacity
from rbdata.samplers._trees import sumtree as _sumtree
from rbdata.samplers._trees.backend import TreeBackend, TreeSpec, refusal, values_of
from rbdata.samplers._trees.cpu import CpuTrees

__all__ = [
    "apply",
    "check",
    "check_on_host",
    "checked_state",
    "reduce_slices",
    "refuse_on_device",
    "trees_of",
]


def reduce_slices(
    items: torch.Tensor, p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Start slots and their priority (the largest over real items; duplicates: the last).

    ``items`` and ``p`` are ``[num_slices, slice_len]``. An item equal to the one before it in
    its slice is padding. Returns ``(starts, priority)``, where every copy of a duplicated start
    carries the priority of its last slice (so any write order stores the same value), and the
    largest priority over real items of each slice (before duplicates are resolved).

    Examples:
        >>> items = torch.tensor([[4, 5, 5], [7, 8, 9], [4, 5, 6]])
        >>> p = torch.tensor([[1.0, 3.0, 9.0], [2.0, 0.5, 1.0], [0.5, 0.25, 0.0]])
        >>> starts, winner, largest = reduce_slices(items, p)
        >>> starts.tolist(), winner.tolist(), largest.tolist()
        ([4, 7, 4], [0.5, 2.0, 0.5], [3.0, 2.0, 0.5])
    """
    pad = torch.zeros_like(items, dtype=torch.bool)
    pad[:, 1:] = items[:, 1:] == items[:, :-1]
    largest = p.masked_fill(pad, -torch.inf).amax(1)  # NaN propagates: refused later
    starts = items[:, 0].contiguous()
    if starts.shape[0] == 1:
        return starts, largest, largest
    order = torch.argsort(starts, stable=True)
    last = torch.searchsorted(starts[order], starts, right=True) - 1
    return starts, largest[order[last]], largest


def check_on_host(spec: TreeSpec, items: torch.Tensor, p: torch.Tensor, filled: int) -> None:
    """Raise ``ValueError`` (the prioritized sampler's wording) for a bad CPU update.

    Every item's index must be in ``[0, filled)`` and every priority finite, ``>= 0`` and
    small enough that ``(p + eps) ** alpha`` is finite in the trees' dtype.
    """
    flat_i, flat_p = items.reshape(-1), p.reshape(-1)
    checks = (
        (1, (flat_i < 0) | (flat_i >= filled)),
        (2, ~torch.isfinite(flat_p)),
        (3, flat_p < 0),
        (4, flat_p + spec.eps > spec.pmax),
    )
    for code, bad in checks:
        if bool(bad.any()):
            k = int(bad.to(torch.uint8).argmax())
            raise ValueError(refusal(spec, code, int(flat_i[k]), float(flat_p[k]), filled))


def refuse_on_device(
    items: torch.Tensor,
    p: torch.Tensor,
    filled: int,
    starts: torch.Tensor,
    values: torch.Tensor,
    total: torch.Tensor,
    vmax: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the device trees get, and whether the call is good (a device bool, no wait).

    A slice with a bad item (an index outside ``[0, filled)``, a NaN, infinite or negative
    priority) hands the trees that item's index and priority instead of its start and value,
    so the trees refuse the whole call with their own message; ``good`` is false then, and
    for values or a total the trees' dtype cannot hold (the trees refuse those too).
    """
    bad = (items < 0) | (items >= filled) | ~(p >= 0) | torch.isinf(p)
    row_bad = bad.any(1)
    first = bad.to(torch.uint8).argmax(1, keepdim=True)
    index = torch.where(row_bad, items.gather(1, first).squeeze(1), starts)
    passed = torch.where(row_bad, p.gather(1, first).squeeze(1), values)
    fits = (values <= vmax).all() & (total.double() + values.sum() <= 0.999 * vmax)
    return index, passed, ~row_bad.any() & fits


def trees_of(leaves: torch.Tensor, spec: TreeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """A sum tree with ``leaves`` (one per slot) and its block-min tree, built in one pass."""
    new_sum = _sumtree.new_tree(spec.capacity, "sum", spec.dtype, leaves.device)
    new_min = _sumtree.new_block_min_tree(spec.capacity, spec.dtype, leaves.device)
    leaf0 = _sumtree.leaf_offset(new_sum)
    new_sum[leaf0 : leaf0 + spec.capacity] = leaves.to(spec.dtype)
    _sumtree.rebuild(new_sum, new_min)
    return new_sum, new_min


def checked_state(state: dict[str, Any], spec: TreeSpec) -> tuple[torch.Tensor, float]:
    """A saved state's start priorities (float64) and highest priority, checked.

    Raises:
        ValueError: for another capacity, priorities of another shape or kind, NaN,
            infinite, negative or overflowing priorities.
    """
    check_state_capacity(state, spec.capacity)
    prio = torch.as_tensor(state["priority"])
    if prio.shape != (spec.capacity,) or not prio.is_floating_point():
        raise ValueError(
            f"state: priority is {prio.dtype} {tuple(prio.shape)}, expected "
            f"{spec.capacity} floating priorities"
        )
    prio = prio.double()
    if not bool((torch.isfinite(prio) & (prio >= 0)).all()):
        raise ValueError("state: priority holds NaN, infinite or negative values")
    max_p = float(state["max_priority"])
    bound = spec.pmax - spec.eps
    if not (0 <= max_p <= bound) or bool((prio > bound).any()):
        raise ValueError(f"state: priorities above {bound:.4g} overflow the tree's dtype")
    return prio, max_p


def check(
    trees: TreeBackend,
    spec: TreeSpec,
    span: torch.Tensor,
    items: torch.Tensor,
    p: torch.Tensor,
    filled: int,
) -> None:
    """Raise the ``ValueError`` that :func:`apply` would raise (or refuse on the device).

    Nothing changes; on a device it waits for the values. ``items``/``p`` as for
    :func:`apply`.
    """
    check_on_host(spec, items, p, filled)
    starts, winner, _ = reduce_slices(items, p)
    safe = starts.clamp(0, max(filled - 1, 0))
    values = torch.where(span[safe] > 0, values_of(winner, spec), 0.0)
    trees.check(starts, values, filled)


def apply(
    trees: TreeBackend,
    spec: TreeSpec,
    prio: torch.Tensor,
    max_p: torch.Tensor,
    span: torch.Tensor,
    items: torch.Tensor,
    p: torch.Tensor,
    filled: int,
) -> torch.Tensor:
    """Store the slices' start priorities in ``prio`` and their masses in ``trees``.

    ``items``/``p`` are ``[num_slices, slice_len]``; ``span`` (per slot, 0: not a valid start)
    decides which starts get mass. CPU trees: a bad call raises ``ValueError`` and changes
    nothing. Device trees: it is refused on the device (``prio`` and the trees keep their
    values) and reported by a later call. Returns the new highest priority seen.
    """
    deferred = not isinstance(trees, CpuTrees)
    if not deferred:
        check_on_host(spec, items, p, filled)
    starts, winner, largest = reduce_slices(items, p)
    safe = starts.clamp(0, max(filled - 1, 0))
    values = torch.where(span[safe] > 0, values_of(winner, spec), 0.0)
    if not deferred:
        trees.set(starts, values, filled)  # raises (changing nothing) on overflow
        prio[starts] = winner
        return torch.maximum(max_p, largest.max())
    root = trees.sum_tree[_sumtree.ROOT]
    index, passed, good = refuse_on_device(items, p, filled, starts, values, root, spec.vmax)
    trees.set(index, passed, filled)
    prio[safe] = torch.where(good, winner, prio[safe])
    return torch.where(good, torch.maximum(max_p, largest.max()), max_p)
