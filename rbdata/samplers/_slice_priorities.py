"""Per-item priorities of :class:`~rbdata.samplers.PrioritizedSliceSampler` and their slices.

Priorities are **per item** (per storage slot), as for
:class:`~rbdata.samplers.PrioritizedSampler`: ``update_priority`` takes any set of indices,
one priority each (duplicates: the last one wins). The tree holds one mass per slot: at a
valid slice start ``s`` (its span, the slice's real steps, is positive), the value
``(q + eps) ** alpha`` of the slice's priority ``q``, an aggregate of its items' priorities
chosen by ``slice_priority``:

- ``"start"`` (torchrl's rule): the priority of the start item, ``q = p[s]``;
- ``"max"``: the largest priority of the slice's real items (padding, which repeats the
  last one, is left out);
- ``"mean"``: their mean.

Every other slot has mass 0. An item update re-derives the masses of the starts whose slices
can cover an updated item: the item's own slot, and for ``"max"``/``"mean"`` the
``slice_len - 1`` slots before it (around the ring). Everything here is vectorised torch ops
on the trees' device, with no host read of device values but on the error path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rbdata._core.shown import shown
from rbdata.samplers._prioritized_checks import check_state_capacity
from rbdata.samplers._priority_input import device_index_and_priority, index_and_priority
from rbdata.samplers._slice_kernels import AGGREGATES, _nb_update_items
from rbdata.samplers._trees import sumtree as _sumtree
from rbdata.samplers._trees.backend import TreeBackend, TreeSpec, item_codes, refused, values_of
from rbdata.samplers._trees.cpu import CpuTrees

__all__ = [
    "SLICE_PRIORITIES",
    "ItemPriorities",
    "check_slice_priority",
    "checked_state",
    "covering_starts",
    "last_wins",
    "slice_priority_of",
    "trees_of",
]

#: the aggregates a slice's priority can be taken with
SLICE_PRIORITIES = ("start", "max", "mean")
#: starts whose masses a full rebuild computes at once (rows of ``slice_len`` items)
_REBUILD_ITEMS = 1 << 21


def check_slice_priority(value: Any) -> str:
    """The ``slice_priority`` option, checked.

    Examples:
        >>> check_slice_priority("max")
        'max'
        >>> check_slice_priority("sum")
        Traceback (most recent call last):
        ...
        ValueError: slice_priority must be one of 'start', 'max', 'mean', got 'sum'
    """
    if not isinstance(value, str) or value not in SLICE_PRIORITIES:
        names = ", ".join(repr(n) for n in SLICE_PRIORITIES)
        raise ValueError(f"slice_priority must be one of {names}, got {shown(value)}")
    return value


def last_wins(idx: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``p`` with every copy of a duplicated index carrying the priority of its last copy.

    So a scatter ``prio[idx] = last_wins(idx, p)`` stores the same value whatever order the
    writes land in (on a GPU duplicates land in any order).

    Examples:
        >>> last_wins(torch.tensor([4, 7, 4, 4]), torch.tensor([1.0, 2.0, 3.0, 5.0])).tolist()
        [5.0, 2.0, 5.0, 5.0]
    """
    if idx.shape[0] < 2:
        return p
    order = torch.argsort(idx, stable=True)
    last = torch.searchsorted(idx[order], idx, right=True) - 1
    return p[order[last]]


def covering_starts(
    slots: torch.Tensor, length: int, how: str, capacity: int, filled: int
) -> torch.Tensor:
    """The start slots whose slice of ``length`` items can hold one of ``slots``.

    ``"start"``: the slots themselves. ``"max"``/``"mean"``: each slot and the ``length - 1``
    before it around the ring of ``capacity`` slots (``[length, n]`` flattened, the slots
    themselves first); one that is not filled (``>= filled``) is replaced by the slot itself,
    a duplicate (the caller writes the same mass twice).

    Examples:
        >>> covering_starts(torch.tensor([5, 0]), 3, "max", 8, 8).tolist()
        [5, 0, 4, 7, 3, 6]
        >>> covering_starts(torch.tensor([5, 0]), 3, "max", 8, 6).tolist()
        [5, 0, 4, 0, 3, 0]
    """
    if how == "start" or length == 1:
        return slots
    back = torch.arange(length, device=slots.device).unsqueeze(1)
    starts = (slots.unsqueeze(0) - back).remainder_(capacity)
    return torch.where(starts < filled, starts, slots.unsqueeze(0)).reshape(-1)


