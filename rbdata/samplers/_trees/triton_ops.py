"""Launching the fused Triton tree kernels: the workspace, a draw, an update.

The kernels and how they work: :mod:`rbdata.samplers._trees.triton_kernels`. Tree values and
draws are those of the numba kernels (``tests/samplers/test_triton_tree.py`` checks them bit for
bit through Triton's CPU interpreter).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch
import triton

from rbdata.samplers._trees import sumtree as _sumtree
from rbdata.samplers._trees.triton_kernels import INTERPRET, check_kernel, draw_kernel, write_kernel

__all__ = ["INTERPRET", "Workspace", "draw", "update"]

_BLOCK = 128
_NO_BAD = 2**62  # "no failing item" in the first-failing-position word (see check_kernel)


def _mode(exponent: float) -> int:
    return 0 if exponent == 0 else 1 if exponent == 1 else 2


def _launch(kernel: Any, n: int, *args: Any, **constants: Any) -> None:
    """Run ``kernel`` over ``n`` items, one program per block.

    In the interpreter numpy's overflow warnings are off: a masked lane may hold inf or NaN,
    as on a GPU, where nothing warns.
    """
    grid = (triton.cdiv(n, _BLOCK),)
    with np.errstate(all="ignore") if INTERPRET else contextlib.nullcontext():
        kernel[grid](*args, BLOCK=_BLOCK, **constants)


class Workspace:
    """The per-tree words of the fused kernels, on the trees' device.

    ``stamp`` (one int32 per slot, ``-1`` between calls), ``count`` and ``touched`` (one
    int32 per inner node, 0 between calls), the call's accumulators, and ``params``: the
    float64 constants ``eps, alpha, pmax, 0.999 vmax, beta`` (a kernel's float argument
    would be float32). Every kernel pair leaves the words as it found them; :meth:`reset`
    restores them after an interrupted call.

    Args:
        sum_tree: the sum tree (``_sumtree.new_tree``).
        min_tree: its block-min tree (``_sumtree.new_block_min_tree``).
    """

    def __init__(self, sum_tree: torch.Tensor, min_tree: torch.Tensor) -> None:
        device = sum_tree.device
        sum_offsets = _sumtree.layout(sum_tree)
        self.depth = len(sum_offsets)
        self.offsets = torch.tensor(sum_offsets, dtype=torch.int64, device=device)
        self.min_offsets = torch.tensor(_sumtree.layout(min_tree), dtype=torch.int64, device=device)
        leaf0 = sum_offsets[-1]
        self.stamp = torch.empty(int(sum_tree.shape[0]) - leaf0, dtype=torch.int32, device=device)
        self.count = torch.empty(leaf0, dtype=torch.int32, device=device)
        self.touched = torch.empty(leaf0, dtype=torch.int32, device=device)
        self.acc_sum = torch.empty(1, dtype=torch.float64, device=device)
        self.acc_bad = torch.empty(1, dtype=torch.int64, device=device)
        self.acc_top = torch.empty(1, dtype=torch.float64, device=device)
        self.done = torch.empty(1, dtype=torch.int32, device=device)
        self.good = torch.empty(1, dtype=torch.int32, device=device)
        self.params = torch.zeros(5, dtype=torch.float64, device=device)
        self._values: list[float] = [0.0] * 5
        self.reset()

    def reset(self) -> None:
        """Every word back to its value between calls."""
        self.stamp.fill_(-1)
        for words in (self.count, self.touched, self.acc_sum, self.acc_top, self.done, self.good):
            words.zero_()
        self.acc_bad.fill_(_NO_BAD)

    def set(self, position: int, value: float) -> None:
        """Set constant ``position`` of :attr:`params` (a fill kernel, only on a change)."""
        if self._values[position] != value:
            self.params[position].fill_(value)
            self._values[position] = value

    def constants(self, eps: float, alpha: float, pmax: float, vmax: float) -> None:
        """The update's constants (``pmax``: the largest ``p + eps`` the dtype holds)."""
        self.set(0, float(eps))
        self.set(1, float(alpha))
        self.set(2, float(pmax))
        self.set(3, 0.999 * float(vmax))


def draw(
    sum_tree: torch.Tensor,
    min_tree: torch.Tensor,
    workspace: Workspace,
    uniforms: torch.Tensor,
    beta: float,
    stratified: bool,
    err: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots and float32 weights of ``uniforms`` (float64 in ``[0, 1)``), in one kernel.

    ``err`` is the sampler's error record (float64, on the device): an all-zero tree is
    recorded there (event 6) if nothing is recorded yet.
    """
    n = int(uniforms.shape[0])
    index = torch.empty(n, dtype=torch.int64, device=sum_tree.device)
    weight = torch.empty(n, dtype=torch.float32, device=sum_tree.device)
    if n:
        workspace.set(4, float(beta))
        _launch(
            draw_kernel,
            n,
            sum_tree,
            workspace.offsets,
            workspace.depth,
            min_tree,
            uniforms,
            index,
            weight,
            err,
            n,
            workspace.params,
            STRATIFIED=bool(stratified),
            BETA_MODE=_mode(-beta),
        )
    return index, weight


def update(
    sum_tree: torch.Tensor,
    min_tree: torch.Tensor,
    workspace: Workspace,
    index: torch.Tensor,
    priority: torch.Tensor,
    *,
    filled: int,
    alpha: float,
    max_t: torch.Tensor,
    err: torch.Tensor,
) -> None:
    """Validate and store priorities at ``index`` (last write wins) in both trees.

    Args:
        sum_tree: the sum tree.
        min_tree: its block-min tree.
        workspace: the trees' :class:`Workspace`, its constants set
            (:meth:`Workspace.constants`).
        index: 1-D int64 slots on the trees' device (anything: checked here).
        priority: 1-D float32/float64 priorities, one per slot, or a 1-element tensor that
            applies to every slot (new items: the highest priority seen or the default).
        filled: the slots that may hold a priority (at least 1).
        alpha: the prioritization exponent (picks the kernels' power: 0, 1 or any).
        max_t: 0-d float64, the highest priority seen (raised by an accepted call).
        err: the error record: a refused call (nothing changes) is recorded if nothing is.
    """
    n = int(index.shape[0])
    if n == 0:
        return
    index = index.contiguous()
    if priority.shape[0] != 1 and priority.stride(0) == 0:
        priority = priority[:1]  # an expanded scalar: read once
    scalar = priority.shape[0] == 1 and n != 1
    priority = priority.contiguous()
    common = (index, priority, n, int(filled), workspace.params)
    alpha_mode = _mode(alpha)
    try:
        _launch(
            check_kernel,
            n,
            *common,
            sum_tree,
            workspace.offsets,
            workspace.depth,
            workspace.stamp,
            workspace.count,
            workspace.touched,
            workspace.acc_sum,
            workspace.acc_bad,
            workspace.acc_top,
            workspace.done,
            workspace.good,
            max_t,
            err,
            SCALAR=scalar,
            ALPHA_MODE=alpha_mode,
        )
        _launch(
            write_kernel,
            n,
            *common,
            sum_tree,
            min_tree,
            workspace.offsets,
            workspace.min_offsets,
            workspace.depth,
            workspace.stamp,
            workspace.count,
            workspace.touched,
            workspace.good,
            SCALAR=scalar,
            ALPHA_MODE=alpha_mode,
        )
    except BaseException:  # an interrupted pair must not leave stamps for the next call
        workspace.reset()
        raise
