"""The tree backends of the prioritized sampler: one protocol, one spec, one set of messages.

:class:`~rbdata.samplers.PrioritizedSampler` is a thin front over a *tree backend* that owns
the sum tree, the block-min tree and the highest priority seen:

- :class:`~rbdata.samplers._trees.cpu.CpuTrees`: CPU trees walked by numba kernels; a bad
  ``update_priority`` raises at once.
- :class:`~rbdata.samplers._trees.device.DeviceTrees`: trees on any device (CUDA; CPU when
  forced for tests) walked by fused Triton kernels (:mod:`rbdata.samplers._trees.triton_ops`) or,
  without Triton, by the batched torch reference (:mod:`rbdata.samplers._trees.torch_ops`);
  nothing waits for the device, so a bad call is refused on the device and raised later.

Both validate an update the same way (:class:`TreeSpec` and :func:`refusal`): every index in
the filled range, every priority finite and ``>= 0``, every value ``(p + eps) ** alpha``
finite in the tree's dtype, the new total below ``0.999`` of the dtype's largest value; a
refused call changes nothing.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rbdata.errors import IndexOutOfRangeError
from rbdata.samplers._trees import sumtree as _sumtree
from rbdata.samplers._trees import torch_ops as _torch_tree

__all__ = [
    "TreeBackend",
    "TreeSpec",
    "check_beyond",
    "check_new_exact",
    "check_update",
    "interpreting",
    "item_codes",
    "refusal",
    "refused",
    "restored_trees",
    "values_of",
]


def interpreting() -> bool:
    """Whether Triton kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``).

    Read as Triton reads it when a kernel is defined (its ``knobs`` where it has them).
    """
    try:
        import triton

        return bool(triton.knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@dataclass(frozen=True)
class TreeSpec:
    """What a backend needs to know of the sampler: slots, exponent, offset and dtype.

    Args:
        capacity: the number of slots.
        alpha: the prioritization exponent.
        eps: added to every priority before ``alpha``.
        dtype: the trees' dtype (float32 or float64).
    """

    capacity: int
    alpha: float
    eps: float
    dtype: torch.dtype

    @functools.cached_property
    def vmax(self) -> float:
        """The largest value the trees can hold (a stored value or total above it is inf).

        Cached (the spec is frozen): every checked write reads it, and ``torch.finfo``
        costs ~0.3 us.
        """
        return float(torch.finfo(self.dtype).max)

    @functools.cached_property
    def pmax(self) -> float:
        """The largest ``p + eps`` whose value ``(p + eps) ** alpha`` the dtype holds."""
        return _sumtree.largest_base(self.vmax, self.alpha)

    def value(self, p: float) -> float:
        """The value ``(p + eps) ** alpha`` stored for priority ``p`` (float64, inf on overflow)."""
        try:
            return float((p + self.eps) ** self.alpha)
        except OverflowError:
            return math.inf


def refused(spec: TreeSpec, code: int, index: int, priority: float, filled: int) -> ValueError:
    """The exception of refusal ``code`` (see :func:`refusal`), to raise.

    An index outside the filled range is an :class:`~rbdata.errors.IndexOutOfRangeError`
    (an ``IndexError`` and a ``ValueError``), as ``rb[index]`` and a mixture raise it; the
    other refusals are ``ValueError``.
    """
    message = refusal(spec, code, index, priority, filled)
    return IndexOutOfRangeError(message) if code == 1 else ValueError(message)


def refusal(spec: TreeSpec, code: int, index: int, priority: float, filled: int) -> str:
    """The message of refusal ``code`` of an update (``index`` < 0: not known).

    Codes: 1 an index outside ``[0, filled)``, 2 a non-finite priority, 3 a negative one,
    4 a priority whose value overflows the dtype, 5 a total that would overflow it.
    """
    if code == 1:
        return f"index: {index} is outside the filled range [0, {filled})"
    if code == 2:
        return f"priority: expected finite values, got {priority}"
    if code == 3:
        return f"priority: expected values >= 0, got {priority}"
    dtype = str(spec.dtype).replace("torch.", "")
    if code == 4:
        at = f" at index {index}" if index >= 0 else ""
        return (
            f"priority: {priority}{at} gives (p + eps) ** alpha = "
            f"{spec.value(priority):.4g}, which is not finite in the tree's {dtype} "
            f"(largest {spec.vmax:.4g}); nothing was changed"
        )
    return (
        f"priority: the new priorities make the tree's total overflow its {dtype} "
        f"(largest {spec.vmax:.4g}); nothing was changed"
    )


def check_new_exact(
    spec: TreeSpec, sum_tree: torch.Tensor, index: int | torch.Tensor, p: float
) -> None:
    """Raise ``ValueError`` if new items at ``index`` with priority ``p`` overflow the total.

    The exact sum, with the new values in place of the slots they overwrite: for a write
    whose bound (the total plus the new values) comes near the dtype's top.
    """
    count = 1 if isinstance(index, int) else int(index.numel())
    value = spec.value(p)
    slots = torch.tensor([index]) if isinstance(index, int) else index.reshape(-1)
    leaf0 = _sumtree.leaf_offset(sum_tree)
    leaves = sum_tree[leaf0 : leaf0 + spec.capacity].double().cpu()
    leaves[slots.long().cpu()] = value
    if not bool(torch.isfinite(leaves.sum().to(spec.dtype))):
        raise ValueError(
            f"priority: {count} new items at the default priority {p} would make the tree's "
            f"total overflow its {spec.dtype} (largest {spec.vmax:.4g}); lower the priorities "
            "(update_priority) or default_priority; nothing was written"
        )


def item_codes(spec: TreeSpec, idx: torch.Tensor, p: torch.Tensor, filled: int) -> torch.Tensor:
    """Each item's refusal code, as an update checks it (0: fine; see :func:`refusal`).

    1: an index outside ``[0, filled)``, 2: a non-finite, 3: a negative, 4: an overflowing
    priority (``p + eps`` above ``pmax``), in that order of precedence. ``p`` is float64.
    """
    code = torch.where(p + spec.eps <= spec.pmax, 0, 4)
    code = torch.where(p < 0, 3, code)
    code = torch.where(torch.isfinite(p), code, 2)
    return torch.where((idx < 0) | (idx >= filled), 1, code)


def values_of(p: torch.Tensor, spec: TreeSpec) -> torch.Tensor:
    """The values ``(p + eps) ** alpha`` of priorities ``p`` (float64, a new tensor)."""
    v = p + spec.eps if spec.eps else p.clone()
    return v.pow_(spec.alpha) if spec.alpha != 1 else v


def check_update(
    spec: TreeSpec,
    sum_tree: torch.Tensor,
    idx: torch.Tensor,
    prio: torch.Tensor,
    filled: int,
    exact: bool,
) -> None:
    """Raise the ``ValueError`` that storing ``prio`` at ``idx`` would raise; change nothing.

    The checks of an update, in its order (the first bad item, :func:`item_codes`), then
    the new total: ``exact`` (CPU trees), the exact sum with the new values in place of the
    slots they overwrite (the last of duplicates wins), as the numba kernel refuses it; else
    (device trees) the bound ``total + sum(new values) <= 0.999 * largest`` that the device
    refuses past. Reads the device's values (waits for it).

    Args:
        spec: the trees' spec.
        sum_tree: the sum tree (current: queued new items applied).
        idx: 1-D int64 slots, on the tree's device.
        prio: one priority per slot (float), on the tree's device.
        filled: the number of filled slots.
        exact: check the exact new total (CPU trees) rather than the bound.
    """
    if idx.shape[0] == 0:
        return
    p = prio.double().reshape(-1)
    code = item_codes(spec, idx, p, filled)
    bad = code != 0
    if bool(bad.any()):
        first = int(bad.to(torch.uint8).argmax())
        raise refused(spec, int(code[first]), int(idx[first]), float(p[first]), filled)
    values = values_of(p, spec)
    total = float(sum_tree[_sumtree.ROOT])
    bound = total + float(values.sum())
    if bound <= 0.999 * spec.vmax:
        return
    if not exact:
        raise ValueError(refusal(spec, 5, -1, 0.0, filled))
    leaf0 = _sumtree.leaf_offset(sum_tree)
    leaves = sum_tree[leaf0 : leaf0 + spec.capacity].double().clone()
    scratch = _torch_tree.new_scratch(spec.capacity, idx.device)
    leaves[idx] = _torch_tree.last_writes(idx, values, scratch)  # duplicates: the last wins
    if not bool(torch.isfinite(leaves.sum().to(spec.dtype))):
        raise ValueError(refusal(spec, 5, -1, 0.0, filled))


def restored_trees(
    state: dict[str, Any], spec: TreeSpec, current: TreeBackend
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The trees and highest priority of a sampler state, validated and made consistent.

    Only the leaves are trusted: the inner nodes are recomputed from them (bit for bit the
    saved ones if untampered), so every tree walk ends on a slot that holds mass.

    Raises:
        ValueError: for trees of another shape, NaN, negative or infinite priorities,
            priorities past ``spec.capacity``, an overflowing total or a bad max priority.
    """
    trees = []
    for name, own in (("sum_tree", current.sum_tree), ("min_tree", current.min_tree)):
        tree = torch.as_tensor(state[name])
        if tree.shape != own.shape or not tree.is_floating_point():
            raise ValueError(
                f"state: {name} is {tree.dtype} {tuple(tree.shape)}, expected a float "
                f"tree of shape {tuple(own.shape)}"
            )
        trees.append(tree)
    if bool(torch.isnan(trees[0]).any()) or bool((trees[0] < 0).any()):
        raise ValueError("state: sum_tree holds NaN or negative priorities")
    new_sum = trees[0].to(device=current.device, dtype=spec.dtype).clone()
    new_min = torch.full_like(current.min_tree, math.inf)
    leaves = new_sum[_sumtree.leaf_offset(new_sum) :]
    if not bool(torch.isfinite(leaves).all()):
        raise ValueError("state: sum_tree holds infinite priorities")
    if bool((leaves[spec.capacity :] != 0).any()):
        raise ValueError(
            f"state: sum_tree holds priorities past the sampler's {spec.capacity} slots"
        )
    _sumtree.rebuild(new_sum, new_min)
    if not bool(torch.isfinite(new_sum[_sumtree.ROOT])):
        raise ValueError(f"state: the priorities' total overflows the tree's {new_sum.dtype}")
    max_priority = float(state["max_priority"])
    if not (math.isfinite(max_priority) and max_priority >= 0):
        raise ValueError(f"state: max_priority must be finite and >= 0, got {max_priority}")
    if not max_priority + spec.eps <= spec.pmax:
        raise ValueError(f"state: max_priority {max_priority} overflows the tree's dtype")
    return new_sum, new_min, max_priority


