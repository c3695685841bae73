"""What a storage's files hold, metadata only: :class:`StorageInfo`, and the kinds registry.

:meth:`Storage.describe <rbdata.storages.Storage.describe>` returns a :class:`StorageInfo`
(counts, keys, details) read from a storage's metadata alone; ``rbdata inspect`` renders it.
This module imports no torch (``rbdata inspect`` does not).
Storage classes that own an on-disk directory format register under a *kind* name
(``"memmap"``, ``"arrow"``) with the name of the metadata file that marks such a directory:
:func:`storage_kind` finds the class of a directory or of a dataset entry's ``backend``.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rbdata._core.spec import TENSOR, LayoutSpec

if TYPE_CHECKING:
    from rbdata._core.layout import Layout

__all__ = [
    "REPLAY_NOTE",
    "KeyInfo",
    "StorageInfo",
    "key_infos",
    "regular_size",
]


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


def key_infos(layout: Layout | LayoutSpec | None) -> tuple[KeyInfo, ...]:
    """The :class:`KeyInfo` of every leaf of ``layout`` (none without a layout).

    ``layout`` is a storage's :class:`~rbdata._core.layout.Layout` or, read from metadata
    without torch, a :class:`~rbdata._core.spec.LayoutSpec` (dtypes as names).
    """
    if layout is None:
        return ()
    return tuple(
        KeyInfo(leaf.key, leaf.shape, str(leaf.dtype).removeprefix("torch."), leaf.kind)
        for leaf in layout.leaves
    )


#: how ``describe`` notes writes left in a journal
REPLAY_NOTE = "replayed by the next open; the counts above are before it"


def regular_size(path: Path) -> int | None:
    """The size of ``path`` if it is a regular file (not a symlink), else ``None``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None
