"""The checks of :class:`~rbdata.samplers.PrioritizedSampler`: options, devices, storage, state.

Pure functions the sampler calls where its arguments arrive (construction, ``attach``,
``load_state_dict``): each raises an error that names the argument, what was expected and what
was given, before the sampler changes anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import Any

import torch

from rbdata._core.device import resolve_device
from rbdata._core.index import check_capacity
from rbdata.samplers._priority_input import check_exponent
from rbdata.samplers._trees.backend import TreeSpec

__all__ = [
    "check_source_size",
    "check_state_capacity",
    "generator_of_state",
    "priority_option",
    "priority_options",
    "source_device",
    "tree_device",
    "tree_options",
    "tree_spec",
]

_CPU_GENERATOR_STATE = torch.Generator().get_state().numel()


def tree_spec(capacity: Any, alpha: Any, eps: Any, dtype: Any) -> TreeSpec:
    """The trees' slots, exponent, offset and dtype, each checked.

    Examples:
        >>> tree_spec(8, 0.6, 1e-8, torch.float32).capacity
        8
        >>> tree_spec(8, 0.6, "cuda", torch.float32)
        Traceback (most recent call last):
        ...
        TypeError: eps must be a number, got 'cuda': the device is the fifth argument ...
    """
    if isinstance(eps, (str, torch.device)):
        raise TypeError(
            f"eps must be a number, got {eps!r}: the device is the fifth argument (device={eps!r})"
        )
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    return TreeSpec(
        check_capacity(capacity, "capacity"),
        check_exponent(alpha, "alpha"),
        check_exponent(eps, "eps"),
        dtype,
    )


def priority_option(spec: TreeSpec, value: Any, name: str) -> float:
    """A priority option whose value ``(p + eps) ** alpha`` the tree's dtype can hold."""
    p = check_exponent(value, name)
    if not p + spec.eps <= spec.pmax:
        raise ValueError(
            f"{name}: {p!r} gives (p + eps) ** alpha = {spec.value(p)!r}, which is not "
            f"finite in the tree's dtype (largest {spec.vmax:.4g})"
        )
    return p


def priority_options(
    spec: TreeSpec, default_priority: Any, max_priority: Any
) -> tuple[float | None, float]:
    """The options ``default_priority`` (``None``: the highest seen) and ``max_priority``.

    Examples:
        >>> spec = tree_spec(8, 1.0, 0.0, torch.float32)
        >>> priority_options(spec, None, 1)
        (None, 1.0)
        >>> priority_options(spec, 1e39, 1.0)
        Traceback (most recent call last):
        ...
        ValueError: default_priority: 1e+39 gives (p + eps) ** alpha = ..., which is not finite ...
    """
    if default_priority is not None:
        default_priority = priority_option(spec, default_priority, "default_priority")
    return default_priority, priority_option(spec, max_priority, "max_priority")


def source_device(source: Any) -> torch.device:
    """The device of a storage (``storage.device``); CPU for anything without one."""
    device = getattr(source, "device", None)
    return torch.device(device) if isinstance(device, (torch.device, str)) else torch.device("cpu")


def tree_device(device: Any, source: Any) -> torch.device:
    """The trees' device: ``device``, or ``source``'s (:func:`source_device`) for ``None``.

    Raises ``RuntimeError`` (or ``ValueError``) for a device that cannot hold the trees.
    """
    device = source_device(source) if device is None else device
    return resolve_device(device, "use device='cpu', or device=None to follow the storage")


def check_source_size(storage: Sized, capacity: int, owner: str = "PrioritizedSampler") -> None:
    """Raise ``ValueError`` if ``storage`` can hold more items than ``capacity`` slots."""
    size = getattr(storage, "capacity", None)
    if size is None:
        size = len(storage)
    if int(size) > capacity:
        raise ValueError(
            f"capacity: {owner} has {capacity} slots, fewer than the "
            f"{int(size)} items its storage can hold; give it the storage's capacity"
        )


def check_state_capacity(state: Mapping[str, Any], capacity: int) -> None:
    """Raise ``ValueError`` unless a saved state is for ``capacity`` slots."""
    if int(state["capacity"]) != capacity:
        raise ValueError(
            f"capacity: the state is for {state['capacity']} slots, this sampler has {capacity}"
        )


def generator_of_state(
    saved: Any, generator: torch.Generator, device: torch.device
) -> torch.Generator | None:
    """A new generator in the saved state when that state is of the other kind (CPU / CUDA).

    ``None`` when ``generator`` itself takes the state: a state of its own kind, or a CUDA
    state for trees on the CPU (then torch's own error); otherwise a generator of the saved
    kind (a CUDA one on ``device``), so that the sampler continues with the saved draws.
    """
    saved = torch.as_tensor(saved)
    cpu_state = saved.numel() == _CPU_GENERATOR_STATE
    same_kind = cpu_state == (generator.device.type == "cpu")
    if same_kind or (not cpu_state and device.type == "cpu"):
        return None
    gen = torch.Generator(device="cpu" if cpu_state else device)
    gen.set_state(saved)
    return gen


def tree_options(sampler: Any) -> dict[str, Any]:
    """The tree options in a prioritized sampler's ``config`` (plain and slice samplers).

    Capacity, exponents, device, tree dtype and the other tree options.
    ``device`` is the one asked for: ``None`` (follow the storage) stays ``None``.
    """
    return {
        "capacity": sampler.capacity,
        "alpha": sampler.alpha,
        "beta": sampler.beta,
        "eps": sampler.eps,
        "device": sampler._device_arg,
        "stratified": sampler.stratified,
        "default_priority": sampler.default_priority,
        "max_priority": sampler._initial_max,
        "dtype": sampler._spec.dtype,
    }
