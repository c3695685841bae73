"""``PrioritizedSampler``: proportional prioritized replay (Schaul et al., 2016) on a sum tree."""

from __future__ import annotations

import math
from collections.abc import Sized
from typing import Any

import numpy as np
import torch

from rbdata._device import resolve_device
from rbdata._index import check_capacity
from rbdata.samplers import _sumtree, _torch_tree
from rbdata.samplers._priority_input import (
    check_exponent,
    contiguous_cpu_pair,
    cpu_copy,
    device_index_and_priority,
    index_and_priority,
)
from rbdata.samplers.base import Sampler, check_bool

if _sumtree.HAS_NUMBA:
    from rbdata.samplers._sumtree import _nb_draw_at, _nb_set_priorities, _nb_set_priorities_at

__all__ = ["PrioritizedSampler"]

_CPU_GENERATOR_STATE = torch.Generator().get_state().numel()

#: Run the device path (batched torch trees, priorities checked on the device, errors reported
#: at a later call) on CPU trees too: the code that runs on CUDA, testable without a GPU. Read
#: when a sampler places its trees (construction, attach, unpickling); tests set it.
_DEVICE_PATH_ON_CPU = False

#: slots of new items the device path queues on the host before applying them in one update
_PENDING_LIMIT = 65_536

#: the record of the first refused call on the device: code (0: none; 1: update_priority,
#: 6: a draw from an all-zero tree), lowest and highest index, smallest and largest priority,
#: bound of the new total, filled slots - 1 at the time
_RECORD = 7
_BAD_INPUT, _ALL_ZERO = 1.0, 6.0
#: the attributes derived from the trees and their device, rebuilt instead of pickled
_DERIVED = (
    "_one",
    "_sum_np",
    "_min_np",
    "_offsets_np",
    "_sum_levels",
    "_min_levels",
    "_scratch",
    "_max_t",
    "_err",
    "_err_host",
    "_err_np",
    "_filled_t",
    "_signs",
    "_base_bounds",
    "_filled_unit",
    "_bad_input",
    "_all_zero",
    "_no_details",
    "_default_t",
    "_pending_slots",
    "_pending_tensors",
)


def _resolve_device(device: Any) -> torch.device:
    """``device`` as a torch device that can hold the trees, or an error that says why not."""
    return resolve_device(device, "use device='cpu', or device=None to follow the storage")


def _source_device(source: Any) -> torch.device:
    """The device of a storage (``storage.device``); CPU for anything without one."""
    device = getattr(source, "device", None)
    return torch.device(device) if isinstance(device, (torch.device, str)) else torch.device("cpu")


