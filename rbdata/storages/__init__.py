"""Storages: fixed-capacity, map-style :class:`torch.utils.data.Dataset` s of items.

The names below are imported on first use, as :mod:`rbdata`'s are: ``import
rbdata.storages.kinds`` (the on-disk kinds, what ``rbdata inspect`` reads) imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rbdata._core.lazy import lazy_names

if TYPE_CHECKING:  # what the lazy names below are, for type checkers
    from rbdata.storages._collate import tensordict_collate, wrap_for_collate
    from rbdata.storages._convert import convert
    from rbdata.storages._describe import KeyInfo, StorageInfo
    from rbdata.storages.arrow import ArrowStorage
    from rbdata.storages.base import (
        Codec,
        Prepared,
        SavedStorage,
        Storage,
        WriteTarget,
        storage_kind,
        storage_kinds,
    )
    from rbdata.storages.frames import FrameStackStorage
    from rbdata.storages.list import ListStorage
    from rbdata.storages.memmap import DirectoryWriter, MemmapStorage
    from rbdata.storages.tensor import TensorStorage

__all__ = [
    "ArrowStorage",
    "Codec",
    "DirectoryWriter",
    "FrameStackStorage",
    "KeyInfo",
    "ListStorage",
    "MemmapStorage",
    "Prepared",
    "SavedStorage",
    "Storage",
    "StorageInfo",
    "TensorStorage",
    "WriteTarget",
    "convert",
    "storage_kind",
    "storage_kinds",
    "tensordict_collate",
    "wrap_for_collate",
]

#: each lazy name → the module that defines it
_LAZY = {
    "tensordict_collate": "rbdata.storages._collate",
    "wrap_for_collate": "rbdata.storages._collate",
    "KeyInfo": "rbdata.storages._describe",
    "StorageInfo": "rbdata.storages._describe",
    "ArrowStorage": "rbdata.storages.arrow",
    **dict.fromkeys(
        (
            "Codec",
            "Prepared",
            "SavedStorage",
            "Storage",
            "WriteTarget",
            "storage_kind",
            "storage_kinds",
        ),
        "rbdata.storages.base",
    ),
    "convert": "rbdata.storages._convert",
    "FrameStackStorage": "rbdata.storages.frames",
    "ListStorage": "rbdata.storages.list",
    "DirectoryWriter": "rbdata.storages.memmap",
    "MemmapStorage": "rbdata.storages.memmap",
    "TensorStorage": "rbdata.storages.tensor",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
