"""Storages: fixed-capacity, map-style :class:`torch.utils.data.Dataset` s of items."""

from rbdata.storages.arrow import ArrowStorage
from rbdata.storages.base import Prepared, Storage
from rbdata.storages.convert import convert
from rbdata.storages.list import ListStorage
from rbdata.storages.memmap import MemmapStorage
from rbdata.storages.tensor import TensorStorage

__all__ = [
    "ArrowStorage",
    "ListStorage",
    "MemmapStorage",
    "Prepared",
    "Storage",
    "TensorStorage",
    "convert",
]
