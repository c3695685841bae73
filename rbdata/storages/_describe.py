"""What a storage's files hold, metadata only: :class:`StorageInfo`, and the kinds registry.

:meth:`Storage.describe <rbdata.storages.Storage.describe>` returns a :class:`StorageInfo`
(counts, keys, details) read from a storage's metadata alone; ``rbdata inspect`` renders it.
Storage classes that own an on-disk directory format register under a *kind* name
(``"memmap"``, ``"arrow"``) with the name of the metadata file that marks such a directory:
:func:`storage_kind` finds the class of a directory or of a dataset entry's ``backend``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rbdata._core.layout import TENSOR, Layout

if TYPE_CHECKING:
    from rbdata.storages.base import Storage

__all__ = [
    "REPLAY_NOTE",
    "KeyInfo",
    "StorageInfo",
    "key_infos",
    "register_kind",
    "regular_size",
    "storage_kind",
    "storage_kinds",
]

_S = TypeVar("_S", bound="type[Storage]")
_KINDS: dict[str, type[Storage]] = {}


@dataclass(frozen=True)
class KeyInfo:
    """One stored key: its path, per-item shape, dtype and kind (tensor, ragged, string)."""

    key: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    kind: str = TENSOR


@dataclass(frozen=True)
class StorageInfo:
    """Counts and layout of a storage: ``format`` is ``"memmap"``, ``"arrow"`` or ``"list"``."""

    format: str
    capacity: int
    length: int
    next_slot: int
    keys: tuple[KeyInfo, ...]
    details: dict[str, Any] = field(default_factory=dict)


def key_infos(layout: Layout | None) -> tuple[KeyInfo, ...]:
    """The :class:`KeyInfo` of every leaf of ``layout`` (none without a layout)."""
    if layout is None:
        return ()
    return tuple(
        KeyInfo(leaf.key, leaf.shape, str(leaf.dtype).removeprefix("torch."), leaf.kind)
        for leaf in layout.leaves
    )


def register_kind(cls: _S) -> _S:
    """Register a storage class under its ``kind`` (a class decorator; inside storages)."""
    kind = cls.kind
    if kind is None or cls.marker_file is None:
        raise TypeError(f"{cls.__name__} names no kind and marker file")
    _KINDS[kind] = cls
    return cls


def storage_kinds() -> dict[str, type[Storage]]:
    """The registered kinds: kind name to storage class (``"memmap"``, ``"arrow"``)."""
    return dict(_KINDS)


def storage_kind(kind: str | None = None, names: Collection[str] = ()) -> type[Storage] | None:
    """The class registered as ``kind``, or else the first whose marker file is in ``names``.

    ``names`` are the entries of a directory (nothing is read or followed). ``None`` if no
    registered class matches.
    """
    if kind is not None:
        return _KINDS.get(kind)
    for cls in _KINDS.values():
        if cls.marker_file in names:
            return cls
    return None


#: how ``describe`` notes writes left in a journal
REPLAY_NOTE = "replayed by the next open; the counts above are before it"


def regular_size(path: Path) -> int | None:
    """The size of ``path`` if it is a regular file (not a symlink), else ``None``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None