class PrioritizedSampler(Sampler):
    """Sample item ``i`` with probability ``P(i) = v_i / sum_j v_j``, ``v_i = (p_i + eps)^alpha``.

    Importance weights are ``w_i = (N P(i))^-beta / max_j w_j`` over the items in the buffer,
    i.e. ``(v_i / v_min)^-beta`` with ``v_min`` the smallest positive stored value (kept in a
    min tree), so the largest possible weight is 1. Batches drawn through a
    :class:`~rbdata.ReplayBuffer` or a :class:`~rbdata.samplers.BatchSampler` carry ``"index"``
    and ``"weight"``.

    New items get the highest priority seen so far (``default_priority=None``) or a fixed one.
    The trees live on ``device``: on CPU a numba kernel walks them; on CUDA batched torch ops
    do (see :mod:`!rbdata.samplers._torch_tree`): every draw of a batch descends the tree
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
        capacity: number of slots (the storage capacity).
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

    def __init__(
        self,
        capacity: int,
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
        super().__init__(data_source, generator)
        #: the generator is the sampler's own: it may move to the trees' device
        self._own_generator = generator is None
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
        #: the device asked for (``None``: the storage's, resolved by attach)
        self._device_arg = None if device is None else str(torch.device(device))
        self.device = _resolve_device(_source_device(data_source) if device is None else device)
        self._sum = _sumtree.new_tree(self.capacity, "sum", dtype, self.device)
        self._min = _sumtree.new_block_min_tree(self.capacity, dtype, self.device)
        self._leaf0 = _sumtree.leaf_offset(self._sum)
        self._max_priority = self._initial_max
        self._setup()
        self._match_generator()
        if data_source is not None:
            self.check_source(data_source)

    def _setup(self) -> None:
        """The state derived from the trees' device: numba's views, or the torch path's."""
        on_cpu = self.device.type == "cpu"
        self._fast = _sumtree.HAS_NUMBA and on_cpu and not _DEVICE_PATH_ON_CPU
        #: the device path: checks on the device, errors reported later, queued new items
        self._on_device = not on_cpu or _DEVICE_PATH_ON_CPU
        self._pending_slots: list[int] = []
        self._pending_tensors: list[torch.Tensor] = []
        if self._fast:  # numpy views of the trees for the numba kernels
            self._sum_np, self._min_np = self._sum.numpy(), self._min.numpy()
            self._one = (np.zeros(1, np.int64), np.zeros(1, np.float64))  # see _set_one
            self._offsets_np = np.asarray(_sumtree.layout(self._sum), dtype=np.int64)
            return
        self._sum_levels = _torch_tree.Levels(
            _sumtree.layout(self._sum), self._sum.shape[0], self.device
        )
        self._min_levels = _torch_tree.Levels(
            _sumtree.layout(self._min), self._min.shape[0], self.device
        )
        self._scratch: torch.Tensor | None = None  # allocated by the first update
        if self._on_device:
            self._max_t = torch.full(
                (), self._max_priority, dtype=torch.float64, device=self.device
            )
            self._err = torch.zeros(_RECORD, dtype=torch.float64, device=self.device)
            # the record's host copy, refreshed by a non-blocking copy after every call: read
            # without waiting (pinned memory, so the copy is asynchronous on CUDA)
            pinned = self.device.type == "cuda"
            self._err_host = torch.zeros(_RECORD, dtype=torch.float64, pin_memory=pinned)
            self._err_np = self._err_host.numpy()
            self._filled_t: tuple[int, torch.Tensor] | None = None
            # constants of the checks, made once (fill kernels, no copy from the host)
            self._signs = self._constant([1.0, -1.0, 1.0, -1.0, -1.0])
            # the largest p with p + eps <= pmax: exactly the CPU kernel's per-item check
            top = self._pmax - self.eps
            if math.isfinite(top):
                while top + self.eps > self._pmax:
                    top = math.nextafter(top, -math.inf)
                while math.nextafter(top, math.inf) + self.eps <= self._pmax:
                    top = math.nextafter(top, math.inf)
            self._base_bounds = self._constant([0.0, 0.0, 0.0, top, 0.999 * self._vmax])
            self._filled_unit = self._constant([0.0, 1.0, 0.0, 0.0, 0.0])
            self._bad_input = self._constant([_BAD_INPUT])
            self._all_zero = self._constant([_ALL_ZERO] + [0.0] * (_RECORD - 1))
            self._no_details = self._constant([0.0] * 4)
            default = self.default_priority
            self._default_t = self._constant([0.0 if default is None else default])[0]

    def _constant(self, values: list[float]) -> torch.Tensor:
        """A float64 tensor of ``values`` on the trees' device, one fill kernel per value."""
        tensor = torch.empty(len(values), dtype=torch.float64, device=self.device)
        for i, value in enumerate(values):
            tensor[i].fill_(value)  # (``tensor[i] = value`` would copy from the host)
        return tensor

    def _match_generator(self) -> None:
        """A private generator draws on the trees' device (same seed): no copy per draw."""
        gen = self.generator
        if self._own_generator and gen.device.type != self.device.type:
            self.generator = torch.Generator(device=self.device).manual_seed(gen.initial_seed())

    def _place(self, device: torch.device) -> None:
        """Move the trees (and a private generator) to ``device``."""
        if device == self.device:
            return
        self.check_errors()
        max_priority = self.max_priority  # applies queued new items first
        self._sum = self._sum.to(device)
        self._min = self._min.to(device)
        self.device = device
        self._max_priority = max_priority
        self._setup()
        self._match_generator()

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
        """The highest priority seen so far (new items get it unless ``default_priority``).

        On CUDA it is kept on the device; reading it here waits for the GPU.
        """
        if self._on_device:
            self._flush()
            return float(self._max_t)
        return self._max_priority

    def priority_values(self, index: Any = None) -> torch.Tensor:
        """The stored values ``(p + eps)^alpha`` at ``index`` (default: every slot)."""
        self._flush()
        leaves = self._sum[self._leaf0 : self._leaf0 + self.capacity]
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
        filled = self._filled()
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
        if self._on_device:
            self._update_on_device(index, priority, filled)
            return
        idx, prio = index_and_priority(index, priority)
        if self._fast:  # validation, transform and both trees in one kernel
            self._set_on_cpu(idx, prio, filled)
            return
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
            stored = torch.tensor(prio, device=self.device).double().add_(self.eps)
            self._store(torch.tensor(idx, device=self.device), stored.pow_(self.alpha))
        self._max_priority = max(self._max_priority, top)

    # --- the device path (CUDA; CPU when forced) ---------------------------------------------
    def _store(self, index: torch.Tensor, values: torch.Tensor, keep: Any = None) -> None:
        """Write ``values`` at in-range ``index`` with the batched torch tree ops."""
        if self._scratch is None:
            self._scratch = _torch_tree.new_scratch(self.capacity, self.device)
        _torch_tree.set_values(
            self._sum,
            self._min,
            self._sum_levels,
            self._min_levels,
            index,
            values,
            self._scratch,
            keep,
        )

    def _update_on_device(self, index: Any, priority: Any, filled: int) -> None:
        """``update_priority`` without a host synchronisation: checks run on the device."""
        self._flush()
        self._report()
        idx, prio = device_index_and_priority(index, priority, self.device)
        if idx.shape[0] == 0:
            return
        if filled == 0:  # no slot to update: refused here, a wait on the error path only
            self._refuse(1, int(idx[0]), 0.0, filled)
        p = prio.double()
        lo, hi = torch.aminmax(idx)
        p_lo, p_hi = torch.aminmax(p)  # NaN propagates into both
        values = self._values(p)
        # the new total is at most the old one plus the new values (a bound, no tree read)
        total = self._sum[_sumtree.ROOT].double() + values.sum()
        details = torch.cat([torch.stack([lo, hi]).double(), torch.stack([p_lo, p_hi, total])])
        good = self._accepts(details, filled)
        # refused: every slot (clamped into range) gets its current value back
        self._store(idx.clamp(0, filled - 1), values, good)
        self._max_t = torch.where(good, torch.maximum(self._max_t, p_hi), self._max_t)
        self._record(good, torch.cat([self._bad_input, details, self._bounds(filled)[1:2]]))

    def _values(self, p: torch.Tensor) -> torch.Tensor:
        """``(p + eps) ** alpha`` of float64 ``p`` (no op for eps=0 or alpha=1: exact)."""
        values = p + self.eps if self.eps else p.clone()
        return values if self.alpha == 1 else values.pow_(self.alpha)

    def _bounds(self, filled: int) -> torch.Tensor:
        """The offsets of :meth:`_accepts`' margins for ``filled`` slots (cached, on device)."""
        cached = self._filled_t
        if cached is None or cached[0] != filled:  # one kernel, no copy from the host
            bounds = torch.add(self._base_bounds, self._filled_unit, alpha=float(filled - 1))
            cached = self._filled_t = (filled, bounds)
        return cached[1]

    def _accepts(self, details: torch.Tensor, filled: int) -> torch.Tensor:
        """Whether a call passes every check, as a 0-d bool on the device.

        ``details`` holds the lowest and highest index, the smallest and largest priority
        and the bound of the new total; each check is a margin that must be ``>= 0`` (a NaN
        fails): ``lo``, ``filled - 1 - hi``, ``p_lo``, ``top - p_hi``, ``0.999 vmax - total``.
        """
        margins = torch.addcmul(self._bounds(filled), details, self._signs)
        return margins.amin() >= 0

    def _record(self, good: torch.Tensor, record: torch.Tensor) -> None:
        """Keep the first refused call's record on the device; mirror it to the host (async)."""
        keep = (self._err[0] != 0) | good
        self._err = torch.where(keep, self._err, record)
        self._err_host.copy_(self._err, non_blocking=True)

    def _report(self) -> None:
        """Raise an error the device has already reported (reads host memory: no wait)."""
        if self._err_np[0] != 0:
            self.check_errors()

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
        if not self._on_device:
            return
        self._flush()
        record = self._err.cpu().tolist()  # waits: every queued host copy has landed
        self._clear_errors()
        code = record[0]
        if code:
            raise ValueError(self._recorded_message(*record))

    def _clear_errors(self) -> None:
        self._err = torch.zeros(_RECORD, dtype=torch.float64, device=self.device)
        self._err_np[:] = 0
        # queued after any copy still in flight, so the host copy ends at zero
        self._err_host.copy_(self._err, non_blocking=True)

    def _recorded_message(
        self, code: float, lo: float, hi: float, p_lo: float, p_hi: float, *rest: float
    ) -> str:
        if code == _ALL_ZERO:
            return (
                "cannot sample: every priority in the buffer is zero (checked on the "
                f"{self.device.type} device: that draw returned slot 0 only)"
            )
        n = int(rest[-1]) + 1  # the record ends with filled - 1
        if lo < 0 or hi >= n:
            message = self._refusal(1, int(lo if lo < 0 else hi), 0.0, n)
        elif math.isnan(p_lo) or math.isnan(p_hi):
            message = self._refusal(2, -1, math.nan, n)
        elif not math.isfinite(p_lo) or not math.isfinite(p_hi):
            message = self._refusal(2, -1, p_lo if not math.isfinite(p_lo) else p_hi, n)
        elif p_lo < 0:
            message = self._refusal(3, -1, p_lo, n)
        elif not p_hi + self.eps <= self._pmax:
            message = self._refusal(4, -1, p_hi, n)
        else:  # every input was fine: the total
            message = self._refusal(5, 0, 0.0, n)
        return (
            f"{message} (update_priority on {self.device}: checked on the device and "
            "reported at a later call; the refused call changed nothing)"
        )

    def _flush(self) -> None:
        """Give the queued new items the default priority, in one batched update."""
        slots, tensors = self._pending_slots, self._pending_tensors
        if not slots and not tensors:
            return
        self._pending_slots, self._pending_tensors = [], []
        if slots:  # a pageable copy that does not wait for the GPU
            tensors.append(torch.tensor(slots, dtype=torch.long).to(self.device, non_blocking=True))
        index = torch.cat(tensors) if len(tensors) > 1 else tensors[0]
        default = self.default_priority
        top = self._max_t if default is None else self._default_t
        values = self._values(top).expand(index.shape[0])
        # the items' slots and priority are right by construction: only the total can fail
        total = self._sum[_sumtree.ROOT].double() + values.sum()
        details = torch.cat([self._no_details, total.reshape(1)])
        filled = max(1, self._filled())
        good = self._accepts(details, filled)
        self._store(index, values, good)
        if default is not None:
            self._max_t = torch.where(good, torch.maximum(self._max_t, top), self._max_t)
        self._record(good, torch.cat([self._bad_input, details, self._bounds(filled)[1:2]]))

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
        raise ValueError(self._refusal(code, index, priority, filled))

    def _refusal(self, code: int, index: int, priority: float, filled: int) -> str:
        """The message of refusal ``code`` (``index`` < 0: not known)."""
        if code == 1:
            return f"index: {index} is outside the filled range [0, {filled})"
        if code == 2:
            return f"priority: expected finite values, got {priority}"
        if code == 3:
            return f"priority: expected values >= 0, got {priority}"
        dtype = str(self._sum.dtype).replace("torch.", "")
        if code == 4:
            at = f" at index {index}" if index >= 0 else ""
            return (
                f"priority: {priority}{at} gives (p + eps) ** alpha = "
                f"{self._value(priority):.4g}, which is not finite in the tree's {dtype} "
                f"(largest {self._vmax:.4g}); nothing was changed"
            )
        return (
            f"priority: the new priorities make the tree's total overflow its {dtype} "
            f"(largest {self._vmax:.4g}); nothing was changed"
        )

    def _default(self) -> float:
        return self._max_priority if self.default_priority is None else self.default_priority

    def __getstate__(self) -> dict[str, Any]:
        """The trees travel as arrays; what derives from them is rebuilt on arrival."""
        if self._on_device:
            self._max_priority = self.max_priority  # applies queued new items first
        derived = {name: self.__dict__.pop(name) for name in _DERIVED if name in self.__dict__}
        try:
            return super().__getstate__()
        finally:
            self.__dict__.update(derived)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._setup()

    def check_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Refuse a write whose new items' default priority would overflow the tree's total.

        On CUDA the total is checked on the device when the new items' priorities are
        applied (an overflow is then refused and reported like a bad ``update_priority``).
        """
        if self._on_device:
            return
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
        """Give newly written items the default (or highest seen) priority.

        On CUDA the slots are queued and applied in one batched update before the next read
        of the priorities (the result is the same: the highest priority cannot change in
        between without that read).
        """
        if self._on_device:
            if isinstance(index, int):
                self._pending_slots.append(index)
            else:  # a copy now: the caller may reuse its tensor
                slots = index.reshape(-1)
                if slots.device.type == self.device.type:
                    slots = slots.clone()
                else:  # host to GPU: no wait
                    slots = slots.to(self.device, non_blocking=slots.is_cpu)
                self._pending_tensors.append(slots)
            if len(self._pending_slots) >= _PENDING_LIMIT or len(self._pending_tensors) >= 64:
                self._flush()
            return
        if isinstance(index, int):
            if self._fast:  # the per-step add: one slot through the kernel, no conversions
                self._set_one(index, self._default())
                return
            index = torch.tensor([index])
        self.update_priority(index, self._default())

    def _set_one(self, slot: int, priority: float) -> None:
        """:meth:`update_priority` of one slot on the CPU (numba) trees, validated alike."""
        idx, prio = self._one
        idx[0] = slot
        prio[0] = priority
        self._set_on_cpu(idx, prio, self._filled())

    def _filled(self) -> int:
        """Slots that may hold a priority: the source's length, capped at the tree's slots.

        Whatever the source claims, never past the tree: the kernels trust this bound.
        """
        source = self.data_source
        return self.capacity if source is None else min(len(source), self.capacity)

    def _set_on_cpu(self, idx: np.ndarray, prio: np.ndarray, filled: int) -> None:
        """Validate, transform and store priorities in both CPU trees (one kernel call)."""
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
        if top > self._max_priority:
            self._max_priority = top

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
        device = self.device if self._device_arg is not None else _source_device(storage)
        device = _resolve_device(device)
        self._flush()
        self._check_beyond(self._sum, len(storage))
        super().attach(storage)
        self._place(device)  # device=None: the trees follow the storage
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
        if self._on_device:
            self._pending_slots, self._pending_tensors = [], []
            self._max_t = torch.full((), self._initial_max, dtype=torch.float64, device=self.device)
            self._clear_errors()

    # --- sampling -----------------------------------------------------------------------
    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Draw indices proportionally to priority, with their importance weights.

        Indices and weights are on the trees' device. On CUDA nothing waits for the GPU: a
        tree whose priorities are all zero yields slot 0 and is reported by a later call
        (see :meth:`check_errors`) instead of raising here.
        """
        self._length()  # a bound, non-empty storage
        if not self._fast:
            return self._draw_torch(batch_size)
        u = torch.rand(batch_size, generator=self.generator, dtype=torch.float64)
        if self.stratified:
            u = (torch.arange(batch_size, dtype=torch.float64) + u) / batch_size
        # one kernel reads u and fills index and weight in place
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

    def _draw_torch(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The batched torch descent (CUDA, or CPU without numba); no wait on the device path."""
        if self._on_device:
            self._flush()
            self._report()
        gen, device = self.generator, self.device
        if gen.device == device:
            u = torch.rand(batch_size, generator=gen, dtype=torch.float64, device=device)
        else:  # a generator elsewhere (a CPU one for CUDA trees): its draws are copied over
            u = torch.rand(batch_size, generator=gen, dtype=torch.float64, device=gen.device)
            u = u.to(device, non_blocking=u.is_cpu)  # (host to GPU: no wait; back: waits)
        if self.stratified:
            u = (torch.arange(batch_size, dtype=torch.float64, device=device) + u) / batch_size
        root = self._sum[_sumtree.ROOT]
        if not self._on_device and float(root) <= 0:  # an all-zero tree has no distribution
            raise ValueError("cannot sample: every priority in the buffer is zero")
        # targets u * total in float64, as the kernel computes them
        index, weight = _torch_tree.draw(
            self._sum, self._min[_sumtree.ROOT], self._sum_levels, u.mul_(root), self.beta
        )
        if self._on_device:  # an all-zero tree is reported by a later call
            self._record(root > 0, self._all_zero)
        return index, {"weight": weight}

    # --- state --------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Capacity, exponents, device, tree dtype and the other constructor options.

        ``device`` is the one asked for: ``None`` (follow the storage) stays ``None``, so a
        checkpoint loads onto whatever device its storage is restored to.
        """
        return {
            "capacity": self.capacity,
            "alpha": self.alpha,
            "beta": self.beta,
            "eps": self.eps,
            "device": self._device_arg,
            "stratified": self.stratified,
            "default_priority": self.default_priority,
            "max_priority": self._initial_max,
            "dtype": self._sum.dtype,
        }

    def state_dict(self) -> dict[str, Any]:
        """Generator state, both trees and the highest priority seen."""
        max_priority = self.max_priority  # applies queued new items first
        state = super().state_dict()
        state.update(
            capacity=self.capacity,
            sum_tree=self._sum.clone(),
            min_tree=self._min.clone(),
            max_priority=max_priority,
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
        self._load_generator(state)  # checked by torch before any change
        self._sum.copy_(new_sum)
        self._min.copy_(new_min)
        self._max_priority = max_priority
        if self._on_device:  # the state replaces queued new items and recorded errors
            self._pending_slots, self._pending_tensors = [], []
            self._max_t = torch.full((), max_priority, dtype=torch.float64, device=self.device)
            self._clear_errors()

    def _load_generator(self, state: dict[str, Any]) -> None:
        """Restore the generator; a state of the other kind (CPU / CUDA) brings its kind.

        A checkpoint of a CUDA sampler made with a CPU generator, loaded into one that made
        its own CUDA generator (or the reverse), continues with the saved generator's draws.
        """
        saved = torch.as_tensor(state["generator"])
        cpu_state = saved.numel() == _CPU_GENERATOR_STATE
        same_kind = cpu_state == (self.generator.device.type == "cpu")
        if same_kind or (not cpu_state and self.device.type == "cpu"):
            super().load_state_dict(state)  # (torch's own error for a foreign state)
            return
        gen = torch.Generator(device="cpu" if cpu_state else self.device)
        gen.set_state(saved)
        self.generator = gen
        self._restored = True

    def _check_beyond(self, tree: torch.Tensor, filled: int) -> None:
        """Raise unless every slot at or past ``filled`` has priority 0 (is never drawn)."""
        if filled < self.capacity and bool((tree[self._leaf0 + filled :] != 0).any()):
            raise ValueError(
                f"priorities: slots past the {filled} items of the storage have priorities "
                "(a sampler state or updates that do not belong to this storage); they "
                "would be drawn"
            )
