"""``PrioritizedSampler``: proportional prioritized replay (Schaul et al., 2016) on a sum tree."""

from __future__ import annotations

import math
from collections.abc import Sized
from typing import Any

import numpy as np
import torch

from rbdata._index import check_capacity
from rbdata.samplers import _sumtree
from rbdata.samplers.base import Sampler

__all__ = ["PrioritizedSampler"]


def _check_exponent(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


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
    ) -> None:
        super().__init__(data_source, generator)
        self.capacity = check_capacity(capacity, "capacity")
        self.alpha = _check_exponent(alpha, "alpha")
        self.beta = _check_exponent(beta, "beta")
        self.eps = _check_exponent(eps, "eps")
        self.stratified = bool(stratified)
        if default_priority is not None:
            default_priority = _check_exponent(default_priority, "default_priority")
        self.default_priority = default_priority
        self._initial_max = _check_exponent(max_priority, "max_priority")
        self.device = torch.device(device)
        self._sum = _sumtree.new_tree(self.capacity, "sum", device=self.device)
        self._min = _sumtree.new_tree(self.capacity, "min", device=self.device)
        self._leaves = _sumtree.leaf_count(self.capacity)
        self._max_priority = self._initial_max

    # --- priorities ---------------------------------------------------------------------
    @property
    def max_priority(self) -> float:
        """The highest priority seen so far (new items get it unless ``default_priority``)."""
        return self._max_priority

    def _filled(self) -> int:
        return len(self.data_source) if self.data_source is not None else self.capacity

    def _set(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        values = (priority + self.eps).pow(self.alpha)
        min_values = torch.where(values > 0, values, math.inf)
        _sumtree.update_pair(self._sum, self._min, index, values, min_values)

    def priority_values(self, index: Any = None) -> torch.Tensor:
        """The stored values ``(p + eps)^alpha`` at ``index`` (default: every slot)."""
        leaves = self._sum[self._leaves : self._leaves + self.capacity]
        return leaves.clone() if index is None else leaves[torch.as_tensor(index)]

    def update_priority(self, index: Any, priority: Any) -> None:
        """Set the priorities of the items at ``index`` (duplicates: the last one wins).

        ``index`` and ``priority`` may be tensors, arrays, lists or scalars (a scalar
        priority applies to every index). The whole call is validated before the trees are
        touched: an index outside the filled range or a NaN, infinite or negative priority
        raises ``ValueError`` and changes nothing.
        """
        idx = torch.as_tensor(np.asarray(index) if isinstance(index, list) else index)
        if idx.dtype == torch.bool or idx.is_floating_point() or idx.is_complex():
            raise TypeError(f"index: expected integers, got dtype {idx.dtype}")
        idx = idx.reshape(-1).to(device="cpu", dtype=torch.long)
        prio = torch.as_tensor(priority, dtype=torch.float64)
        prio = prio.reshape(-1).cpu() if prio.dim() else prio.cpu().expand(idx.shape[0])
        if prio.shape[0] != idx.shape[0]:
            raise ValueError(
                f"priority: expected {idx.shape[0]} values (one per index), got {prio.shape[0]}"
            )
        if idx.numel() == 0:
            return
        filled = self._filled()
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= filled:
            bad = lo if lo < 0 else hi
            raise ValueError(f"index: {bad} is outside the filled range [0, {filled})")
        finite = torch.isfinite(prio)
        if not bool(finite.all()):
            bad_value = float(prio[~finite][0])
            raise ValueError(f"priority: expected finite values, got {bad_value}")
        if bool((prio < 0).any()):
            raise ValueError(f"priority: expected values >= 0, got {float(prio.min())}")
        self._max_priority = max(self._max_priority, float(prio.max()))
        self._set(idx.to(self.device), prio.to(self.device))

    def on_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Give newly written items the default (or highest seen) priority."""
        idx = torch.tensor([index]) if isinstance(index, int) else index.reshape(-1)
        p = self._max_priority if self.default_priority is None else self.default_priority
        self._set(idx.to(self.device), torch.full(idx.shape, p, dtype=torch.float64))

    def attach(self, storage: Sized) -> None:
        """Bind to a storage; items already in it get the default priority."""
        super().attach(storage)
        n = len(storage)
        if n and float(self._sum[1]) == 0:
            self.on_write(torch.arange(n), None)

    def reset(self) -> None:
        """Forget every priority."""
        self._sum.fill_(0.0)
        self._min.fill_(math.inf)
        self._max_priority = self._initial_max

    # --- sampling -----------------------------------------------------------------------
    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Draw indices proportionally to priority, with their importance weights."""
        self._length()  # a bound, non-empty storage
        total = self._sum[1]
        u = torch.rand(batch_size, generator=self.generator, dtype=torch.float64)
        if self.stratified:
            u = (torch.arange(batch_size, dtype=torch.float64) + u) / batch_size
        if float(total) <= 0:  # one sync on CUDA; an all-zero tree has no distribution
            raise ValueError("cannot sample: every priority in the buffer is zero")
        idx = _sumtree.find(self._sum, u.to(self.device).mul_(total))
        values = self._sum[idx + self._leaves]
        weight = (values / self._min[1]).pow_(-self.beta).to(torch.float32)
        return idx, {"weight": weight}

    # --- state --------------------------------------------------------------------------
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
        super().load_state_dict(state)
        self._sum.copy_(state["sum_tree"])
        self._min.copy_(state["min_tree"])
        self._max_priority = float(state["max_priority"])
