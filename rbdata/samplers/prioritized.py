"""``PrioritizedSampler``: proportional prioritized replay (Schaul et al., 2016) on a sum tree."""

from __future__ import annotations

import math
from collections.abc import Sized
from typing import Any

import numpy as np
import torch

from rbdata._index import check_capacity
from rbdata.samplers import _sumtree
from rbdata.samplers._priority_input import (
    check_exponent,
    contiguous_cpu_pair,
    cpu_copy,
    index_and_priority,
)
from rbdata.samplers.base import Sampler, check_bool

if _sumtree.HAS_NUMBA:
    from rbdata.samplers._sumtree import _nb_draw_at, _nb_set_priorities, _nb_set_priorities_at

__all__ = ["PrioritizedSampler"]


class PrioritizedSampler(Sampler):
    """Sample item ``i`` with probability ``P(i) = v_i / sum_j v_j``, ``v_i = (p_i + eps)^alpha``.

    Importance weights are ``w_i = (N P(i))^-beta / max_j w_j`` over the items in the buffer,
    i.e. ``(v_i / v_min)^-beta`` with ``v_min`` the smallest positive stored value (kept in a
    min tree), so the largest possible weight is 1. Batches drawn through a
    :class:`~rbdata.ReplayBuffer` or a :class:`~rbdata.samplers.BatchSampler` carry ``"index"``
    and ``"weight"``.

    New items get the highest priority seen so far (``default_priority=None``) or a fixed one.
    The trees live on ``device``: on CPU a numba kernel walks them, on CUDA the same tree
    functions run as torch ops (see :mod:`rbdata.samplers._sumtree`).

    Args:
        capacity: number of slots (the storage capacity).
        alpha: prioritization exponent (0: uniform).
        beta: importance-sampling exponent (0: no correction).
        eps: added to every priority before the exponent. With ``eps=0`` a priority of 0 is
            allowed and that item is never sampled.
        device: where the trees live (``"cpu"`` or ``"cuda"``).
        data_source: the storage (``None``: bound by the buffer); sampling and updates are
            limited to its filled part.
        generator: random generator (``None``: a private one seeded from torch's global RNG).
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

    def __init__(
        self,
        capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        device: torch.device | str = "cpu",
        *,
        data_source: Sized | None = None,
        generator: torch.Generator | None = None,
        stratified: bool = False,
        default_priority: float | None = None,
        max_priority: float = 1.0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(data_source, generator)
        self.capacity = check_capacity(capacity, "capacity")
        self.alpha = check_exponent(alpha, "alpha")
        self.beta = check_exponent(beta, "beta")
        self.eps = check_exponent(eps, "eps")
        self.stratified = check_bool(stratified, "stratified")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        #: the largest value the trees can hold (a stored value or total above it is inf)
        self._vmax = float(torch.finfo(dtype).max)
        self._pmax = _sumtree.largest_base(self._vmax, self.alpha)  # p + eps above: inf
        if default_priority is not None:
            default_priority = self._check_default(default_priority, "default_priority")
        self.default_priority = default_priority
        self._initial_max = self._check_default(max_priority, "max_priority")
        self.device = torch.device(device)
        self._sum = _sumtree.new_tree(self.capacity, "sum", dtype, self.device)
        self._min = _sumtree.new_block_min_tree(self.capacity, dtype, self.device)
        self._leaf0 = _sumtree.leaf_offset(self._sum)
        self._max_priority = self._initial_max
        self._fast = _sumtree.HAS_NUMBA and self.device.type == "cpu"
        if self._fast:  # numpy views of the trees for the numba kernels
            self._sum_np, self._min_np = self._sum.numpy(), self._min.numpy()
            self._offsets_np = np.asarray(_sumtree.layout(self._sum), dtype=np.int64)
        if data_source is not None:
            self.check_source(data_source)

    def _check_default(self, value: Any, name: str) -> float:
        """A priority option whose value ``(p + eps) ** alpha`` the tree's dtype can hold."""
        p = check_exponent(value, name)
        if not p + self.eps <= _sumtree.largest_base(self._vmax, self.alpha):
            raise ValueError(
                f"{name}: {p!r} gives (p + eps) ** alpha = {self._value(p)!r}, which is not "
                f"finite in the tree's dtype (largest {self._vmax:.4g})"
            )
        return p

    def _value(self, p: float) -> float:
        """The value ``(p + eps) ** alpha`` stored for priority ``p`` (float64, inf on overflow)."""
        try:
            return float((p + self.eps) ** self.alpha)
        except OverflowError:
            return math.inf

    def check_source(self, storage: Sized) -> None:
        """Raise ``ValueError`` if ``storage`` can hold more items than this sampler has slots.

        Called by :meth:`attach` (so by :class:`~rbdata.ReplayBuffer` construction and
        ``ReplayBuffer.loads``) and for a ``data_source`` given at construction: a tree
        smaller than its storage would be indexed past its end.
        """
        size = getattr(storage, "capacity", None)
        if size is None:
            size = len(storage)
        if int(size) > self.capacity:
            raise ValueError(
                f"capacity: PrioritizedSampler has {self.capacity} slots, fewer than the "
                f"{int(size)} items its storage can hold; give it the storage's capacity"
            )

    # --- priorities ---------------------------------------------------------------------
    @property
    def max_priority(self) -> float:
        """The highest priority seen so far (new items get it unless ``default_priority``)."""
        return self._max_priority

    def priority_values(self, index: Any = None) -> torch.Tensor:
        """The stored values ``(p + eps)^alpha`` at ``index`` (default: every slot)."""
        leaves = self._sum[self._leaf0 : self._leaf0 + self.capacity]
        return leaves.clone() if index is None else leaves[torch.as_tensor(index)]

    def update_priority(self, index: Any, priority: Any) -> None:
        """Set the priorities of the items at ``index`` (duplicates: the last one wins).

        ``index`` and ``priority`` may be tensors, arrays, lists or scalars (a scalar
        priority applies to every index). The whole call is validated before the trees are
        touched: an index outside the filled range or a NaN, infinite or negative priority
        raises ``ValueError`` and changes nothing.
        """
        source = self.data_source
        # never past the tree's slots, whatever the source claims (the kernels trust it)
        filled = self.capacity if source is None else min(len(source), self.capacity)
        if self._fast and contiguous_cpu_pair(index, priority):
            # the kernel reads the tensors in place (read only: autograd is not involved)
            code, pos, top = _nb_set_priorities_at(
                self._sum_np,
                self._min_np,
                self._offsets_np,
                index.data_ptr(),
                priority.data_ptr(),
                index.numel(),
                priority.dtype is torch.float64,
                filled,
                self.eps,
                self.alpha,
                self._vmax,
                self._pmax,
            )
            if code:
                self._refuse(code, int(index.view(-1)[pos]), float(priority.view(-1)[pos]), filled)
            if top > self._max_priority:
                self._max_priority = top
            return
        idx, prio = index_and_priority(index, priority)
        if self._fast:  # validation, transform and both trees in one kernel
            code, pos, top = _nb_set_priorities(
                self._sum_np,
                self._min_np,
                self._offsets_np,
                idx,
                prio,
                filled,
                self.eps,
                self.alpha,
                self._vmax,
                self._pmax,
            )
            if code:
                self._refuse(code, int(idx[pos]), float(prio[pos]), filled)
        else:
            for code, bad in enumerate(
                ((idx < 0) | (idx >= filled), ~np.isfinite(prio), prio < 0), start=1
            ):
                if bad.any():
                    pos = int(np.argmax(bad))
                    self._refuse(code, int(idx[pos]), float(prio[pos]), filled)
            bad = ~(prio.astype(np.float64) + self.eps <= self._pmax)
            if bad.any():
                pos = int(np.argmax(bad))
                self._refuse(4, int(idx[pos]), float(prio[pos]), filled)
            if idx.size:
                values = (prio.astype(np.float64) + self.eps) ** self.alpha
                if self._total_overflows(idx, values):
                    self._refuse(5, 0, 0.0, filled)
            top = float(prio.max()) if prio.size else 0.0
            if idx.size:  # torch.tensor copies: the arrays may be read-only views
                _sumtree.set_priorities_reference(
                    self._sum,
                    self._min,
                    torch.tensor(idx, device=self.device),
                    torch.tensor(prio, device=self.device),
                    self.eps,
                    self.alpha,
                )
        self._max_priority = max(self._max_priority, top)

    def _total_overflows(self, index: Any, values: Any) -> bool:
        """Whether storing ``values`` (float64, validated) at ``index`` overflows the total.

        A bound first (old total + new values, no tree read); the exact sum over the leaves
        only near the top of the dtype.
        """
        added = float(np.sum(values)) if isinstance(values, np.ndarray) else float(values.sum())
        if float(self._sum[_sumtree.ROOT]) + added <= 0.999 * self._vmax:
            return False
        leaves = self._sum[self._leaf0 : self._leaf0 + self.capacity].double().cpu()
        slots, new = _sumtree._last_occurrence(cpu_copy(index, torch.long), cpu_copy(values))
        leaves[slots] = new
        total = leaves.sum().to(self._sum.dtype)
        return not bool(torch.isfinite(total))

    def _refuse(self, code: int, index: int, priority: float, filled: int) -> None:
        if code == 1:
            raise ValueError(f"index: {index} is outside the filled range [0, {filled})")
        if code == 2:
            raise ValueError(f"priority: expected finite values, got {priority}")
        if code == 3:
            raise ValueError(f"priority: expected values >= 0, got {priority}")
        dtype = str(self._sum.dtype).replace("torch.", "")
        if code == 4:
            raise ValueError(
                f"priority: {priority} at index {index} gives (p + eps) ** alpha = "
                f"{self._value(priority):.4g}, which is not finite in the tree's {dtype} "
                f"(largest {self._vmax:.4g}); nothing was changed"
            )
        raise ValueError(
            f"priority: the new priorities make the tree's total overflow its {dtype} "
            f"(largest {self._vmax:.4g}); nothing was changed"
        )

    def _default(self) -> float:
        return self._max_priority if self.default_priority is None else self.default_priority

    def __getstate__(self) -> dict[str, Any]:
        """The trees travel as arrays; the numpy views of them are rebuilt on arrival."""
        state = super().__getstate__()
        state.pop("_sum_np", None)
        state.pop("_min_np", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self._fast:
            self._sum_np, self._min_np = self._sum.numpy(), self._min.numpy()

    def check_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Refuse a write whose new items' default priority would overflow the tree's total."""
        n = 1 if isinstance(index, int) else int(index.numel())
        if not n:
            return
        value = self._value(self._default())
        # the bound needs no tree walk; only near the dtype's top is the exact sum taken
        root = self._sum_np[_sumtree.ROOT] if self._fast else self._sum[_sumtree.ROOT]
        if float(root) + n * value <= 0.999 * self._vmax:
            return
        slots = torch.tensor([index]) if isinstance(index, int) else index.reshape(-1)
        if self._total_overflows(slots, torch.full((n,), value, dtype=torch.float64)):
            raise ValueError(
                f"priority: {n} new items at the default priority {self._default()} would "
                f"make the tree's total overflow its {self._sum.dtype} (largest "
                f"{self._vmax:.4g}); lower the priorities (update_priority) or "
                "default_priority; nothing was written"
            )

    def on_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Give newly written items the default (or highest seen) priority."""
        if isinstance(index, int):
            index = torch.tensor([index])
        self.update_priority(index, self._default())

    def attach(self, storage: Sized) -> None:
        """Bind to a storage; items already in it get the default priority.

        A sampler whose state was loaded (:meth:`load_state_dict`) keeps its priorities.

        Raises:
            ValueError: if ``storage`` can hold more items than the sampler has slots
                (:meth:`check_source`), or the sampler already reads another storage.
        """
        # priorities set before binding (or loaded) must not draw slots the storage lacks
        self.check_source(storage)
        self._check_beyond(self._sum, len(storage))
        super().attach(storage)
        n = len(storage)
        if n and not self._restored and float(self._sum[_sumtree.ROOT]) == 0:
            index = torch.arange(n)
            self.check_write(index, None)
            self.on_write(index, None)

    def reset(self) -> None:
        """Forget every priority."""
        self._sum.fill_(0.0)
        self._min.fill_(math.inf)
        self._max_priority = self._initial_max

    # --- sampling -----------------------------------------------------------------------
    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Draw indices proportionally to priority, with their importance weights."""
        self._length()  # a bound, non-empty storage
        u = torch.rand(batch_size, generator=self.generator, dtype=torch.float64)
        if self.stratified:
            u = (torch.arange(batch_size, dtype=torch.float64) + u) / batch_size
        if self._fast:  # one kernel reads u and fills index and weight in place
            total = float(self._sum_np[_sumtree.ROOT])
            if total <= 0:
                raise ValueError("cannot sample: every priority in the buffer is zero")
            index = torch.empty(batch_size, dtype=torch.long)
            weight = torch.empty(batch_size, dtype=torch.float32)
            _nb_draw_at(
                self._sum_np,
                self._offsets_np,
                float(self._min_np[_sumtree.ROOT]),
                u.data_ptr(),
                batch_size,
                total,
                self.beta,
                index.data_ptr(),
                weight.data_ptr(),
            )
            return index, {"weight": weight}
        root = self._sum[_sumtree.ROOT]
        if float(root) <= 0:  # one sync on CUDA; an all-zero tree has no distribution
            raise ValueError("cannot sample: every priority in the buffer is zero")
        on_device = u.to(self.device).mul_(root)
        index, weights = _sumtree.draw(self._sum, self._min, on_device, self.beta)
        return index, {"weight": weights}

    # --- state --------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Capacity, exponents, device, tree dtype and the other constructor options."""
        return {
            "capacity": self.capacity,
            "alpha": self.alpha,
            "beta": self.beta,
            "eps": self.eps,
            "device": str(self.device),
            "stratified": self.stratified,
            "default_priority": self.default_priority,
            "max_priority": self._initial_max,
            "dtype": self._sum.dtype,
        }

    def state_dict(self) -> dict[str, Any]:
        """Generator state, both trees and the highest priority seen."""
        state = super().state_dict()
        state.update(
            capacity=self.capacity,
            sum_tree=self._sum.clone(),
            min_tree=self._min.clone(),
            max_priority=self._max_priority,
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (same capacity)."""
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"capacity: the state is for {state['capacity']} slots, this sampler has "
                f"{self.capacity}"
            )
        trees = []
        for name, own in (("sum_tree", self._sum), ("min_tree", self._min)):
            tree = torch.as_tensor(state[name])
            if tree.shape != own.shape or not tree.is_floating_point():
                raise ValueError(
                    f"state: {name} is {tree.dtype} {tuple(tree.shape)}, expected a float "
                    f"tree of shape {tuple(own.shape)}"
                )
            trees.append(tree)
        if bool(torch.isnan(trees[0]).any()) or bool((trees[0] < 0).any()):
            raise ValueError("state: sum_tree holds NaN or negative priorities")
        # only the leaves are trusted: the inner nodes are recomputed from them (bit for bit
        # the saved ones if untampered), so every tree walk ends on a slot that holds mass
        new_sum = trees[0].to(device=self.device, dtype=self._sum.dtype).clone()
        new_min = torch.full_like(self._min, math.inf)
        leaves = new_sum[self._leaf0 :]
        if not bool(torch.isfinite(leaves).all()):
            raise ValueError("state: sum_tree holds infinite priorities")
        if bool((leaves[self.capacity :] != 0).any()):
            raise ValueError(
                f"state: sum_tree holds priorities past the sampler's {self.capacity} slots"
            )
        _sumtree.rebuild(new_sum, new_min)
        if not bool(torch.isfinite(new_sum[_sumtree.ROOT])):
            raise ValueError(f"state: the priorities' total overflows the tree's {new_sum.dtype}")
        max_priority = float(state["max_priority"])
        if not (math.isfinite(max_priority) and max_priority >= 0):
            raise ValueError(f"state: max_priority must be finite and >= 0, got {max_priority}")
        if not max_priority + self.eps <= self._pmax:
            raise ValueError(f"state: max_priority {max_priority} overflows the tree's dtype")
        source = self.data_source
        if source is not None:
            self._check_beyond(new_sum, len(source))
        super().load_state_dict(state)  # the generator: checked by torch before any change
        self._sum.copy_(new_sum)
        self._min.copy_(new_min)
        self._max_priority = max_priority

    def _check_beyond(self, tree: torch.Tensor, filled: int) -> None:
        """Raise unless every slot at or past ``filled`` has priority 0 (is never drawn)."""
        if filled < self.capacity and bool((tree[self._leaf0 + filled :] != 0).any()):
            raise ValueError(
                f"priorities: slots past the {filled} items of the storage have priorities "
                "(a sampler state or updates that do not belong to this storage); they "
                "would be drawn"
            )
