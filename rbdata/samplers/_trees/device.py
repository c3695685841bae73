"""Device trees of the prioritized sampler: nothing waits for the device.

The trees live on the device (CUDA; CPU when forced, for tests) and are walked by fused
Triton kernels (:mod:`rbdata.samplers._trees.triton_ops`: a draw is one kernel, an update two) or,
without Triton, by the batched torch reference (:mod:`rbdata.samplers._trees.torch_ops`). Either
way:

- an update is validated **on the device**: a refused call changes nothing, and its record
  (event, refusal code, the first failing item's index and priority, ``filled - 1``) is kept
  in a small device tensor whose host copy is refreshed by a non-blocking copy after every
  call; the next call raises it once the copy has landed, :meth:`DeviceTrees.check_errors`
  at once (it waits);
- a draw from an all-zero tree yields slot 0 and is recorded the same way;
- new items' priorities are queued on the host and applied in one batched update before the
  next read (the result is the same: the highest priority cannot change in between);
- the highest priority seen stays on the device.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from rbdata.samplers._priority_input import device_index_and_priority
from rbdata.samplers._trees import sumtree as _sumtree
from rbdata.samplers._trees import torch_ops as _torch_tree
from rbdata.samplers._trees.backend import (
    TreeSpec,
    check_update,
    interpreting,
    item_codes,
    refusal,
    refused,
    values_of,
)

__all__ = ["DeviceTrees", "triton_ready"]

#: slots of new items queued on the host before they are applied in one update
_PENDING_LIMIT = 65_536
#: the error record: event (0 none, 1 a refused update, 6 a draw from an all-zero tree),
#: refusal code, index, priority, filled - 1, two spare words
_RECORD = 7


def triton_ready(device: torch.device) -> bool:
    """Whether the fused Triton kernels can run on ``device``.

    CUDA with ``triton`` importable, or CPU tensors under Triton's interpreter
    (``TRITON_INTERPRET=1``, how CI runs them). ``RBDATA_TRITON=0`` turns them off (the torch
    reference then runs).
    """
    if os.environ.get("RBDATA_TRITON", "1") == "0":
        return False
    try:
        import triton  # noqa: F401 - only whether it imports
    except ImportError:
        return False
    if device.type == "cpu":
        return interpreting()
    return device.type == "cuda"


class DeviceTrees:
    """The sum and block-min trees on a device, updated and drawn without a host wait.

    Args:
        spec: slots, exponent, offset and dtype.
        device: where the trees live.
        max_priority: the initial highest priority seen.
        kernels: ``"triton"`` (fused kernels), ``"torch"`` (the reference) or ``None``: Triton
            where :func:`triton_ready`, else torch.
        sum_tree: the sum tree to adopt, on ``device`` (default: a new empty one).
        min_tree: its block-min tree (with ``sum_tree``).
    """

    def __init__(
        self,
        spec: TreeSpec,
        device: torch.device,
        max_priority: float,
        kernels: str | None = None,
        sum_tree: torch.Tensor | None = None,
        min_tree: torch.Tensor | None = None,
    ) -> None:
        self.spec = spec
        self.device = device
        if sum_tree is None or min_tree is None:
            sum_tree = _sumtree.new_tree(spec.capacity, "sum", spec.dtype, device)
            min_tree = _sumtree.new_block_min_tree(spec.capacity, spec.dtype, device)
        self.sum_tree, self.min_tree = sum_tree, min_tree
        self.kernels = kernels or ("triton" if triton_ready(device) else "torch")
        self._pending_slots: list[int] = []
        self._pending_tensors: list[torch.Tensor] = []
        self._max_t = torch.full((), max_priority, dtype=torch.float64, device=device)
        self._err = torch.zeros(_RECORD, dtype=torch.float64, device=device)
        # the record's host copy, refreshed by a non-blocking copy after every call: read
        # without waiting (pinned memory, so the copy is asynchronous on CUDA)
        pinned = device.type == "cuda"
        self._err_host = torch.zeros(_RECORD, dtype=torch.float64, pin_memory=pinned)
        self._err_np = self._err_host.numpy()
        self._new_priority: float | None = None
        self._new_t: tuple[float, torch.Tensor] | None = None
        if self.kernels == "triton":
            from rbdata.samplers._trees import triton_ops as _triton_tree

            self._triton: Any = _triton_tree
            self._workspace = _triton_tree.Workspace(self.sum_tree, self.min_tree)
            self._workspace.constants(spec.eps, spec.alpha, spec.pmax, spec.vmax)
        else:
            self._sum_levels = _torch_tree.Levels(
                _sumtree.layout(self.sum_tree), self.sum_tree.shape[0], device
            )
            self._min_levels = _torch_tree.Levels(
                _sumtree.layout(self.min_tree), self.min_tree.shape[0], device
            )
            self._scratch: torch.Tensor | None = None  # allocated by the first update

    # --- reads (each waits for the device) ------------------------------------------------
    @property
    def max_priority(self) -> float:
        """The highest priority seen so far (waits for the device)."""
        self._flush()
        return float(self._max_t)

    def total(self) -> float:
        """The sum of the stored values (waits for the device)."""
        self._flush()
        return float(self.sum_tree[_sumtree.ROOT])

    def min(self) -> float:
        """The smallest positive stored value, ``inf`` if none (waits for the device)."""
        self._flush()
        return float(self.min_tree[_sumtree.ROOT])

    # --- updates ----------------------------------------------------------------------------
    def set(self, index: Any, priority: Any, filled: int) -> None:
        """Validate and store priorities on the device (errors: a later call)."""
        self._flush()
        self._report()
        idx, prio = device_index_and_priority(index, priority, self.device)
        if idx.shape[0] == 0:
            return
        if filled == 0:  # no slot to update: refused here, a wait on the error path only
            raise refused(self.spec, 1, int(idx[0]), 0.0, filled)
        self._update(idx, prio, filled)

    def check(self, index: Any, priority: Any, filled: int) -> None:
        """Raise the ``ValueError`` the device would record for :meth:`set` (waits for it).

        An error the device recorded for an earlier call is raised first; queued new items
        are applied, then the call is checked as the device checks it (the total's
        bound), changing nothing.
        """
        self.check_errors()
        idx, prio = device_index_and_priority(index, priority, self.device)
        check_update(self.spec, self.sum_tree, idx, prio, filled, exact=False)

    def set_new(self, index: int | torch.Tensor, priority: float | None, filled: int) -> None:
        """Queue new items' slots for ``priority`` (``None``: the highest seen).

        They are applied in one batched update before the next read.
        """
        if isinstance(index, int):
            self._pending_slots.append(index)
        else:  # a copy now: the caller may reuse its tensor
            slots = index.reshape(-1)
            if slots.device.type == self.device.type:
                slots = slots.clone()
            else:  # host to GPU: no wait
                slots = slots.to(self.device, non_blocking=slots.is_cpu)
            self._pending_tensors.append(slots)
        self._new_priority = priority
        if len(self._pending_slots) >= _PENDING_LIMIT or len(self._pending_tensors) >= 64:
            self._flush()

    def check_new(self, index: int | torch.Tensor, priority: float | None) -> None:
        """Nothing to check now (no host wait).

        The new total is checked on the device when the items are applied (and refused
        there, reported by a later call).
        """

    def _flush(self) -> None:
        """Give the queued new items their priority, in one batched update."""
        slots, tensors = self._pending_slots, self._pending_tensors
        if not slots and not tensors:
            return
        self._pending_slots, self._pending_tensors = [], []
        if slots:  # a pageable copy that does not wait for the GPU
            tensors.append(torch.tensor(slots, dtype=torch.long).to(self.device, non_blocking=True))
        index = torch.cat(tensors) if len(tensors) > 1 else tensors[0]
        # new items' slots are right by construction (a writer placed them in the storage)
        self._update(index, self._new_value(), self.spec.capacity)

    def _new_value(self) -> torch.Tensor:
        """The new items' priority as a 1-element device tensor (the highest seen: max_t)."""
        priority = self._new_priority
        if priority is None:
            return self._max_t.reshape(1)
        cached = self._new_t
        if cached is None or cached[0] != priority:  # a fill kernel, no copy from the host
            value = torch.empty(1, dtype=torch.float64, device=self.device).fill_(priority)
            cached = self._new_t = (priority, value)
        return cached[1]

    def _update(self, idx: torch.Tensor, prio: torch.Tensor, filled: int) -> None:
        if self.kernels == "triton":
            self._triton.update(
                self.sum_tree,
                self.min_tree,
                self._workspace,
                idx,
                prio,
                filled=filled,
                alpha=self.spec.alpha,
                max_t=self._max_t,
                err=self._err,
            )
        else:
            self._update_torch(idx, prio, filled)
        self._mirror()

    def _mirror(self) -> None:
        """Refresh the record's host copy (no wait)."""
        self._err_host.copy_(self._err, non_blocking=True)

    def _update_torch(self, idx: torch.Tensor, prio: torch.Tensor, filled: int) -> None:
        """The reference of the fused update: the same checks and record, in torch ops."""
        spec, device = self.spec, self.device
        p = prio.double().expand(idx.shape[0])
        code = item_codes(spec, idx, p, filled)
        bad = code != 0
        first = bad.to(torch.uint8).argmax()
        failing = bad.any()
        fine_p = torch.where(bad, 0.0, p)
        values = values_of(fine_p, spec)
        total = self.sum_tree[_sumtree.ROOT].double() + torch.where(bad, 0.0, values).sum()
        fits = torch.where(total <= 0.999 * spec.vmax, 0, 5)
        call = torch.where(failing, code[first], fits)
        good = call == 0
        if self._scratch is None:
            self._scratch = _torch_tree.new_scratch(spec.capacity, device)
        _torch_tree.set_values(
            self.sum_tree,
            self.min_tree,
            self._sum_levels,
            self._min_levels,
            idx.clamp(0, filled - 1),  # refused: every slot gets its current value back
            values,
            self._scratch,
            good,
        )
        self._max_t = torch.where(good, torch.maximum(self._max_t, fine_p.amax()), self._max_t)
        at = torch.stack([idx[first].double(), p[first]])
        details = torch.where(failing, at, _row([-1.0, 0.0], device))
        head = torch.cat([_row([1.0], device), call.double().reshape(1)])
        self._record(good, torch.cat([head, details, _row([filled - 1.0, 0.0, 0.0], device)]))

    def _record(self, good: torch.Tensor, record: torch.Tensor) -> None:
        """Keep the first refused call's record on the device."""
        keep = (self._err[0] != 0) | good
        self._err = torch.where(keep, self._err, record)

    # --- draws ------------------------------------------------------------------------------
    def draw(
        self, batch_size: int, generator: torch.Generator, beta: float, stratified: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots and weights on the device; an all-zero tree yields slot 0, reported later."""
        self._flush()
        self._report()
        device = self.device
        if generator.device == device:
            u = torch.rand(batch_size, generator=generator, dtype=torch.float64, device=device)
        else:  # a generator elsewhere (a CPU one for CUDA trees): its draws are copied over
            u = torch.rand(batch_size, generator=generator, dtype=torch.float64)
            u = u.to(device, non_blocking=u.is_cpu)  # (host to GPU: no wait)
        if self.kernels == "triton":
            index, weight = self._triton.draw(
                self.sum_tree, self.min_tree, self._workspace, u, beta, stratified, self._err
            )
        else:
            if stratified:
                u = (torch.arange(batch_size, dtype=torch.float64, device=device) + u) / batch_size
            root = self.sum_tree[_sumtree.ROOT]
            # targets u * total in float64, as the kernels compute them
            index, weight = _torch_tree.draw(
                self.sum_tree, self.min_tree[_sumtree.ROOT], self._sum_levels, u.mul_(root), beta
            )
            self._record(root > 0, _row([6.0] + [0.0] * (_RECORD - 1), device))
        self._mirror()
        return index, weight

    # --- state and errors ---------------------------------------------------------------------
    def load(self, sum_tree: torch.Tensor, min_tree: torch.Tensor, max_priority: float) -> None:
        """Replace the trees and the highest priority; queued items and errors are dropped."""
        self.sum_tree.copy_(sum_tree)
        self.min_tree.copy_(min_tree)
        self._restart(max_priority)

    def reset(self, max_priority: float) -> None:
        """Forget every priority, queued item and recorded error."""
        self.sum_tree.fill_(0.0)
        self.min_tree.fill_(math.inf)
        self._restart(max_priority)

    def _restart(self, max_priority: float) -> None:
        self._pending_slots, self._pending_tensors = [], []
        self._max_t = torch.full((), max_priority, dtype=torch.float64, device=self.device)
        self._clear_errors()

    def _report(self) -> None:
        """Raise an error the device has already reported (reads host memory: no wait)."""
        if self._err_np[0] != 0:
            self.check_errors()

    def apply_pending(self) -> None:
        """Give the queued new items their priority now (one batched update, no wait)."""
        self._flush()

    def check_errors(self) -> None:
        """Raise the ``ValueError`` of the first call refused since the last check (waits)."""
        self._flush()
        record = self._err.cpu().tolist()  # waits: every queued host copy has landed
        self._clear_errors()
        if record[0]:
            raise ValueError(self._message(*record))

    def _clear_errors(self) -> None:
        self._err = torch.zeros(_RECORD, dtype=torch.float64, device=self.device)
        self._err_np[:] = 0
        # queued after any copy still in flight, so the host copy ends at zero
        self._err_host.copy_(self._err, non_blocking=True)

    def _message(
        self, event: float, code: float, index: float, priority: float, *rest: float
    ) -> str:
        if event == 6:
            return (
                "cannot sample: every priority in the buffer is zero (checked on the "
                f"{self.device.type} device: that draw returned slot 0 only)"
            )
        filled = int(rest[0]) + 1
        message = refusal(self.spec, int(code), int(index), priority, filled)
        return (
            f"{message} (update_priority on {self.device}: checked on the device and "
            "reported at a later call; the refused call changed nothing)"
        )


def _row(values: list[float], device: torch.device) -> torch.Tensor:
    """A float64 row of constants on ``device`` (a copy from the host that does not wait)."""
    return torch.tensor(values, dtype=torch.float64).to(device, non_blocking=True)
