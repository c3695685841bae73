"""The on-disk storage kinds, without torch: a directory's kind by its marker file.

A storage class that owns a directory format (``MemmapStorage``'s ``layout.json``,
``ArrowStorage``'s ``_rbdata.json``, ``FrameStackStorage``'s ``frames.json``) is a
:class:`DiskKind` here: its kind name, its marker file, where its class is and where the
function is that describes one of its directories from metadata alone. Entries name modules
and are imported on use, so ``rbdata inspect`` finds and describes a directory without
importing torch, through the very functions the classes' :meth:`~rbdata.storages.Storage.describe`
call. :func:`~rbdata.storages.storage_kind` (the classes) reads this registry too.

Examples:
    >>> disk_kind(names={"layout.json", "header.bin"}).kind
    'memmap'
    >>> [k.marker_file for k in disk_kinds().values()]
    ['layout.json', '_rbdata.json', 'frames.json']
"""

from __future__ import annotations

import importlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rbdata.storages._describe import StorageInfo

__all__ = ["DiskKind", "SavedKind", "disk_kind", "disk_kinds", "register_disk_kind", "saved_kind"]


def _resolve(target: str) -> Any:
    """The object at ``"package.module:Name.attr"``, its module imported on first use."""
    module, _, attrs = target.partition(":")
    obj: Any = importlib.import_module(module)
    for attr in attrs.split("."):
        obj = getattr(obj, attr)
    return obj


@dataclass(frozen=True)
class DiskKind:
    """One on-disk kind: its name, marker file, class and describing function, by location.

    ``storage_class`` and ``describe_dir`` are ``"module:Name"`` (``describe_dir`` may be a
    class's method, ``"module:Class.describe"``); ``describe_dir(root)`` returns what
    :meth:`Storage.describe <rbdata.storages.Storage.describe>` returns for ``root``.
    """

    kind: str
    marker_file: str
    storage_class: str
    describe_dir: str

    @property
    def class_name(self) -> str:
        """The storage class's name (``"MemmapStorage"``), its module not imported."""
        return self.storage_class.rpartition(":")[2].rpartition(".")[2]

    def load_class(self) -> type:
        """The storage class (imports its module, and so torch)."""
        cls: type = _resolve(self.storage_class)
        return cls

    def describe(self, root: Path) -> tuple[StorageInfo, list[str]]:
        """What the directory ``root`` of this kind holds, its metadata only.

        Raises:
            ValueError: the metadata is unreadable or corrupt (naming the file and field).
        """
        info, problems = _resolve(self.describe_dir)(root)
        return info, list(problems)


_KINDS: dict[str, DiskKind] = {}


@dataclass(frozen=True)
class SavedKind:
    """How a checkpoint's storage of one built-in class is checked and described, torch-free.

    ``check_dump`` and ``describe_dump`` are ``"module:function"``: the functions that the
    class's own :meth:`~rbdata.storages.Storage.check_dump` and
    :meth:`~rbdata.storages.Storage.describe` call (``check_dump(class_name, directory,
    config, state, meta_file)``, ``describe_dump(directory, config, state, meta_file)``).
    """

    class_name: str
    check_dump: str
    describe_dump: str

    def check(self, directory: Path, config: Any, state: Any, meta_file: Path) -> Any:
        """What ``check_dump`` of the class returns (the capacity first), or its error."""
        return _resolve(self.check_dump)(self.class_name, directory, config, state, meta_file)

    def describe(
        self, directory: Path, config: Any, state: Any, meta_file: Path
    ) -> tuple[StorageInfo, list[str]]:
        """What ``describe`` of the class returns for a checkpoint's storage directory."""
        info, problems = _resolve(self.describe_dump)(directory, config, state, meta_file)
        return info, list(problems)


_SAVED = {
    name: SavedKind(
        name,
        "rbdata.storages.memmap._meta:check_dumped",
        "rbdata.storages.memmap._meta:describe_dumped",
    )
    for name in ("TensorStorage", "MemmapStorage")
}


def saved_kind(class_name: str) -> SavedKind | None:
    """How rbdata's storage class ``class_name`` checks and describes its dump, if known.

    ``None`` for the classes whose hooks need their class (and torch): call those.
    """
    return _SAVED.get(class_name)


def register_disk_kind(kind: DiskKind) -> None:
    """Add (or replace) an on-disk kind; the built-in kinds are registered below."""
    _KINDS[kind.kind] = kind


def disk_kinds() -> dict[str, DiskKind]:
    """The registered on-disk kinds by name, in the order directories are recognised."""
    return dict(_KINDS)


def disk_kind(kind: str | None = None, names: Collection[str] = ()) -> DiskKind | None:
    """The kind named ``kind``, or else the first whose marker file is in ``names``.

    ``names`` are the entries of a directory (nothing is read or followed). ``None`` if
    no kind matches.
    """
    if kind is not None:
        return _KINDS.get(kind)
    for entry in _KINDS.values():
        if entry.marker_file in names:
            return entry
    return None


for _entry in (
    DiskKind(
        "memmap",
        "layout.json",
        "rbdata.storages.memmap.storage:MemmapStorage",
        "rbdata.storages.memmap._meta:describe_dir",
    ),
    DiskKind(
        "arrow",
        "_rbdata.json",
        "rbdata.storages.arrow.storage:ArrowStorage",
        "rbdata.storages.arrow._meta:describe_dir",
    ),
    DiskKind(
        "frames",
        "frames.json",
        "rbdata.storages.frames.storage:FrameStackStorage",
        "rbdata.storages.frames._format:describe_dir",
    ),
):
    register_disk_kind(_entry)
