"""Storages: fixed-capacity, map-style :class:`torch.utils.data.Dataset` s of items."""

from rbdata.storages._collate import tensordict_collate, wrap_for_collate
from rbdata.storages._describe import KeyInfo, StorageInfo
from rbdata.storages.arrow import ArrowStorage
from rbdata.storages.base import (
    Codec,
    Prepared,
    SavedStorage,
    Storage,
    WriteTarget,
    register_kind,
    storage_kind,
    storage_kinds,
)
from rbdata.storages.convert import convert
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

# the on-disk kinds, in the order ``rbdata inspect`` recognises their directories
register_kind(MemmapStorage)
register_kind(ArrowStorage)
register_kind(FrameStackStorage)
