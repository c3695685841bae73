"""Priority-update input: exponents, and index/priority arguments as arrays the kernels read.

Pure functions used by :class:`~rbdata.samplers.PrioritizedSampler`: every shape, dtype and
length is settled here, before any tree or kernel sees the data.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from rbdata._core.shown import shown

__all__ = [
    "as_numpy",
    "capacity_and_source",
    "check_exponent",
    "contiguous_cpu_pair",
    "cpu_copy",
    "device_index_and_priority",
    "index_and_priority",
]


def check_exponent(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {shown(value)}")
    return float(value)


def capacity_and_source(
    first: Any, data_source: Any, owner: str = "PrioritizedSampler"
) -> tuple[Any, Any]:
    """A prioritized sampler's first argument: a capacity, or the storage it reads.

    Every sampler takes its storage first; the prioritized ones (``owner``), whose trees are
    sized at construction, also take a capacity there (torchrl's ``max_capacity``). A
    storage gives both: ``(storage.capacity, storage)``.
    """
    capacity = getattr(first, "capacity", None)
    if capacity is None or not hasattr(first, "__len__"):
        return first, data_source
    if data_source is not None and data_source is not first:
        raise ValueError(f"{owner}: the storage given first is not data_source")
    return capacity, first


_FLOATS = (torch.float32, torch.float64)


def contiguous_cpu_pair(index: Any, priority: Any) -> bool:
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


def index_and_priority(index: Any, priority: Any) -> tuple[np.ndarray, np.ndarray]:
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
    idx = as_numpy(index, np.int64, "index")
    if idx.ndim == 0:
        idx = idx.reshape(1)
    prio = as_numpy(priority, np.float64, "priority")
    if prio.ndim == 0:
        prio = np.full(idx.shape, float(prio))
    if prio.shape[0] != idx.shape[0]:
        raise ValueError(
            f"priority: expected {idx.shape[0]} values (one per index), got "
            f"{prio.shape[0]}: index and priority have different lengths"
        )
    return idx, prio


def device_index_and_priority(
    index: Any, priority: Any, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D int64 indices and float32/float64 priorities of equal length, on ``device``.

    The input of the device path of :class:`~rbdata.samplers.PrioritizedSampler`: tensors are
    flattened and moved to ``device`` (from the host with ``non_blocking=True``; CUDA tensors
    for CUDA trees stay where they are), never read on the host: no host synchronisation.
    Kinds, dtypes and lengths are checked here from the metadata, as
    :func:`index_and_priority` does (same errors); the *values* (range, NaN, sign) are for
    the caller to check on the device. Lists, arrays and scalars go through numpy first. A
    scalar priority (a number or a 0-d tensor) applies to every index.
    """
    if isinstance(index, torch.Tensor):
        if index.dtype is torch.bool or index.is_floating_point() or index.is_complex():
            kind = str(index.dtype).replace("torch.", "")
            raise TypeError(f"index: expected integers, got dtype {kind}")
        idx = index.detach().reshape(-1)  # host to GPU without waiting (back: waits)
        idx = idx.to(device=device, dtype=torch.long, non_blocking=idx.is_cpu)
    else:  # a copy: torch.from_numpy would share (and warn about) a read-only array
        idx = torch.tensor(as_numpy(index, np.int64, "index").reshape(-1)).to(
            device, non_blocking=True
        )
    n = idx.shape[0]
    if isinstance(priority, torch.Tensor):
        prio = priority.detach()
        if prio.is_complex():
            raise TypeError(f"priority: expected numbers, got dtype {prio.dtype}")
        if prio.dtype not in _FLOATS:  # integers, bools, half precision: float64 as on CPU
            prio = prio.to(torch.float64)
        prio = prio.to(device, non_blocking=prio.is_cpu)
        prio = prio.expand(n) if prio.dim() == 0 else prio.reshape(-1)
    else:
        arr = as_numpy(priority, np.float64, "priority")
        if arr.ndim == 0:  # one value for every index: filled on the device, no copy
            return idx, torch.full((n,), float(arr), dtype=torch.float64, device=device)
        prio = torch.tensor(arr).to(device, non_blocking=True)
    if prio.shape[0] != n:
        raise ValueError(
            f"priority: expected {n} values (one per index), got "
            f"{prio.shape[0]}: index and priority have different lengths"
        )
    return idx, prio


def detached(value: Any) -> Any:
    """``value`` without autograd: a tensor detached, a list or tuple with its tensors detached.

    Priorities are often computed with grad (``(q - target).abs()``); a list of such
    tensors would make numpy call ``numpy()`` on each, which raises.
    """
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return [v.detach() if isinstance(v, torch.Tensor) else v for v in value]
    return value


def as_numpy(value: Any, dtype: type, name: str) -> np.ndarray:
    """A 1-D (or 0-d) numpy view or copy of a tensor, array, list or scalar, of ``dtype``."""
    value = detached(value)
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        value = value.numpy()
    arr = value if type(value) is np.ndarray else np.asarray(value)
    if arr.size == 0:  # [] is float64 to numpy: an empty list of indices is no dtype error
        return np.zeros(0, dtype)
    if arr.ndim == 1 and arr.dtype == np.float32 and dtype is np.float64:
        return np.ascontiguousarray(arr)  # the kernels read float32 as it is
    if dtype is np.int64 and arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got dtype {arr.dtype}")
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name}: expected numbers, got dtype {arr.dtype}")
    arr = arr.astype(dtype, copy=False)
    return arr if arr.ndim == 0 else np.ascontiguousarray(arr.reshape(-1))


def cpu_copy(value: Any, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A flat CPU tensor copy of a tensor or a (possibly read-only) numpy array."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device="cpu", dtype=dtype).reshape(-1).clone()
    return torch.from_numpy(np.array(value)).to(dtype).reshape(-1)
