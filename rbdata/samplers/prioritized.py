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

if _sumtree.HAS_NUMBA:
    from rbdata.samplers._sumtree import _nb_draw_at, _nb_set_priorities, _nb_set_priorities_at

__all__ = ["PrioritizedSampler"]


def _check_exponent(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


_FLOATS = (torch.float32, torch.float64)


def _contiguous_cpu_pair(index: Any, priority: Any) -> bool:
    """Whether ``index``/``priority`` are the training-loop case: contiguous CPU tensors.

    Any shapes with as many priorities as indices (``[B]``, ``[B, 1]``), read flat, as the
    general path does. The checks are the cheap attributes (``is_cpu``, not ``device.type``):
    they run on every update.
    """
    return (
        type(index) is torch.Tensor
        and type(priority) is torch.Tensor
        and index.dtype is torch.int64
        and priority.dtype in _FLOATS
        and index.is_cpu
        and priority.is_cpu
        and index.numel() == priority.numel()
        and index.is_contiguous()
        and priority.is_contiguous()
    )


def _index_and_priority(index: Any, priority: Any) -> tuple[np.ndarray, np.ndarray]:
    """1-D int64 indices and float32/float64 priorities of equal length, as numpy arrays."""
    if (  # the training-loop case, 1-D CPU tensors: views, nothing else to check
        type(index) is torch.Tensor
        and type(priority) is torch.Tensor
        and index.dtype is torch.int64
        and priority.dtype in (torch.float32, torch.float64)
        and index.dim() == 1
        and priority.shape == index.shape
    ):
        try:
            return index.numpy(), priority.numpy()
        except (RuntimeError, TypeError):  # requires grad, or not on the CPU
            pass
    idx = _as_numpy(index, np.int64, "index")
    if idx.ndim == 0:
        idx = idx.reshape(1)
    prio = _as_numpy(priority, np.float64, "priority")
    if prio.ndim == 0:
        prio = np.full(idx.shape, float(prio))
    if prio.shape[0] != idx.shape[0]:
        raise ValueError(
            f"priority: expected {idx.shape[0]} values (one per index), got {prio.shape[0]}"
        )
    return idx, prio


def _as_numpy(value: Any, dtype: type, name: str) -> np.ndarray:
    """A 1-D (or 0-d) numpy view or copy of a tensor, array, list or scalar, of ``dtype``."""
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        value = value.numpy()
    arr = value if type(value) is np.ndarray else np.asarray(value)
    if arr.ndim == 1 and arr.dtype == np.float32 and dtype is np.float64:
        return np.ascontiguousarray(arr)  # the kernels read float32 as it is
    if dtype is np.int64 and arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got dtype {arr.dtype}")
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name}: expected numbers, got dtype {arr.dtype}")
    arr = arr.astype(dtype, copy=False)
    return arr if arr.ndim == 0 else np.ascontiguousarray(arr.reshape(-1))


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
        self.alpha = _check_exponent(alpha, "alpha")
        self.beta = _check_exponent(beta, "beta")
        self.eps = _check_exponent(eps, "eps")
        self.stratified = bool(stratified)
        if default_priority is not None:
            default_priority = _check_exponent(default_priority, "default_priority")
        self.default_priority = default_priority
        self._initial_max = _check_exponent(max_priority, "max_priority")
        self.device = torch.device(device)
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self._sum = _sumtree.new_tree(self.capacity, "sum", dtype, self.device)
        self._min = _sumtree.new_block_min_tree(self.capacity, dtype, self.device)
        self._leaf0 = _sumtree.leaf_offset(self._sum)
        self._max_priority = self._initial_max
        self._fast = _sumtree.HAS_NUMBA and self.device.type == "cpu"
        if self._fast:  # numpy views of the trees for the numba kernels
            self._sum_np, self._min_np = self._sum.numpy(), self._min.numpy()
            self._offsets_np = np.asarray(_sumtree.layout(self._sum), dtype=np.int64)

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
        filled = self.capacity if source is None else len(source)
        if self._fast and _contiguous_cpu_pair(index, priority):
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
            )
            if code:
                self._refuse(code, int(index.view(-1)[pos]), float(priority.view(-1)[pos]), filled)
            if top > self._max_priority:
                self._max_priority = top
            return
        idx, prio = _index_and_priority(index, priority)
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

    @staticmethod
    def _refuse(code: int, index: int, priority: float, filled: int) -> None:
        if code == 1:
            raise ValueError(f"index: {index} is outside the filled range [0, {filled})")
        if code == 2:
            raise ValueError(f"priority: expected finite values, got {priority}")
        raise ValueError(f"priority: expected values >= 0, got {priority}")

    def on_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Give newly written items the default (or highest seen) priority."""
        p = self._max_priority if self.default_priority is None else self.default_priority
        if isinstance(index, int):
            index = torch.tensor([index])
        self.update_priority(index, p)

    def attach(self, storage: Sized) -> None:
        """Bind to a storage; items already in it get the default priority.

        A sampler whose state was loaded (:meth:`load_state_dict`) keeps its priorities.
        """
        super().attach(storage)
        n = len(storage)
        if n and not self._restored and float(self._sum[_sumtree.ROOT]) == 0:
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
        max_priority = float(state["max_priority"])
        super().load_state_dict(state)  # the generator: checked by torch before any change
        self._sum.copy_(trees[0])
        self._min.copy_(trees[1])
        self._max_priority = max_priority