def check_beyond(tree: torch.Tensor, filled: int, capacity: int) -> None:
    """Raise unless every slot of ``tree`` at or past ``filled`` has value 0 (never drawn)."""
    leaf0 = _sumtree.leaf_offset(tree)
    if filled < capacity and bool((tree[leaf0 + filled :] != 0).any()):
        raise ValueError(
            f"priorities: slots past the {filled} items of the storage have priorities "
            "(a sampler state or updates that do not belong to this storage); they "
            "would be drawn"
        )


class TreeBackend(Protocol):
    """The trees of a prioritized sampler and the operations the sampler runs on them.

    ``sum_tree`` and ``min_tree`` are the state (``_sumtree`` layouts, on :attr:`device`).
    """

    spec: TreeSpec
    device: torch.device
    sum_tree: torch.Tensor
    min_tree: torch.Tensor

    def set(self, index: Any, priority: Any, filled: int) -> None:
        """Validate and store priorities (duplicates: the last one wins); see the module."""

    def set_new(self, index: int | torch.Tensor, priority: float | None, filled: int) -> None:
        """Give the new items at ``index`` ``priority`` (``None``: the highest seen)."""

    def check(self, index: Any, priority: Any, filled: int) -> None:
        """Raise the ``ValueError`` that :meth:`set` would raise (see :func:`check_update`)."""

    def check_new(self, index: int | torch.Tensor, priority: float | None) -> None:
        """Raise ``ValueError`` if new items at ``index`` overflow the total (CPU trees).

        Device trees check it on the device when the items are applied (no host wait).
        """

    def draw(
        self, batch_size: int, generator: torch.Generator, beta: float, stratified: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots drawn in proportion to their values and their float32 weights."""
        ...

    def total(self) -> float:
        """The sum of the stored values (waits for the device)."""
        ...

    def min(self) -> float:
        """The smallest positive stored value (``inf`` if none; waits for the device)."""
        ...

    @property
    def max_priority(self) -> float:
        """The highest priority seen so far (waits for the device)."""
        ...

    def load(self, sum_tree: torch.Tensor, min_tree: torch.Tensor, max_priority: float) -> None:
        """Replace the trees (validated, consistent) and the highest priority seen."""

    def reset(self, max_priority: float) -> None:
        """Forget every priority."""

    def apply_pending(self) -> None:
        """Apply what is queued (new items' priorities on a device), so the trees are current."""

    def check_errors(self) -> None:
        """Raise the error of a call refused on the device since the last check."""