def slice_priority_of(
    prio: torch.Tensor, starts: torch.Tensor, span: torch.Tensor, length: int, how: str
) -> torch.Tensor:
    """The priority of the slice starting at each of ``starts`` (any value where no slice).

    ``prio`` holds every slot's item priority, ``span`` every slot's real steps (0: not a
    start); the slice starting at ``s`` holds the slots ``(s + j) % capacity``, ``j < span``.

    Examples:
        >>> prio = torch.tensor([1.0, 4.0, 2.0, 0.0, 3.0], dtype=torch.float64)
        >>> span = torch.tensor([3, 3, 0, 0, 2], dtype=torch.int32)
        >>> starts = torch.tensor([0, 1, 4])
        >>> [slice_priority_of(prio, starts, span, 3, h).tolist() for h in ("start", "max")]
        [[1.0, 4.0, 3.0], [4.0, 4.0, 3.0]]
        >>> slice_priority_of(prio, starts, span, 3, "mean").tolist()  # 4: slots 4 and 0
        [2.3333333333333335, 2.0, 2.0]
    """
    if how == "start" or length == 1:
        return prio[starts]
    real = span[starts].long().clamp_(min=1).unsqueeze(1)
    steps = torch.arange(length, device=starts.device)
    items = (starts.unsqueeze(1) + steps).remainder_(prio.shape[0])
    p = prio[items].masked_fill_(steps >= real, 0.0)  # priorities are >= 0
    if how == "max":
        return p.amax(1)
    total = p[:, 0].clone()
    for j in range(1, length):  # a sequential sum, as the CPU kernel adds
        total += p[:, j]
    return total / real.squeeze(1)


