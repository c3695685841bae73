"""The checkpoint format's names and the registry of the classes a checkpoint may rebuild.

Shared by :mod:`rbdata.checkpoint` (dump, load) and its ``describe`` (which reads a
checkpoint without loading it).
"""

from __future__ import annotations

from typing import Any, TypeVar

from rbdata.checkpoint._format import FORMAT, FORMAT_VERSION, META_FILE, STATE_FORMAT, TENSORS
from rbdata.errors import CheckpointError
from rbdata.samplers import (
    PrioritizedSampler,
    PrioritizedSliceSampler,
    SamplerWithoutReplacement,
    SequenceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    UniformSampler,
)
from rbdata.samplers.base import Sampler
from rbdata.storages import (
    ArrowStorage,
    FrameStackStorage,
    ListStorage,
    MemmapStorage,
    TensorStorage,
)
from rbdata.storages.base import Storage
from rbdata.writers import ImmutableWriter, MaxValueWriter, RoundRobinWriter
from rbdata.writers.base import Writer

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "META_FILE",
    "STATE_FORMAT",
    "TENSORS",
    "class_name",
    "component_class",
    "is_registered",
    "register",
    "registered_name",
]

_BASES: dict[str, type] = {"storage": Storage, "sampler": Sampler, "writer": Writer}
_REGISTRY: dict[str, type] = {}

T = TypeVar("T", bound=type)


def registered_name(cls: type) -> str:
    """The name a checkpoint records for ``cls`` (rbdata's classes by their bare name)."""
    if cls.__module__.split(".")[0] == "rbdata":
        return cls.__name__
    return f"{cls.__module__}.{cls.__qualname__}"


def register(cls: T) -> T:
    """Let checkpoints name and rebuild ``cls`` (a ``Storage``, ``Sampler`` or ``Writer``).

    rbdata's own classes are registered already. A registered class is rebuilt as
    ``cls(**component.config())`` followed by ``load_state_dict``; override ``config`` if
    your constructor differs from the parent's. Usable as a class decorator.

    Examples:
        >>> from rbdata.writers import RoundRobinWriter
        >>> @register
        ... class MyWriter(RoundRobinWriter):
        ...     pass
        >>> component_class(registered_name(MyWriter), "writer") is MyWriter
        True
    """
    if not isinstance(cls, type) or not issubclass(cls, tuple(_BASES.values())):
        raise TypeError(f"cls must be a Storage, Sampler or Writer subclass, got {cls!r}")
    name = registered_name(cls)
    known = _REGISTRY.get(name)
    if known is not None and known is not cls:
        raise ValueError(f"another class is registered as {name!r}")
    _REGISTRY[name] = cls
    return cls


for _cls in (
    TensorStorage,
    MemmapStorage,
    ArrowStorage,
    ListStorage,
    FrameStackStorage,
    UniformSampler,
    SamplerWithoutReplacement,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    SequenceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    RoundRobinWriter,
    ImmutableWriter,
    MaxValueWriter,
):
    register(_cls)


def is_registered(name: str) -> bool:
    """Whether a class is registered as ``name`` (any kind)."""
    return name in _REGISTRY


def component_class(name: Any, kind: str) -> type:
    """The registered class called ``name`` for component ``kind`` (storage/sampler/writer)."""
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None or not issubclass(cls, _BASES[kind]):
        raise CheckpointError(
            f"{kind}: unknown class {name!r} (known: {', '.join(sorted(_REGISTRY))}); "
            "register custom classes with rbdata.checkpoint.register"
        )
    return cls


def class_name(obj: Any, kind: str) -> str:
    """The name checkpoints record for ``obj``'s class (``kind``: storage, sampler, writer).

    Raises:
        TypeError: the class is not registered (:func:`register`).

    Examples:
        >>> from rbdata import UniformSampler
        >>> class_name(UniformSampler(range(3)), "sampler")
        'UniformSampler'
    """
    cls = type(obj)
    if _REGISTRY.get(registered_name(cls)) is not cls:
        raise TypeError(
            f"cannot checkpoint the {kind} {cls.__name__}: its class is not registered "
            "(rbdata.checkpoint.register)"
        )
    return registered_name(cls)
