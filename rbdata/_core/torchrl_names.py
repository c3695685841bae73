"""torchrl's spellings that rbdata spells differently: errors that name rbdata's spelling.

Code ported from torchrl mostly runs as is (``extend``, ``add``, ``sample``, ``batch_size=``,
``max_size=``, ``SliceSampler(num_slices=, slice_len=, end_key=, traj_key=)``...). Where a
torchrl keyword has another name here, or no equivalent, the constructor raises a
``TypeError`` that says what to write instead, rather than Python's bare "unexpected keyword
argument". ``docs/torchrl.md`` has the whole table.

:func:`torchrl_keywords` decorates an ``__init__``; the check runs only for keyword
arguments, before the constructor, and keeps the signature (for ``inspect``, Sphinx and type
checkers). :func:`torchrl_attribute_error` is what a class's ``__getattr__`` raises for a
torchrl attribute name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from rbdata._core.shown import shown

__all__ = [
    "BUFFER_ATTRIBUTES",
    "BUFFER_KEYWORDS",
    "MEMMAP_KEYWORDS",
    "PRIORITIZED_KEYWORDS",
    "PRIORITIZED_SLICE_KEYWORDS",
    "SLICE_KEYWORDS",
    "TENSOR_KEYWORDS",
    "WITHOUT_REPLACEMENT_KEYWORDS",
    "refuse_data_capacity",
    "torchrl_attribute_error",
    "torchrl_keywords",
]

P = ParamSpec("P")
R = TypeVar("R")

_PIPELINE = (
    "prefetching and pinned memory are pipeline stages in rbdata: "
    "Loader(Prefetcher(PinMemory(rbdata.nodes.BufferSource(rb)), prefetch_factor=4)) "
    "(see docs/pipelines.md)"
)
_CAPACITY = (
    "use `capacity=` (torchrl's PrioritizedSampler(max_capacity, alpha, beta) is "
    "PrioritizedSampler(capacity, alpha, beta), or PrioritizedSampler(storage, alpha, beta))"
)
_WRAP = (
    "TensorStorage(max_size) preallocates on the first write; torchrl's TensorStorage(tensor), "
    "which wraps existing data, is TensorStorage(len(data)) followed by extend(data)"
)

#: ``ReplayBuffer(...)``
BUFFER_KEYWORDS = {
    "prefetch": _PIPELINE,
    "pin_memory": _PIPELINE,
    "collate_fn": (
        "storages gather a whole batch themselves; use `transform=` for a function applied "
        "to every sampled batch"
    ),
    "generator": "each sampler owns its generator: pass `generator=` to the sampler",
    "max_size": (
        "the capacity belongs to the storage: ReplayBuffer(TensorStorage(max_size)) (or "
        "MemmapStorage(max_size, path=...))"
    ),
}
#: ``MemmapStorage(...)``
MEMMAP_KEYWORDS = {
    "scratch_dir": (
        "use `path=` (torchrl's LazyMemmapStorage(max_size, scratch_dir=d) is "
        "MemmapStorage(max_size, path=d))"
    ),
    "device": (
        "a MemmapStorage lives in CPU memory (memory-mapped files); for GPU memory use "
        "TensorStorage(max_size, device=...)"
    ),
}
#: ``TensorStorage(...)``
TENSOR_KEYWORDS = {"storage": _WRAP}
#: ``PrioritizedSampler(...)``
PRIORITIZED_KEYWORDS = {
    "max_capacity": _CAPACITY,
    "max_size": _CAPACITY,
    "reduction": (
        "rbdata takes one priority per item: reduce per-step priorities yourself before "
        "update_priority"
    ),
}
#: ``SliceSampler(...)``
SLICE_KEYWORDS = dict.fromkeys(
    ("ends", "trajectories"),
    "episode boundaries come from the data: `end_key=` (a done flag per step) or "
    "`traj_key=` (an episode id per step)",
) | {
    "cache_values": (
        "the episode index is always kept, updated on every write: drop `cache_values=`"
    ),
}
#: ``PrioritizedSliceSampler(...)``
PRIORITIZED_SLICE_KEYWORDS = SLICE_KEYWORDS | {
    "max_capacity": (
        "use `capacity=` (torchrl's PrioritizedSliceSampler(max_capacity, alpha, beta, ...) is "
        "PrioritizedSliceSampler(capacity, alpha, beta, ...), or "
        "PrioritizedSliceSampler(storage, alpha, beta, ...))"
    ),
    "reduction": PRIORITIZED_KEYWORDS["reduction"],
}
#: ``SamplerWithoutReplacement(...)``
WITHOUT_REPLACEMENT_KEYWORDS = {
    "shuffle": (
        "every epoch is a fresh random permutation; to read in storage order, iterate "
        "DataLoader(storage, batch_size=...)"
    ),
}
#: attributes and methods of torchrl's replay buffer that ``ReplayBuffer`` names otherwise
BUFFER_ATTRIBUTES = {
    "update_tensordict_priority": (
        "use rb.update_priority(batch): a TensorDict with an 'index' entry and the buffer's "
        "priority_key entry"
    ),
    "_storage": "use rb.storage",
    "_sampler": "use rb.sampler",
    "_writer": "use rb.writer",
    "_transform": "use rb.transform",
    "_batch_size": "use rb.batch_size",
    "append_transform": "pass one callable as ReplayBuffer(transform=...)",
    "insert_transform": "pass one callable as ReplayBuffer(transform=...)",
    "dump": "use rb.dumps(path)",
}


def torchrl_keywords(hints: Mapping[str, str]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate an ``__init__``: a keyword of ``hints`` raises ``TypeError`` with its hint.

    Examples:
        >>> class Storage:
        ...     @torchrl_keywords({"scratch_dir": "use `path=`"})
        ...     def __init__(self, max_size: int, path: str | None = None) -> None:
        ...         self.path = path
        >>> Storage(10, scratch_dir="/tmp")
        Traceback (most recent call last):
        ...
        TypeError: Storage has no `scratch_dir=` argument: use `path=`
    """

    def decorate(init: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(init)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            if kwargs:
                for name in kwargs:
                    hint = hints.get(name)
                    if hint is not None:
                        owner = type(args[0]).__name__ if args else init.__qualname__
                        raise TypeError(f"{owner} has no `{name}=` argument: {hint}")
            return init(*args, **kwargs)

        return checked

    return decorate


def torchrl_attribute_error(owner: Any, name: str, hints: Mapping[str, str]) -> AttributeError:
    """The ``AttributeError`` for ``owner.name``: with the hint if torchrl has that name.

    Examples:
        >>> class Buffer:
        ...     pass
        >>> str(torchrl_attribute_error(Buffer(), "dump", {"dump": "use rb.dumps(path)"}))
        "'Buffer' object has no attribute 'dump': use rb.dumps(path)"
    """
    text = f"{type(owner).__name__!r} object has no attribute {name!r}"
    hint = hints.get(name)
    return AttributeError(text if hint is None else f"{text}: {hint}", name=name, obj=owner)


def refuse_data_capacity(owner: Any, max_size: Any) -> None:
    """Raise ``TypeError`` if ``max_size`` is data (torchrl's ``TensorStorage(tensor)``).

    The message shows the data's type, shape and dtype, never its values.

    Examples:
        >>> import torch
        >>> class TensorStorage:
        ...     pass
        >>> refuse_data_capacity(TensorStorage(), torch.zeros(1000))
        Traceback (most recent call last):
        ...
        TypeError: TensorStorage(max_size) takes a capacity, got a Tensor of shape (1000,) and ...
    """
    if getattr(max_size, "ndim", 0):  # a 0-d tensor is a number, checked as one
        raise TypeError(
            f"{type(owner).__name__}(max_size) takes a capacity, got {shown(max_size)}: {_WRAP}"
        )
