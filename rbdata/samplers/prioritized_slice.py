"""``PrioritizedSliceSampler``: slices whose start is drawn by the priorities of their items.

:class:`~rbdata.samplers.SliceSampler`'s episode index plus :class:`PrioritizedSampler`'s tree
backend (:mod:`rbdata.samplers._trees`), one leaf per slot: at a valid start, the value of its
slice's priority, taken from its items' priorities (an ``ItemPriorities`` of
:mod:`._slice_priorities` holds and updates them), else 0. A write re-derives validity
(:mod:`._slice_starts`) only for the times it can change (the new steps, the ``slice_len - 1``
before them, the ring's new head); a draw is one tree walk per slice. The backend stores
values (its ``alpha`` is 1, its ``eps`` 0); the sampler's exponent and offset are applied
before.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

import numpy as np
import torch

from rbdata._core.torchrl_names import PRIORITIZED_SLICE_KEYWORDS, torchrl_keywords
from rbdata.samplers import _prioritized_checks as _checks
from rbdata.samplers import _slice_starts
from rbdata.samplers._priority_input import capacity_and_source, check_exponent
from rbdata.samplers._slice_priorities import ItemPriorities, checked_state, trees_of
from rbdata.samplers._trees import sumtree as _sumtree
from rbdata.samplers._trees.backend import TreeSpec
from rbdata.samplers._trees.cpu import CpuTrees
from rbdata.samplers.base import check_bool
from rbdata.samplers.prioritized import _make_trees
from rbdata.samplers.slice import SliceSampler

__all__ = ["PrioritizedSliceSampler"]


class PrioritizedSliceSampler(SliceSampler):
    """Slices of ``slice_len`` steps whose start is drawn by the priorities of their items.

    **Priorities.** Priorities are **per item**, as for
    :class:`~rbdata.samplers.PrioritizedSampler`: each storage slot holds one. A slice's
    priority ``q`` is taken from its items' by ``slice_priority``: ``"start"`` (the default,
    torchrl's rule) the priority of its start item; ``"max"`` the largest and ``"mean"`` the
    mean over its real items (padding, which repeats a short slice's last step, is left
    out). A valid start (its ``slice_len`` steps retained and in one episode; with
    ``strict_length=False`` also the first step of a shorter episode) is drawn with
    probability ``P(s) = v_s / sum_j v_j``, ``v_s = (q_s + eps) ** alpha``, the sum over
    valid starts; every other slot has no mass and is never drawn, also right after writes
    that end or extend an episode and after the ring overwrites old steps. New steps get the
    highest priority seen so far (or ``default_priority``).

    **Weights.** Each slice carries ``w = (N * P(s)) ** -beta / max_j (N * P(j)) ** -beta``,
    ``N`` the number of valid starts with a positive value (it cancels: ``w = (v_s / v_min)
    ** -beta``, ``v_min`` the smallest positive value), repeated on the slice's items as
    ``"weight"``.

    **Updates.** ``update_priority(index, p)`` takes any set of items, in any order, with
    one priority each (or one for all): ``update_priority(batch["index"], td_error)`` after
    a draw, ``update_priority(torch.arange(n), p)`` for every item. Of duplicated indices the
    last one wins. Each start whose slice holds an updated item gets its mass re-derived
    (for ``"start"`` the item's own slot; for ``"max"``/``"mean"`` also the ``slice_len - 1``
    slots before it). A bad call (an index outside the filled range; a NaN, infinite or
    negative priority) raises ``ValueError`` and changes nothing; on device trees it is
    refused on the device and raised by a later call or by :meth:`check_errors`, as for
    :class:`~rbdata.samplers.PrioritizedSampler`.

    Like every sampler it takes its storage first (``PrioritizedSliceSampler(storage, alpha,
    beta, slice_len=8)``: the capacity is the storage's), or the capacity
    (``PrioritizedSliceSampler(capacity, alpha, beta, ...)``, bound by the buffer), as
    :class:`~rbdata.samplers.PrioritizedSampler` does.

    Args:
        capacity: number of slots (at least the storage's capacity), or the storage itself
            (its capacity, and ``data_source``).
        alpha: prioritization exponent (0: uniform over valid starts).
        beta: importance-sampling exponent (0: no correction).
        data_source: the storage (``None``: bound by the buffer).
        slice_len: steps per slice.
        num_slices: slices per batch (the slice length then comes from the batch size; the
            tree's masses are rebuilt, once, when it changes).
        end_key: key of the per-step end flag.
        traj_key: key of a per-step episode id, used instead of ``end_key`` when given.
        strict_length: skip episodes shorter than ``slice_len`` (else: whole, padded, with
            ``"mask"``).
        slice_priority: a slice's priority from its items': ``"start"``, ``"max"`` or
            ``"mean"``.
        eps: added to every priority before ``alpha``.
        device: where the trees live; ``None`` follows the storage.
        generator: random generator (``None``: a private one seeded from torch's global RNG).
        stratified: one draw per equal-mass segment of the total.
        default_priority: priority of new steps (``None``: the highest seen so far).
        max_priority: the initial "highest priority seen so far".
        dtype: the trees' dtype (``float32`` or ``float64``).

    Examples:
        >>> import torch
        >>> from rbdata import ReplayBuffer, TensorStorage
        >>> storage = TensorStorage(100)
        >>> sampler = PrioritizedSliceSampler(storage, 1.0, 0.5, slice_len=3, eps=0.0)
        >>> rb = ReplayBuffer(storage, sampler=sampler)
        >>> done = torch.zeros(10, 1, dtype=torch.bool)
        >>> done[4] = done[9] = True  # two episodes of 5 steps: starts 0-2 and 5-7
        >>> _ = rb.extend({"t": torch.arange(10), "next": {"done": done}})
        >>> rb.update_priority(torch.arange(10), torch.arange(10.0))  # every item its own
        >>> sampler.priority_values([0, 2, 3, 7]).tolist()  # starts: their item's priority
        [0.0, 2.0, 0.0, 7.0]
        >>> batch = rb.sample(6)  # two slices
        >>> rb.update_priority(batch["index"], torch.zeros(6))  # those items: priority 0
        >>> maxed = PrioritizedSliceSampler(storage, 1.0, 0.5, slice_len=3, slice_priority="max")
        >>> maxed.update_priority([5, 6, 7], [0.5, 2.0, 1.0])
        >>> maxed.priority_values([5, 6]).tolist()  # start 5 holds 5-7, start 6 holds 6-8
        [2.0, 2.0]
    """

    @torchrl_keywords(PRIORITIZED_SLICE_KEYWORDS)
    def __init__(
        self,
        capacity: int | Sized,
        alpha: float,
        beta: float,
        *,
        data_source: Sized | None = None,
        slice_len: int | None = None,
        num_slices: int | None = None,
        end_key: str | tuple[str, ...] = ("next", "done"),
        traj_key: str | tuple[str, ...] | None = None,
        strict_length: bool = True,
        slice_priority: str = "start",
        eps: float = 1e-8,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
        stratified: bool = False,
        default_priority: float | None = None,
        max_priority: float = 1.0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        capacity, data_source = capacity_and_source(
            capacity, data_source, "PrioritizedSliceSampler"
        )
        self._spec = _checks.tree_spec(capacity, alpha, eps, dtype)
        self.capacity = self._spec.capacity
        self.beta = check_exponent(beta, "beta")
        self.stratified = check_bool(stratified, "stratified")
        self.default_priority, self._initial_max = _checks.priority_options(
            self._spec, default_priority, max_priority
        )
        self._device_arg = None if device is None else str(torch.device(device))
        self.device = _checks.tree_device(device, data_source)
        self._own_generator = generator is None
        #: the backend stores values: no exponent, no offset (applied here)
        self._values_spec = TreeSpec(self.capacity, 1.0, 0.0, self._spec.dtype)
        self._trees = _make_trees(self._values_spec, self.device, 0.0)
        self._span = np.zeros(self.capacity, np.int32)  # per slot: real steps, 0: no start
        self._span_t = self._span_view()
        #: every item's priority and the slice masses derived from them
        self._items = ItemPriorities(self._spec, slice_priority, self.device, self._initial_max)
        self._count = 0  # valid starts for _mask_len
        #: the slice length the tree's masses are for (``None``: no masses, spans all 0)
        self._mask_len: int | None = None
        super().__init__(
            data_source,
            slice_len=slice_len,
            num_slices=num_slices,
            end_key=end_key,
            traj_key=traj_key,
            strict_length=strict_length,
            generator=generator,
        )
        self._match_generator()
        if data_source is not None:
            self.check_source(data_source)

    @property
    def slice_priority(self) -> str:
        """How a slice's priority is taken from its items' (``"start"``, ``"max"``, ``"mean"``)."""
        return self._items.how

    @property
    def alpha(self) -> float:
        """The prioritization exponent."""
        return self._spec.alpha

    @property
    def eps(self) -> float:
        """Added to every priority before ``alpha``."""
        return self._spec.eps

    # --- placement ----------------------------------------------------------------------
    def _span_view(self) -> torch.Tensor:
        """The spans where the trees are: a view of the host table on CPU, else a copy."""
        span = torch.from_numpy(self._span)
        return span if self.device.type == "cpu" else span.to(self.device)

    def _match_generator(self) -> None:
        gen = self.generator
        if self._own_generator and gen.device.type != self.device.type:
            self.generator = torch.Generator(device=self.device).manual_seed(gen.initial_seed())

    def _place(self, device: torch.device) -> None:
        if device == self.device:
            return
        old = self._trees
        old.check_errors()
        trees = (old.sum_tree.to(device), old.min_tree.to(device))
        self._trees = _make_trees(self._values_spec, device, 0.0, trees)
        self._items.to(device)
        self.device = device
        self._span_t = self._span_view()
        self._match_generator()

    def check_source(self, storage: Sized) -> None:
        """Raise ``ValueError`` if ``storage`` can hold more items than the sampler has slots."""
        _checks.check_source_size(storage, self.capacity, "PrioritizedSliceSampler")

    def attach(self, storage: Sized) -> None:
        """Bind to a storage (trees follow its device when ``device=None``); index its steps."""
        self.check_source(storage)
        if self.data_source is None or self.data_source is storage:
            arg = None if self._device_arg is None else self.device
            self._place(_checks.tree_device(arg, storage))
        super().attach(storage)

    # --- the masses ---------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every episode and priority."""
        super().reset()
        self._trees.reset(0.0)
        self._span[:] = 0
        self._span_t = self._span_view()
        self._items.reset()
        self._count, self._mask_len = 0, self.slice_len

    def _filled(self) -> int:
        source = self.data_source
        return self.capacity if source is None else min(len(source), self.capacity)

    def _refresh(self, times: np.ndarray) -> None:
        """Re-derive the spans and masses of the slots of ``times`` (host episode index)."""
        length = self._mask_len
        assert length is not None and self._base is not None
        capacity = self._capacity
        spans = _slice_starts.spans(
            self._ends, self._time, capacity, length, self.strict_length, times
        )
        slots_np = (self._base + times) % capacity
        self._count += int(np.count_nonzero(spans)) - int(np.count_nonzero(self._span[slots_np]))
        self._span[slots_np] = spans
        slots, span = torch.from_numpy(slots_np), torch.from_numpy(spans)
        if self.device.type != "cpu":
            slots = slots.to(self.device, non_blocking=True)
            span = span.to(self.device, non_blocking=True)
            self._span_t[slots] = span
        self._trees.set(slots, self._items.masses(slots, self._span_t, length), self._filled())

    def _ensure(self, length: int) -> None:
        """Make the tree's masses those of slices of ``length`` steps (a full rebuild)."""
        if self._mask_len == length:
            return
        self._span[:] = 0
        self._count = 0
        if self._base is not None:
            times, spans = _slice_starts.all_spans(
                self._ends, self._time, self._capacity, length, self.strict_length
            )
            self._span[(self._base + times) % self._capacity] = spans
            self._count = int(np.count_nonzero(spans))
        self._span_t = self._span_view()
        new_sum, new_min = trees_of(self._items.all_masses(self._span_t, length), self._spec)
        self._trees.load(new_sum, new_min, 0.0)
        self._mask_len = length

    def check_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Refuse a write that breaks the time order, lacks the episode key, or overflows."""
        super().check_write(index, data)
        if isinstance(self._trees, CpuTrees):  # device trees check it on the device
            p = self.default_priority
            value = self._spec.value(float(self._items.max_p) if p is None else p)
            self._trees.check_new(index, value)

    def on_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Index the new steps, give them the default priority and re-derive the masses."""
        old_time = self._time
        super().on_write(index, data)
        time = self._time
        if time == old_time:
            return
        assert self._base is not None
        capacity = self._capacity
        new = np.arange(max(old_time, time - capacity), time, dtype=np.int64)
        slots = torch.from_numpy((self._base + new) % capacity).to(self.device, non_blocking=True)
        self._items.fill_new(slots, self.default_priority)
        if self._mask_len is not None:
            self._refresh(_slice_starts.refresh_window(old_time, time, capacity, self._mask_len))

    # --- priorities ---------------------------------------------------------------------
    @property
    def max_priority(self) -> float:
        """The highest priority seen so far (reading it waits for a CUDA device)."""
        return float(self._items.max_p)

    def total(self) -> float:
        """The sum of the masses of the valid starts (on CUDA: waits for the GPU)."""
        return self._trees.total()

    def min(self) -> float:
        """The smallest positive mass, ``inf`` if none (on CUDA: waits for the GPU)."""
        return self._trees.min()

    def priorities(self, index: Any = None) -> torch.Tensor:
        """The item priorities at ``index`` (default: every slot)."""
        prio = self._items.prio
        return prio.clone() if index is None else prio[torch.as_tensor(index)]

    def priority_values(self, index: Any = None) -> torch.Tensor:
        """The tree's masses at ``index``: ``(q + eps) ** alpha`` at valid starts, else 0.

        ``q`` is the priority of the slice starting there (``slice_priority``).
        """
        self._trees.apply_pending()
        leaf0 = _sumtree.leaf_offset(self._trees.sum_tree)
        leaves = self._trees.sum_tree[leaf0 : leaf0 + self.capacity]
        return leaves.clone() if index is None else leaves[torch.as_tensor(index)]

    def check_errors(self) -> None:
        """Raise the error of a call refused on the device (see ``PrioritizedSampler``)."""
        self._trees.check_errors()

    def _index_source(self) -> None:
        """Index the episodes of a storage given at construction, at its first use."""
        if self._base is None and self._unindexed:  # PrioritizedSliceSampler(filled_storage)
            self.attach(self.data_source)  # type: ignore[arg-type]

    def check_priority(self, index: Any, priority: Any) -> None:
        """Raise what ``update_priority`` would (see ``PrioritizedSampler``); change nothing."""
        self._index_source()
        length = self._mask_len or 1  # no length yet: no masses (every span is 0)
        self._items.check(self._trees, self._span_t, index, priority, self._filled(), length)

    def update_priority(self, index: Any, priority: Any) -> None:
        """Set the priorities of the items at ``index`` (any items; duplicates: the last wins).

        ``index`` and ``priority`` may be tensors, arrays, lists or scalars (a scalar
        priority applies to every index). The masses of the valid starts whose slices hold
        an updated item are re-derived (see the class notes). A bad call raises
        ``ValueError`` and changes nothing (on CUDA: raised by a later call or by
        :meth:`check_errors`).
        """
        self._index_source()
        length = self._mask_len or 1  # no length yet: no masses (every span is 0)
        self._items.update(self._trees, self._span_t, index, priority, self._filled(), length)

    # --- sampling -----------------------------------------------------------------------
    def _starts(self, num_slices: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        self._length()  # bound and non-empty
        self._index_source()
        self._ensure(length)
        if not self._count:
            raise ValueError(
                f"PrioritizedSliceSampler: no episode in the buffer has {length} steps "
                "(use strict_length=False to sample shorter ones)"
            )
        return self._trees.draw(num_slices, self.generator, self.beta, self.stratified)

    def draw_starts(self, num_slices: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The start slots of ``num_slices`` slices drawn by priority, and their weights.

        For implementers (:class:`~rbdata.samplers.SequenceSampler` draws its anchors so):
        the draw of :meth:`draw` for slices of ``slice_len`` steps, without the items.
        """
        if self.slice_len is None:
            raise ValueError("draw_starts needs a sampler built with slice_len")
        return self._starts(num_slices, self.slice_len)

    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Draw ``num_slices`` slices by start priority: flat items, ``"weight"`` per item."""
        num_slices, length = self._shape(batch_size)
        starts, weight = self._starts(num_slices, length)
        steps = torch.arange(length, device=starts.device)
        extras = {"slice": self._slice_ids(num_slices, length).to(starts.device)}
        if self.strict_length:
            offset = steps.expand(num_slices, length)
        else:
            span = self._span_t[starts].long().unsqueeze(1)
            offset = torch.minimum(steps, span - 1)
            extras["mask"] = (steps < span).reshape(-1)
        index = (starts.unsqueeze(1) + offset).remainder_(self._capacity).reshape(-1)
        extras["weight"] = weight.repeat_interleave(length)
        return index, extras

    # --- state --------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The trees travel as tensors; the backend and the span view are rebuilt on arrival."""
        trees, span = self._trees, self._span_t
        trees.apply_pending()
        del self.__dict__["_trees"], self.__dict__["_span_t"]
        try:
            self.__dict__.update(_sum=trees.sum_tree, _min=trees.min_tree)
            return super().__getstate__()
        finally:
            self.__dict__.pop("_sum"), self.__dict__.pop("_min")
            self._trees, self._span_t = trees, span

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        trees = self.__dict__.pop("_sum"), self.__dict__.pop("_min")
        trees = trees[0].to(self.device), trees[1].to(self.device)
        self._trees = _make_trees(self._values_spec, self.device, 0.0, trees)
        self._span_t = self._span_view()

    def config(self) -> dict[str, Any]:
        """The slice options, capacity, exponents, device and the other tree options."""
        return {
            **super().config(),
            **_checks.tree_options(self),
            "slice_priority": self.slice_priority,
        }

    def state_dict(self) -> dict[str, Any]:
        """The episode index, the generator, every item's priority and the highest seen."""
        state = super().state_dict()
        state.update(
            capacity=self.capacity,
            priority=self._items.prio.cpu().clone(),
            max_priority=float(self._items.max_p),
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (checked before anything changes).

        A state saved before priorities were per item (the same fields, holding each
        slot's start priority) loads as the items' priorities: with
        ``slice_priority="start"`` the sampler draws as the saved one did.
        """
        prio, max_p = checked_state(state, self._spec)
        gen = _checks.generator_of_state(state["generator"], self.generator, self.device)
        own = state if gen is None else {**state, "generator": self.generator.get_state()}
        super().load_state_dict(own)  # the episode index, checked; the generator
        if gen is not None:
            self.generator = gen
        self._items.load(prio, max_p)
        self._span[:] = 0  # no masses until the next draw (or now, for a fixed slice_len)
        self._span_t = self._span_view()
        self._trees.reset(0.0)
        self._count, self._mask_len = 0, None
        if self.slice_len is not None and self.data_source is not None:
            self._ensure(self.slice_len)
