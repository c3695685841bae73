"""``PrioritizedSampler``: proportional prioritized replay (Schaul et al., 2016) on a sum tree.

The sampler is a thin front: it checks its arguments, owns the generator and the options, and
runs every tree operation through a *tree backend* (:mod:`rbdata.samplers._trees.backend`): numba
kernels on CPU trees (:class:`~rbdata.samplers._trees.cpu.CpuTrees`), fused Triton kernels or
the torch reference on device trees (:class:`~rbdata.samplers._trees.device.DeviceTrees`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sized
from typing import Any

import torch

from rbdata._core.torchrl_names import PRIORITIZED_KEYWORDS, torchrl_keywords
from rbdata.samplers import _prioritized_checks as _checks
from rbdata.samplers._draw_state import GeneratorDrawState
from rbdata.samplers._priority_input import capacity_and_source, check_exponent
from rbdata.samplers._trees import sumtree as _sumtree
from rbdata.samplers._trees.backend import TreeBackend, TreeSpec, check_beyond, restored_trees
from rbdata.samplers._trees.cpu import CpuTrees
from rbdata.samplers._trees.device import DeviceTrees
from rbdata.samplers.base import Sampler, check_bool
from rbdata.samplers.saved import tree_totals

__all__ = ["PrioritizedSampler"]

#: Run the device path (device trees: checks on the device, errors reported later, new items
#: queued) on CPU too: testable without a GPU. Read when a sampler places its trees.
_DEVICE_PATH_ON_CPU = False
#: the kernels of device trees: ``None`` (Triton where it can run, else torch), ``"triton"``
#: or ``"torch"``; read like :data:`_DEVICE_PATH_ON_CPU` (tests compare the two)
_DEVICE_KERNELS: str | None = None


def _make_trees(
    spec: TreeSpec,
    device: torch.device,
    max_priority: float,
    trees: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> TreeBackend:
    """The backend for ``device``: numba on CPU (unless forced), device trees elsewhere."""
    sum_tree, min_tree = trees if trees is not None else (None, None)
    if device.type == "cpu" and not _DEVICE_PATH_ON_CPU:
        return CpuTrees(spec, max_priority, sum_tree, min_tree)
    return DeviceTrees(spec, device, max_priority, _DEVICE_KERNELS, sum_tree, min_tree)


class PrioritizedSampler(GeneratorDrawState, Sampler):
    """Sample item ``i`` with probability ``P(i) = v_i / sum_j v_j``, ``v_i = (p_i + eps)^alpha``.

    Importance weights are ``w_i = (N P(i))^-beta / max_j w_j`` over the items in the buffer,
    i.e. ``(v_i / v_min)^-beta`` with ``v_min`` the smallest positive stored value (kept in a
    min tree), so the largest possible weight is 1. Batches drawn through a
    :class:`~rbdata.ReplayBuffer` or a :class:`~rbdata.samplers.BatchSampler` carry ``"index"``
    and ``"weight"``.

    New items get the highest priority seen so far (``default_priority=None``) or a fixed one.
    The trees live on ``device``: on CPU a numba kernel walks them; on CUDA batched torch ops
    do (see :mod:`!rbdata.samplers._trees.torch_ops`): every draw of a batch descends the tree
    together, one step per level, and an update recomputes only the written slots' ancestors.

    **On CUDA** ``draw``, ``sample`` and ``update_priority`` never wait for the GPU: indices,
    weights, the generator's uniforms and the highest priority stay on the device, and
    ``update_priority`` accepts CPU or CUDA tensors. Priorities are therefore checked *on the
    device*: a call with an index outside the filled range, or a NaN, infinite or negative
    priority (or one whose total would overflow the tree) **changes nothing**, as on CPU, and
    its ``ValueError`` is raised by a later call (``update_priority``, ``draw``/``sample``) as
    soon as the GPU has reported it, or at once by :meth:`check_errors`, which waits for the
    GPU. New items' priorities are applied in one batched update before the next read. See
    ``docs/samplers.md`` (GPU section).

    Args:
        capacity: number of slots (the storage capacity), or the storage itself (its
            capacity, and ``data_source``), as the other samplers take it first.
        alpha: prioritization exponent (0: uniform).
        beta: importance-sampling exponent (0: no correction).
        eps: added to every priority before the exponent. With ``eps=0`` a priority of 0 is
            allowed and that item is never sampled.
        device: where the trees live (``"cpu"``, ``"cuda"``); ``None`` (default) follows the
            storage the sampler is attached to (CPU until then). Asking for CUDA where there
            is none raises ``RuntimeError``.
        data_source: the storage (``None``: bound by the buffer); sampling and updates are
            limited to its filled part.
        generator: random generator (``None``: a private one seeded from torch's global RNG,
            on the trees' device). A CPU generator given to a CUDA sampler works (its uniforms
            are copied to the GPU each draw); a CUDA one avoids the copy.
        stratified: draw one target per equal-mass segment of the total (as in the PER paper)
            instead of independently.
        default_priority: priority of new items; ``None`` uses the highest seen so far
            (initially ``max_priority``).
        max_priority: the initial "highest priority seen so far".
        dtype: storage dtype of the trees. ``float32`` (as cpprb and TorchRL) halves the
            memory a random walk touches; sums are still accumulated and searched in float64,
            so the cost is a ~1e-7 relative rounding of each stored value. ``float64`` for
            exact sums.

    Examples:
        >>> import torch
        >>> from rbdata import ReplayBuffer, TensorStorage
        >>> rb = ReplayBuffer(TensorStorage(100), PrioritizedSampler(100, alpha=1.0, beta=0.5))
        >>> _ = rb.extend({"obs": torch.randn(4, 3)})
        >>> rb.update_priority([0, 1, 2, 3], [1.0, 0.0, 0.0, 0.0])
        >>> batch = rb.sample(8)
        >>> sorted(set(batch["index"].tolist())), batch["weight"].shape
        ([0], torch.Size([8]))
    """

    @torchrl_keywords(PRIORITIZED_KEYWORDS)
    def __init__(
        self,
        capacity: int | Sized,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        device: torch.device | str | None = None,
        *,
        data_source: Sized | None = None,
        generator: torch.Generator | None = None,
        stratified: bool = False,
        default_priority: float | None = None,
        max_priority: float = 1.0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        capacity, data_source = capacity_and_source(capacity, data_source)
        super().__init__(data_source, generator)
        #: the generator is the sampler's own: it may move to the trees' device
        self._own_generator = generator is None
        self._spec = _checks.tree_spec(capacity, alpha, eps, dtype)
        self.capacity = self._spec.capacity
        self.beta = check_exponent(beta, "beta")
        self.stratified = check_bool(stratified, "stratified")
        self.default_priority, self._initial_max = _checks.priority_options(
            self._spec, default_priority, max_priority
        )
        #: the device asked for (``None``: the storage's, resolved by attach)
        self._device_arg = None if device is None else str(torch.device(device))
        self.device = _checks.tree_device(device, data_source)
        self._trees = _make_trees(self._spec, self.device, self._initial_max)
        self._match_generator()
        if data_source is not None:
            self.check_source(data_source)

    @property
    def alpha(self) -> float:
        """The prioritization exponent, fixed at construction (the stored values depend on it)."""
        return self._spec.alpha

    @property
    def eps(self) -> float:
        """Added to every priority before ``alpha``, fixed at construction as ``alpha`` is."""
        return self._spec.eps

    def _match_generator(self) -> None:
        """A private generator draws on the trees' device (same seed): no copy per draw."""
        gen = self.generator
        if self._own_generator and gen.device.type != self.device.type:
            self.generator = torch.Generator(device=self.device).manual_seed(gen.initial_seed())

    def _place(self, device: torch.device) -> None:
        """Move the trees (and a private generator) to ``device``."""
        if device == self.device:
            return
        old = self._trees
        old.check_errors()
        max_priority = old.max_priority  # applies queued new items first
        trees = (old.sum_tree.to(device), old.min_tree.to(device))
        self._trees = _make_trees(self._spec, device, max_priority, trees)
        self.device = device
        self._match_generator()

    def check_source(self, storage: Sized) -> None:
        """Raise ``ValueError`` if ``storage`` can hold more items than this sampler has slots.

        Called by :meth:`attach` (so by :class:`~rbdata.ReplayBuffer` construction and
        ``ReplayBuffer.loads``) and for a ``data_source`` given at construction: a tree
        smaller than its storage would be indexed past its end.
        """
        _checks.check_source_size(storage, self.capacity)

    # --- priorities ---------------------------------------------------------------------
    @property
    def max_priority(self) -> float:
        """The highest priority seen so far (new items get it unless ``default_priority``).

        On CUDA it is kept on the device; reading it here waits for the GPU.
        """
        return self._trees.max_priority

    def total(self) -> float:
        """The sum of the stored values ``(p + eps) ** alpha`` (on CUDA: waits for the GPU).

        Examples:
            >>> sampler = PrioritizedSampler(4, alpha=1.0, beta=0.0, eps=0.0)
            >>> sampler.update_priority([0, 1], [2.0, 3.0])
            >>> sampler.total()
            5.0
        """
        return self._trees.total()

    def min(self) -> float:
        """The smallest positive stored value, ``inf`` if none (on CUDA: waits for the GPU).

        Importance weights are ``(v / min()) ** -beta``.

        Examples:
            >>> sampler = PrioritizedSampler(4, alpha=1.0, beta=0.0, eps=0.0)
            >>> sampler.update_priority([0, 1, 2], [2.0, 0.0, 3.0])
            >>> sampler.min()
            2.0
        """
        return self._trees.min()

    def priority_values(self, index: Any = None) -> torch.Tensor:
        """The stored values ``(p + eps)^alpha`` at ``index`` (default: every slot)."""
        self._trees.apply_pending()
        leaf0 = _sumtree.leaf_offset(self._trees.sum_tree)
        leaves = self._trees.sum_tree[leaf0 : leaf0 + self.capacity]
        return leaves.clone() if index is None else leaves[torch.as_tensor(index)]

    def update_priority(self, index: Any, priority: Any) -> None:
        """Set the priorities of the items at ``index`` (duplicates: the last one wins).

        ``index`` and ``priority`` may be tensors, arrays, lists or scalars (a scalar
        priority applies to every index). The whole call is validated before the trees are
        touched: an index outside the filled range or a NaN, infinite or negative priority
        raises ``ValueError`` and changes nothing.

        On CUDA (CPU or CUDA tensors accepted, nothing waits for the GPU) the values are
        checked on the device: a bad call still changes nothing, and its ``ValueError`` is
        raised by a later call or by :meth:`check_errors` (see the class notes).
        """
        self._trees.set(index, priority, self._filled())

    def check_priority(self, index: Any, priority: Any) -> None:
        """Raise the error ``update_priority(index, priority)`` would raise; change nothing.

        For callers that write several samplers all or nothing (:class:`~rbdata.MixedBuffer`).
        On CUDA it waits for the GPU and raises a refused earlier call's error first.
        """
        self._trees.check(index, priority, self._filled())

    def check_errors(self) -> None:
        """Raise the ``ValueError`` of the first call the device refused since the last check.

        On CUDA, ``update_priority`` checks priorities on the device and ``draw`` checks that
        some priority is positive; a refused call changed nothing, and its error is raised
        by the next call once the GPU has reported it. This method waits for the GPU and
        raises it now (then forgets it). On CPU errors are raised by the call itself, so
        this does nothing.

        Examples:
            >>> sampler = PrioritizedSampler(8, alpha=0.6, beta=0.4)
            >>> sampler.check_errors()  # nothing refused
        """
        self._trees.check_errors()

    def check_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Refuse a write whose new items' default priority would overflow the tree's total.

        On CUDA the total is checked on the device when the new items' priorities are
        applied (an overflow is then refused and reported like a bad ``update_priority``).
        """
        self._trees.check_new(index, self.default_priority)

    def on_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Give newly written items the default (or highest seen) priority.

        On CUDA the slots are queued and applied in one batched update before the next read
        of the priorities (the result is the same: the highest priority cannot change in
        between without that read).
        """
        self._trees.set_new(index, self.default_priority, self._filled())

    def _filled(self) -> int:
        """Slots that may hold a priority: the source's length, capped at the tree's slots.

        Whatever the source claims, never past the tree: the kernels trust this bound.
        """
        source = self.data_source
        return self.capacity if source is None else min(len(source), self.capacity)

    def attach(self, storage: Sized) -> None:
        """Bind to a storage; items already in it get the default priority.

        A sampler made with ``device=None`` moves its trees to the storage's device. A
        sampler whose state was loaded (:meth:`load_state_dict`) keeps its priorities.

        Raises:
            ValueError: if ``storage`` can hold more items than the sampler has slots
                (:meth:`check_source`), or the sampler already reads another storage.
        """
        # priorities set before binding (or loaded) must not draw slots the storage lacks
        self.check_source(storage)
        device = _checks.tree_device(None if self._device_arg is None else self.device, storage)
        self._trees.apply_pending()
        check_beyond(self._trees.sum_tree, len(storage), self.capacity)
        super().attach(storage)
        self._place(device)  # device=None: the trees follow the storage
        n = len(storage)
        if n and not self._restored and self._trees.total() == 0:
            index = torch.arange(n)
            self.check_write(index, None)
            self.on_write(index, None)

    def reset(self) -> None:
        """Forget every priority."""
        self._trees.reset(self._initial_max)

    # --- sampling -----------------------------------------------------------------------
    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Draw indices proportionally to priority, with their importance weights.

        Indices and weights are on the trees' device. On CUDA nothing waits for the GPU: a
        tree whose priorities are all zero yields slot 0 and is reported by a later call
        (see :meth:`check_errors`) instead of raising here.
        """
        self._length()  # a bound, non-empty storage
        index, weight = self._trees.draw(batch_size, self.generator, self.beta, self.stratified)
        return index, {"weight": weight}

    # --- state --------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The trees travel as arrays; the backend is rebuilt on arrival."""
        trees = self._trees
        max_priority = trees.max_priority  # applies queued new items first
        del self.__dict__["_trees"]
        try:
            self.__dict__.update(_sum=trees.sum_tree, _min=trees.min_tree, _max=max_priority)
            return super().__getstate__()
        finally:
            for name in ("_sum", "_min", "_max"):
                self.__dict__.pop(name)
            self._trees = trees

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        trees = (self.__dict__.pop("_sum"), self.__dict__.pop("_min"))
        max_priority = self.__dict__.pop("_max")
        trees = (trees[0].to(self.device), trees[1].to(self.device))
        self._trees = _make_trees(self._spec, self.device, max_priority, trees)

    def config(self) -> dict[str, Any]:
        """Capacity, exponents, device, tree dtype and the other constructor options.

        ``device`` is the one asked for: ``None`` (follow the storage) stays ``None``, so a
        checkpoint loads onto whatever device its storage is restored to.
        """
        return _checks.tree_options(self)

    def state_dict(self) -> dict[str, Any]:
        """Generator state, both trees and the highest priority seen."""
        max_priority = self.max_priority  # applies queued new items first
        state = super().state_dict()
        state.update(
            capacity=self.capacity,
            sum_tree=self._trees.sum_tree.clone(),
            min_tree=self._trees.min_tree.clone(),
            max_priority=max_priority,
        )
        return state

    @classmethod
    def describe_state(
        cls, state: Mapping[str, Any], read: Callable[[Any, int], float | None]
    ) -> dict[str, Any]:
        """The saved trees' totals: ``total_priority`` and ``min_priority`` (their roots).

        See :meth:`Sampler.describe_state <rbdata.samplers.base.Sampler.describe_state>`;
        each total is ``None`` when its tree is not a saved floating tensor.

        Examples:
            >>> s = PrioritizedSampler(4, alpha=1.0, beta=1.0)
            >>> s.on_write(0, None); s.update_priority(0, 2.0)
            >>> saved = s.state_dict()
            >>> PrioritizedSampler.describe_state(saved, lambda t, i: float(t[i]))
            {'total_priority': 2.0, 'min_priority': 2.0}
        """
        return tree_totals(state, read)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (same capacity)."""
        _checks.check_state_capacity(state, self.capacity)
        new_sum, new_min, max_priority = restored_trees(state, self._spec, self._trees)
        source = self.data_source
        if source is not None:
            check_beyond(new_sum, len(source), self.capacity)
        # the generator, checked by torch before any change (a CPU / CUDA state brings its kind)
        gen = _checks.generator_of_state(state["generator"], self.generator, self.device)
        if gen is None:
            super().load_state_dict(state)  # (torch's own error for a foreign state)
        else:
            self.generator, self._restored = gen, True
        # the state replaces queued new items and recorded errors
        self._trees.load(new_sum, new_min, max_priority)