def trees_of(leaves: torch.Tensor, spec: TreeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """A sum tree with ``leaves`` (one per slot) and its block-min tree, built in one pass."""
    new_sum = _sumtree.new_tree(spec.capacity, "sum", spec.dtype, leaves.device)
    new_min = _sumtree.new_block_min_tree(spec.capacity, spec.dtype, leaves.device)
    leaf0 = _sumtree.leaf_offset(new_sum)
    new_sum[leaf0 : leaf0 + spec.capacity] = leaves.to(spec.dtype)
    _sumtree.rebuild(new_sum, new_min)
    return new_sum, new_min


def checked_state(state: dict[str, Any], spec: TreeSpec) -> tuple[torch.Tensor, float]:
    """A saved state's item priorities (float64) and highest priority, checked.

    A state saved before priorities were per item holds each slot's *start* priority in the
    same field; it loads as the items' priorities (with ``slice_priority="start"`` the
    masses are those the saved sampler had).

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


def _refuse_on_host(spec: TreeSpec, idx: torch.Tensor, p: torch.Tensor, filled: int) -> None:
    """Raise the ``ValueError`` of the first bad item (the prioritized sampler's wording)."""
    code = item_codes(spec, idx, p, filled)
    bad = code != 0
    if bool(bad.any()):
        k = int(bad.to(torch.uint8).argmax())
        raise refused(spec, int(code[k]), int(idx[k]), float(p[k]), filled)


class ItemPriorities:
    """Every slot's item priority, the highest seen, and the slice masses derived from them.

    The object a :class:`~rbdata.samplers.PrioritizedSliceSampler` holds: it owns the
    priorities and their updates; the sampler owns the episode index (the spans, passed in)
    and the trees (passed in), whose spec stores masses as given (``alpha`` 1, ``eps`` 0).

    Args:
        spec: the sampler's spec (its ``alpha``, ``eps`` and the trees' dtype).
        how: the slice aggregate (``"start"``, ``"max"`` or ``"mean"``).
        device: where the priorities live (the trees' device).
        initial_max: the initial "highest priority seen so far".
    """

    def __init__(self, spec: TreeSpec, how: str, device: torch.device, initial_max: float):
        self.spec = spec
        self.how = check_slice_priority(how)
        self.initial_max = initial_max
        #: every slot's item priority (float64)
        self.prio = torch.zeros(spec.capacity, dtype=torch.float64, device=device)
        #: the highest priority seen so far (a 0-d device tensor: no host wait)
        self.max_p = torch.full((), initial_max, dtype=torch.float64, device=device)
        self._mark: np.ndarray | None = None  # the CPU kernel's scratch, made at first use

    def to(self, device: torch.device) -> None:
        """Move the priorities to ``device``."""
        self.prio, self.max_p = self.prio.to(device), self.max_p.to(device)

    def reset(self) -> None:
        """Forget every priority."""
        self.prio.zero_()
        self.max_p = torch.full((), self.initial_max, dtype=torch.float64, device=self.prio.device)

    def load(self, prio: torch.Tensor, max_p: float) -> None:
        """Replace the priorities (checked by :func:`checked_state`)."""
        self.prio.copy_(prio)
        self.max_p = torch.full((), max_p, dtype=torch.float64, device=self.prio.device)

    def fill_new(self, slots: torch.Tensor, priority: float | None) -> None:
        """Give new items ``priority`` (``None``: the highest seen so far)."""
        self.prio.index_fill_(0, slots, self.max_p if priority is None else priority)

    def masses(self, starts: torch.Tensor, span: torch.Tensor, length: int) -> torch.Tensor:
        """The tree masses at ``starts``: the slice priority's value at valid starts, else 0."""
        q = slice_priority_of(self.prio, starts, span, length, self.how)
        return torch.where(span[starts] > 0, values_of(q, self.spec), 0.0)

    def all_masses(self, span: torch.Tensor, length: int) -> torch.Tensor:
        """Every slot's mass (a full rebuild, in blocks of bounded memory)."""
        capacity = self.spec.capacity
        if self.how == "start" or length == 1:
            return torch.where(span > 0, values_of(self.prio, self.spec), 0.0)
        out = torch.empty_like(self.prio)
        step = max(1, _REBUILD_ITEMS // length)
        for lo in range(0, capacity, step):
            starts = torch.arange(lo, min(lo + step, capacity), device=self.prio.device)
            out[lo : lo + step] = self.masses(starts, span, length)
        return out

    def _marks(self) -> np.ndarray:
        """The CPU kernel's scratch: one byte per slot, all 0 between calls."""
        mark = self._mark
        if mark is None:
            mark = self._mark = np.zeros(self.spec.capacity, np.uint8)
        return mark

    def _input(self, index: Any, priority: Any) -> tuple[torch.Tensor, torch.Tensor]:
        idx, p = device_index_and_priority(index, priority, self.prio.device)
        return idx, p.double()

    def check(
        self,
        trees: TreeBackend,
        span: torch.Tensor,
        index: Any,
        priority: Any,
        filled: int,
        length: int,
    ) -> None:
        """Raise the ``ValueError`` :meth:`update` would raise; change nothing (waits)."""
        idx, p = self._input(index, priority)
        if idx.shape[0] == 0:
            return
        _refuse_on_host(self.spec, idx, p, filled)
        old = self.prio[idx]
        self.prio[idx] = last_wins(idx, p)
        try:
            starts = covering_starts(idx, length, self.how, self.spec.capacity, filled)
            trees.check(starts, self.masses(starts, span, length), filled)
        finally:
            self.prio[idx] = old

    def update(
        self,
        trees: TreeBackend,
        span: torch.Tensor,
        index: Any,
        priority: Any,
        filled: int,
        length: int,
    ) -> None:
        """Set the items' priorities and re-derive the masses of the starts covering them.

        CPU trees: a bad call raises ``ValueError`` and changes nothing. Device trees: it is
        refused on the device (priorities and trees keep their values) and reported by a
        later call, as for :class:`~rbdata.samplers.PrioritizedSampler`.
        """
        if isinstance(trees, CpuTrees):
            self._update_host(trees, span, index, priority, filled, length)
            return
        idx, p = self._input(index, priority)
        if idx.shape[0]:
            self._update_device(trees, span, idx, p, filled, length)

    def _update_host(
        self,
        trees: TreeBackend,
        span: torch.Tensor,
        index: Any,
        priority: Any,
        filled: int,
        length: int,
    ) -> None:
        """One numba kernel (:mod:`._slice_kernels`) checks, writes and lists the starts."""
        idx, p = index_and_priority(index, priority)
        n = idx.shape[0]
        if n == 0:
            return
        spec, prio = self.spec, self.prio.numpy()
        old = np.empty(n, np.float64)
        reach = n * length
        starts, q = np.empty(reach, np.int64), np.empty(reach, np.float64)
        code, pos, m = _nb_update_items(
            prio,
            span.numpy(),
            idx,
            p,
            filled,
            spec.eps,
            spec.pmax,
            length,
            AGGREGATES[self.how],
            old,
            starts,
            q,
            self._marks(),
        )
        if code:
            raise refused(spec, code, int(idx[pos]), float(p[pos]), filled)
        q_t = torch.from_numpy(q[:m])
        masses = torch.where(q_t >= 0, values_of(q_t.clamp(min=0.0), spec), 0.0)
        try:
            trees.set(torch.from_numpy(starts[:m]), masses, filled)  # overflow: raises
        except ValueError:
            prio[idx] = old  # duplicates carry the same old value
            raise
        top = float(p.max())
        if top > float(self.max_p):
            self.max_p = torch.full((), top, dtype=torch.float64)

    def _update_device(
        self,
        trees: TreeBackend,
        span: torch.Tensor,
        idx: torch.Tensor,
        p: torch.Tensor,
        filled: int,
        length: int,
    ) -> None:
        """Checked on the device: a bad item hands the trees its own index and priority.

        The trees then refuse the whole call with their message (an item whose value
        overflows hands its value, refused as such); the priorities are written only when
        every item is good and the total fits (the trees' own bound).
        """
        spec = self.spec
        if filled == 0:  # no slot to update: refused here, a wait on the error path only
            raise refused(spec, 1, int(idx[0]), 0.0, filled)
        code = item_codes(spec, idx, p, filled)
        bad = code != 0
        safe = idx.clamp(0, filled - 1)
        old = self.prio[safe]
        self.prio[safe] = torch.where(bad.any(), old, last_wins(idx, p))
        starts = covering_starts(safe, length, self.how, spec.capacity, filled)
        masses = self.masses(starts, span, length)
        n = idx.shape[0]
        own = torch.where(code == 4, values_of(p.clamp(min=0.0), spec), p)
        index = torch.cat([torch.where(bad, idx, starts[:n]), starts])
        value = torch.cat([torch.where(bad, own, masses[:n]), masses])
        total = trees.sum_tree[_sumtree.ROOT].double() + value.sum()
        good = ~bad.any() & (total <= 0.999 * spec.vmax)
        self.prio[safe] = torch.where(good, self.prio[safe], old)
        trees.set(index, value, filled)
        self.max_p = torch.where(good, torch.maximum(self.max_p, p.max()), self.max_p)
