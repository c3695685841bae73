"""Pickle-free, atomic checkpoints of replay buffers, and ``torch.save``-able state dicts.

A checkpoint directory holds ``CURRENT`` (naming the live subdirectory, switched by one atomic
file rename) and the subdirectory: ``checkpoint.json`` (format version, the class, constructor
config and state of the storage, sampler and writer), ``tensors.bin`` (the state tensors:
priority trees, generator state... as raw arrays) and ``storage/`` (the items: raw
memory-mapped arrays or Arrow IPC files). Loading reads JSON and raw arrays only; component
classes are looked up in a registry of known classes, never imported by name.

:class:`~rbdata.ReplayBuffer` exposes this as ``dumps``/``loads``/``load`` and
``state_dict``/``load_state_dict``; :func:`load_into` copies loaded components into a
buffer's own (``rb.load``, and ``rb.loads`` called on a buffer).

The names below are imported on first use: the format's names (``META_FILE``...) and
:func:`describe` (what ``rbdata inspect`` reads) import no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rbdata._core.lazy import lazy_names

if TYPE_CHECKING:  # what the lazy names below are, for type checkers
    from rbdata.checkpoint._describe import CheckpointInfo, describe
    from rbdata.checkpoint._directory import Components, dump, from_state_dict, load, state_dict
    from rbdata.checkpoint._format import FORMAT_VERSION, META_FILE
    from rbdata.checkpoint._in_place import LoadsDescriptor, load_into
    from rbdata.checkpoint._registry import component_class, register
    from rbdata.checkpoint._storages import copy_storage
    from rbdata.errors import CheckpointError

__all__ = [
    "FORMAT_VERSION",
    "META_FILE",
    "CheckpointError",
    "CheckpointInfo",
    "Components",
    "LoadsDescriptor",
    "component_class",
    "copy_storage",
    "describe",
    "dump",
    "load",
    "load_into",
    "register",
    "state_dict",
    "from_state_dict",
]

#: each lazy name → the module that defines it
_LAZY = {
    "FORMAT_VERSION": "rbdata.checkpoint._format",
    "META_FILE": "rbdata.checkpoint._format",
    "CheckpointError": "rbdata.errors",
    "CheckpointInfo": "rbdata.checkpoint._describe",
    "describe": "rbdata.checkpoint._describe",
    **dict.fromkeys(
        ("Components", "dump", "from_state_dict", "load", "state_dict"),
        "rbdata.checkpoint._directory",
    ),
    "LoadsDescriptor": "rbdata.checkpoint._in_place",
    "load_into": "rbdata.checkpoint._in_place",
    "component_class": "rbdata.checkpoint._registry",
    "register": "rbdata.checkpoint._registry",
    "copy_storage": "rbdata.checkpoint._storages",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
