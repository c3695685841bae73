"""Helpers shared by the storages' persistence hooks (``dump``/``restore``/``describe``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rbdata.errors import CheckpointError

if TYPE_CHECKING:
    from rbdata.storages.base import Storage

__all__ = ["check_config", "check_dumped_dir", "check_max_size", "saved_counts"]


def saved_counts(storage: Storage, state: Any) -> tuple[int, int]:
    """The saved length and next slot, checked against the capacity of ``storage``."""
    name = type(storage).__name__
    if not isinstance(state, dict):
        raise CheckpointError(f"{name}: the state must be an object")
    n, nxt = state.get("length"), state.get("next")
    if (
        not isinstance(n, int)
        or not isinstance(nxt, int)
        or isinstance(n, bool)
        or isinstance(nxt, bool)
        or not 0 <= n <= storage.capacity
        or not 0 <= nxt < storage.capacity
    ):
        raise CheckpointError(f"{name}: length {n!r:.40} / next slot {nxt!r:.40} out of range")
    return n, nxt


def check_config(storage: Storage, config: dict[str, Any]) -> None:
    """The config saved with a checkpoint against what the restored data says."""
    for key, value in storage.config().items():
        if key in config and config[key] != value and key != "device":
            raise CheckpointError(
                f"{type(storage).__name__}: the data has {key}={value!r}, the metadata says "
                f"{config[key]!r}"
            )


def check_dumped_dir(name: str, directory: Path, state: Any, meta: str) -> None:
    """The state of a storage dumped as files names ``directory``, a plain directory.

    ``name`` is the storage class's name (for the message).
    """
    if not isinstance(state, dict) or state.get("dir") != directory.name:
        raise CheckpointError(f"{name}: the state must name its directory {directory.name!r}")
    if directory.is_symlink() or not directory.is_dir():
        what = "a symlink" if directory.is_symlink() else "missing"
        raise CheckpointError(f"{directory}: the storage directory is {what} (no {meta})")


def check_max_size(config: dict[str, Any], capacity: int, file: Path) -> None:
    """``max_size`` of a checkpoint's storage config against the capacity of the files."""
    if "max_size" in config and config["max_size"] != capacity:
        raise CheckpointError(
            f"{file}: capacity {capacity}, the checkpoint's storage config says max_size="
            f"{config['max_size']!r:.40}"
        )
