"""A checkpoint's storage: saved, checked, restored and copied through the storage's own hooks.

Each storage class owns how it is persisted (see the persistence hooks of
:class:`~rbdata.storages.Storage`): tensor storages as a memmap directory of whole arrays,
:class:`~rbdata.storages.ArrowStorage` as copies of its Arrow IPC files,
:class:`~rbdata.storages.ListStorage` as items in the JSON state. This module gives them the
checkpoint's directory, its pickle-free codec and tensor list, and prefixes the checksums.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rbdata.checkpoint import _codec
from rbdata.checkpoint._storage_checks import DIR, check_storage
from rbdata.storages.base import SavedStorage, Storage

__all__ = [
    "check_storage",
    "copy_storage",
    "dump_storage",
    "restore_storage",
    "storage_from_state",
    "storage_state",
]


def dump_storage(
    storage: Storage, root: Path, tensors: list[torch.Tensor], fsync: bool = True
) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
    """Write ``storage``'s data under checkpoint directory ``root``.

    Returns its JSON state and the checksum entries of the files written (names relative to
    ``root``), computed while writing.
    """
    state, sums = storage.dump(root / DIR, _codec, tensors, fsync)
    return state, {f"{DIR}/{name}": rec for name, rec in sums.items()}


def restore_storage(
    cls: type[Storage], config: dict[str, Any], state: Any, root: Path, tensors: list, plan: Any
) -> Storage:
    """Rebuild a storage saved by :func:`dump_storage` under ``root``.

    ``plan`` is what :func:`check_storage` returned for it (which must have run first).
    """
    return cls.restore(SavedStorage(root / DIR, config, state, _codec, tensors, plan))


def storage_state(storage: Storage) -> dict[str, Any]:
    """The state of ``storage`` as tensors and plain values (``weights_only``-loadable)."""
    return storage.dump_state(_codec)


def storage_from_state(cls: type[Storage], config: dict[str, Any], state: Any) -> Storage:
    """Rebuild a storage from :func:`storage_state` (in memory or a temporary directory)."""
    return cls.from_state(config, state, _codec)


def copy_storage(src: Storage, dst: Storage) -> None:
    """Make ``dst`` (same class and capacity) hold exactly what ``src`` holds, slot by slot."""
    if dst.layout is not None and src.layout is not None and dst.layout != src.layout:
        raise ValueError(
            f"storage: the checkpoint's layout {src.layout} differs from this buffer's {dst.layout}"
        )
    dst.copy_from(src)
