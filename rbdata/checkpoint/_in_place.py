"""Loading a checkpoint into a buffer's existing components: ``rb.load`` and ``rb.loads``.

A load in place keeps the buffer's own objects (its storage's files and device, and whatever
already holds them: a ``DataLoader`` over ``rb.storage``, a sampler bound to it) and copies
the checkpoint's contents into them. It needs components of the same classes and
configuration as the checkpoint's: everything is compared before anything is changed, so a
refused load leaves the buffer as it was.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from rbdata.checkpoint._storages import copy_storage
from rbdata.samplers.base import Sampler
from rbdata.storages.base import Storage
from rbdata.writers.base import Writer

__all__ = ["LoadsDescriptor", "check_same", "load_into"]

_T = TypeVar("_T")
_P = ParamSpec("_P")


def check_same(kind: str, theirs: Any, own: Any, source: str) -> None:
    """Raise ``ValueError`` unless ``theirs`` has the class and config of ``own``.

    The message names the component, the checkpoint's values and this buffer's. A tensor
    storage may load onto another device.
    """
    if type(theirs) is not type(own):
        raise ValueError(
            f"{kind}: {source} holds a {type(theirs).__name__}, this buffer has a "
            f"{type(own).__name__}"
        )
    a, b = theirs.config(), own.config()
    diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if kind == "storage" and "device" in diff:  # a tensor storage may load onto any device
        diff.remove("device")
    if diff:
        given = ", ".join(f"{k}={a.get(k)!r}" for k in diff)
        expected = ", ".join(f"{k}={b.get(k)!r}" for k in diff)
        raise ValueError(f"{kind}: {source} has {given}, this buffer has {expected}")


def load_into(
    parts: tuple[Storage, Sampler, Writer, Any],
    storage: Storage,
    sampler: Sampler,
    writer: Writer,
    source: str,
) -> None:
    """Make ``storage``, ``sampler`` and ``writer`` hold what the loaded ``parts`` hold.

    ``parts`` is what :func:`rbdata.checkpoint.load` or ``from_state_dict`` returned; its
    storage (a private copy or mapping of the checkpoint) is closed in every case.

    Raises:
        ValueError: if a component's class or config differs, or the storage's layout
            (checked before anything is written: nothing is changed then).
    """
    try:
        for kind, theirs, own in zip(
            ("storage", "sampler", "writer"), parts, (storage, sampler, writer), strict=False
        ):
            check_same(kind, theirs, own, source)
        copy_storage(parts[0], storage)
    finally:
        close = getattr(parts[0], "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()
    sampler.load_state_dict(parts[1].state_dict())
    writer.load_state_dict(parts[2].state_dict())


class LoadsDescriptor(Generic[_P]):
    """For implementers: a ``loads`` that builds on the class and loads in place on a buffer.

    torchrl spells "load into this buffer" ``rb.loads(path)``. With a plain classmethod that
    call builds a new buffer and leaves ``rb`` empty, silently: a resumed run then trains on
    an empty buffer. This descriptor sees where it is read from: on the class it is the
    decorated classmethod; on an instance it is ``into`` bound to the instance (it takes the
    same arguments and returns the instance). Docstring, name and signature are the
    classmethod's. Make one with :meth:`in_place`.

    Examples:
        >>> class Box:
        ...     def __init__(self, value=None):
        ...         self.value = value
        ...     def _into(self, value):
        ...         self.value = value
        ...         return self
        ...     @LoadsDescriptor.in_place(_into)
        ...     @classmethod
        ...     def loads(cls, value):
        ...         "A new box, or this one refilled."
        ...         return cls(value)
        >>> box = Box()
        >>> Box.loads(1) is box, box.loads(2) is box, box.value
        (False, True, 2)
    """

    def __init__(self, new: Any, into: Callable[Concatenate[Any, _P], Any]) -> None:
        if not isinstance(new, classmethod):
            raise TypeError(f"new must be a classmethod, got {type(new).__name__}")
        self._new = new
        self._into = into
        functools.update_wrapper(self, new.__func__)  # type: ignore[arg-type]

    @staticmethod
    def in_place(
        into: Callable[Concatenate[Any, _P], Any],
    ) -> Callable[[Any], LoadsDescriptor[_P]]:
        """Decorate a classmethod; read from an instance, it is ``into`` instead."""
        return lambda new: LoadsDescriptor(new, into)

    @overload
    def __get__(self, obj: None, owner: type[_T]) -> Callable[_P, _T]: ...

    @overload
    def __get__(self, obj: _T, owner: type[Any] | None = None) -> Callable[_P, _T]: ...

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self._new.__get__(None, owner)
        return types.MethodType(self._into, obj)
