"""CPU trees of the prioritized sampler: numba kernels, errors raised by the call itself."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from rbdata.samplers._priority_input import (
    contiguous_cpu_pair,
    device_index_and_priority,
    index_and_priority,
)
from rbdata.samplers._trees import sumtree as _sumtree
from rbdata.samplers._trees.backend import TreeSpec, check_new_exact, check_update, refused
from rbdata.samplers._trees.numba_kernels import (
    _nb_draw_at,
    _nb_set_one,
    _nb_set_priorities,
    _nb_set_priorities_at,
)

__all__ = ["CpuTrees"]


class CpuTrees:
    """The sum and block-min trees on the CPU, walked by numba kernels.

    ``update_priority`` validates, transforms and stores a whole call in one kernel (reading
    contiguous tensors in place), a draw is one kernel too. A refused call raises
    ``ValueError`` and changes nothing.

    Args:
        spec: slots, exponent, offset and dtype.
        max_priority: the initial highest priority seen.
        sum_tree: the sum tree to adopt (default: a new empty one).
        min_tree: its block-min tree (with ``sum_tree``).
    """

    def __init__(
        self,
        spec: TreeSpec,
        max_priority: float,
        sum_tree: torch.Tensor | None = None,
        min_tree: torch.Tensor | None = None,
    ) -> None:
        self.spec = spec
        self.device = torch.device("cpu")
        if sum_tree is None or min_tree is None:
            sum_tree = _sumtree.new_tree(spec.capacity, "sum", spec.dtype)
            min_tree = _sumtree.new_block_min_tree(spec.capacity, spec.dtype)
        self.sum_tree, self.min_tree = sum_tree, min_tree
        self._sum_np, self._min_np = sum_tree.numpy(), min_tree.numpy()
        self._offsets_np = np.asarray(_sumtree.layout(sum_tree), dtype=np.int64)
        self._leaf0 = int(self._offsets_np[-1])
        # the kernels' constants as plain attributes: read on every call
        self._eps, self._alpha, self._vmax, self._pmax = spec.eps, spec.alpha, spec.vmax, spec.pmax
        self._max = max_priority

    @property
    def max_priority(self) -> float:
        """The highest priority seen so far."""
        return self._max

    def total(self) -> float:
        """The sum of the stored values."""
        return float(self._sum_np[_sumtree.ROOT])

    def min(self) -> float:
        """The smallest positive stored value (``inf`` if none)."""
        return float(self._min_np[_sumtree.ROOT])

    def set(self, index: Any, priority: Any, filled: int) -> None:
        """Validate and store priorities (one kernel; raises ``ValueError`` for a bad call)."""
        if contiguous_cpu_pair(index, priority):
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
                self._eps,
                self._alpha,
                self._vmax,
                self._pmax,
            )
            if code:
                bad = int(index.view(-1)[pos]), float(priority.view(-1)[pos])
                raise refused(self.spec, code, *bad, filled)
            if top > self._max:
                self._max = top
            return
        self._set_arrays(*index_and_priority(index, priority), filled)

    def _set_arrays(self, idx: np.ndarray, prio: np.ndarray, filled: int) -> None:
        code, pos, top = _nb_set_priorities(
            self._sum_np,
            self._min_np,
            self._offsets_np,
            idx,
            prio,
            filled,
            self._eps,
            self._alpha,
            self._vmax,
            self._pmax,
        )
        if code:
            raise refused(self.spec, code, int(idx[pos]), float(prio[pos]), filled)
        if top > self._max:
            self._max = top

    def check(self, index: Any, priority: Any, filled: int) -> None:
        """Raise the ``ValueError`` :meth:`set` would raise (the exact total); change nothing."""
        idx, prio = device_index_and_priority(index, priority, self.device)
        check_update(self.spec, self.sum_tree, idx, prio, filled, exact=True)

    def set_new(self, index: int | torch.Tensor, priority: float | None, filled: int) -> None:
        """Give new items ``priority`` (``None``: the highest seen); one slot: no conversion."""
        p = self._max if priority is None else priority
        if isinstance(index, int):  # the per-step add: one slot through the kernel
            code, _, top = _nb_set_one(
                self._sum_np, self._min_np, self._offsets_np, index, float(p), filled,
                self._eps, self._alpha, self._vmax, self._pmax,
            )  # fmt: skip
            if code:
                raise refused(self.spec, code, index, float(p), filled)
            if top > self._max:
                self._max = top
            return
        slots = index.reshape(-1)
        self.set(slots, torch.full(slots.shape, p, dtype=torch.float64), filled)

    def check_new(self, index: int | torch.Tensor, priority: float | None) -> None:
        """Raise ``ValueError`` if new items at ``index`` and ``priority`` overflow the total."""
        p = self._max if priority is None else priority
        count = 1 if isinstance(index, int) else int(index.numel())
        # a bound (no tree walk); only near the dtype's top is the exact sum taken
        if count and self.total() + count * self.spec.value(p) > 0.999 * self._vmax:
            check_new_exact(self.spec, self.sum_tree, index, p)

    def draw(
        self, batch_size: int, generator: torch.Generator, beta: float, stratified: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One kernel reads the uniforms and fills indices and weights in place."""
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        if stratified:
            u = (torch.arange(batch_size, dtype=torch.float64) + u) / batch_size
        total = self.total()
        if total <= 0:
            raise ValueError("cannot sample: every priority in the buffer is zero")
        index = torch.empty(batch_size, dtype=torch.long)
        weight = torch.empty(batch_size, dtype=torch.float32)
        _nb_draw_at(
            self._sum_np,
            self._offsets_np,
            self.min(),
            u.data_ptr(),
            batch_size,
            total,
            beta,
            index.data_ptr(),
            weight.data_ptr(),
        )
        return index, weight

    def load(self, sum_tree: torch.Tensor, min_tree: torch.Tensor, max_priority: float) -> None:
        """Replace the trees' values (the views stay) and the highest priority seen."""
        self.sum_tree.copy_(sum_tree)
        self.min_tree.copy_(min_tree)
        self._max = max_priority

    def reset(self, max_priority: float) -> None:
        """Forget every priority."""
        self.sum_tree.fill_(0.0)
        self.min_tree.fill_(math.inf)
        self._max = max_priority

    def apply_pending(self) -> None:
        """Nothing queued: CPU calls apply at once."""

    def check_errors(self) -> None:
        """Nothing to do: CPU calls raise their own errors."""
