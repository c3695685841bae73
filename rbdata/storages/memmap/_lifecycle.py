"""Opening, pickling and closing a :class:`~rbdata.storages.MemmapStorage`.

:class:`~rbdata.storages.MemmapStorage` binds these functions as its methods:

- :func:`open_dir`: ``MemmapStorage.open``, everything read validated first
  (:func:`check_header`), the leaves mapped (:func:`map_files`), a committed journal replayed
  (:func:`replay`);
- :func:`get_state` / :func:`set_state`: pickling; the path of a shared storage, the data of a
  private copy;
- :func:`flush`, :func:`close`: ``msync`` of every file; unmapping (and removing a temporary
  directory);
- :func:`allocate`: the files of a layout fixed by the first write, created and mapped.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rbdata._files import atomic_write_json, inside
from rbdata._holders import Holders
from rbdata._layout import Layout
from rbdata.storages import _memory
from rbdata.storages.memmap._directory import (
    HEADER_FILE,
    JOURNAL_FILE,
    LAYOUT_FILE,
    bad_field,
    check_meta,
    read_layout,
    storage_id,
)
from rbdata.storages.memmap._header import Header
from rbdata.storages.memmap._journal import Journal, read_orphan
from rbdata.storages.memmap._rawfile import create_file, map_file, trailer
from rbdata.storages.memmap._shared import SharedState
from rbdata.storages.memmap._sharing import LIVE, SHARED_FILE
from rbdata.storages.tensor import TensorStorage

if TYPE_CHECKING:
    from rbdata.storages.memmap.storage import MemmapStorage

__all__ = [
    "allocate",
    "check_header",
    "close",
    "flush",
    "get_state",
    "map_files",
    "open_dir",
    "replay",
    "set_state",
]


def open_dir(
    cls: type[MemmapStorage],
    path: str | os.PathLike[str],
    copy_on_write: bool = False,
    read_only: bool = False,
) -> MemmapStorage:
    """``MemmapStorage.open``: see its docstring."""
    root = Path(path)
    meta = read_layout(root)
    capacity, layout, files = check_meta(root, meta)
    storage = cls.__new__(cls)
    TensorStorage.__init__(storage, capacity, device="cpu")
    storage._finalizer = None
    storage._path = root
    storage._private = bool(copy_on_write or read_only)
    storage._read_only = bool(read_only)
    storage._id = storage_id(root, meta)
    storage._journal = None
    storage._data_files = []
    storage._shared = False
    storage._last_write = (0, 0)
    storage._state = None  # type: ignore[assignment]
    storage._holders = None
    if not storage._private:  # alone, joining sharers, or refused (see MemmapStorage.open)
        storage._holders = Holders(root, "MemmapStorage", lambda: cls._adopt(root))
    try:  # a refusal below closes what was opened (the hold on the directory)
        storage._header = header = Header(
            inside(root, HEADER_FILE), create=False, private=storage._private, ident=storage._id
        )
        shared = None if storage._private else inside(root, SHARED_FILE)
        if shared is not None and not shared.exists():
            shared = None  # never shared yet: created by _become_shared
        storage._state = SharedState(shared)
        storage._check_header(*header.first, layout)
        if layout is not None:
            storage._map_files(layout, files)
            storage._replay()
        if storage._holders is not None and storage._holders.shared:
            storage._become_shared()
    except BaseException:
        storage.close()
        raise
    LIVE.add(storage)
    return storage


def check_header(storage: MemmapStorage, length: int, nxt: int, layout: Layout | None) -> None:
    """The header's length and next slot, checked against the capacity and the layout."""
    file, cap = storage._path / HEADER_FILE, storage.capacity
    if not 0 <= length <= cap:
        raise bad_field(file, "length", length, f"in [0, {cap}] (the capacity)")
    if not 0 <= nxt < cap:
        raise bad_field(file, "next", nxt, f"in [0, {cap})")
    if nxt > length:
        raise bad_field(file, "next", nxt, f"at most the length {length}")
    if layout is None and length:
        raise bad_field(file, "length", length, "0: layout.json has no layout")


def map_files(storage: MemmapStorage, layout: Layout, files: list[Path]) -> None:
    """Map the leaves' files (sizes checked) and make them the storage's buffers."""
    buffers, mapped = [], []
    for index, (file, leaf) in enumerate(zip(files, layout.leaves, strict=True)):
        expected = storage.capacity * leaf.numel * leaf.dtype.itemsize
        shape = (storage.capacity, *leaf.shape)
        tail = (storage._id, index)
        buf, raw = map_file(file, leaf.dtype, shape, expected, storage._private, leaf.name, tail)
        buffers.append(buf)
        mapped.append(None if raw is None else _memory.mapping(raw))
    storage._set_buffers(buffers, layout, mapped)
    storage._layout = layout
    storage._data_files = files


def replay(storage: MemmapStorage) -> None:
    """Replay a committed journal left by a writer that died (if no live process writes)."""
    file = storage._path / JOURNAL_FILE
    layout = storage._layout
    if layout is None or not (file.exists() or file.is_symlink()):
        return
    inside(storage._path, JOURNAL_FILE)
    if storage._private:
        orphan = read_orphan(file, layout, storage.capacity)
        if orphan is not None:
            storage._apply(*orphan)
        return
    journal = Journal(file, layout, storage.capacity)
    try:
        journal.replay_if_orphaned(storage._apply)
    finally:
        journal.close()


def get_state(storage: MemmapStorage) -> dict[str, Any]:
    """``__getstate__``: a shared storage sends its path, a private copy its data."""
    storage._check_open()
    if storage._read_only:  # nothing written here: the receiver opens the files read-only
        return {"path": str(storage._path), "read_only": True}
    if not storage._private:
        storage._become_shared()  # the receiver may write while this process does
        return {"path": str(storage._path)}
    # private writes are in this process only: send the data (like a TensorStorage)
    layout = None if storage._layout is None else storage._layout.to_json()
    return {
        "path": str(storage._path),
        "capacity": storage.capacity,
        "layout": layout,
        # the rows (each leaf's bytes once; shared memory for another process), taken under
        # the storage's move lock: no write of another thread is lost to the move
        "buffers": _memory.ship(storage._tensors(), storage._layout, storage._move_lock),
        "header": [storage._header.length, storage._header.next],
    }


def set_state(storage: MemmapStorage, state: dict[str, Any]) -> None:
    """``__setstate__``: the same files mapped again, or a private copy rebuilt."""
    if "buffers" not in state:
        read_only = bool(state.get("read_only", False))
        other = type(storage).open(state["path"], read_only=read_only)
        LIVE.discard(other)
        storage.__dict__.update(other.__dict__)
        other.__dict__.clear()
        if not read_only:
            storage._become_shared()
        LIVE.add(storage)
        return
    TensorStorage.__init__(storage, state["capacity"], device="cpu")
    storage._finalizer, storage._path, storage._private = None, Path(state["path"]), True
    storage._id = None  # a private copy writes no file
    storage._journal, storage._data_files = None, []
    length, nxt = state["header"]
    storage._header = Header.private_copy(length, nxt, storage._path / HEADER_FILE)
    storage._state, storage._shared, storage._last_write = SharedState(None), False, (0, 0)
    if state["layout"] is not None:
        storage._layout = Layout.from_json(state["layout"])
        storage._set_buffers(_memory.received(state["buffers"]), storage._layout)


def flush(storage: MemmapStorage) -> None:
    """Write the mapped pages back to disk (``msync``): durability against power loss.

    A SIGKILL of the process loses nothing that an ``extend`` wrote before it returned
    (the page cache outlives the process); a power loss can, unless ``flush`` ran since.
    A private copy (``open(..., copy_on_write=True)``, what a checkpoint loads) has
    nothing to flush: its writes never reach a file, and the files it was mapped from
    may be gone (a later ``dumps`` over the same checkpoint removes them).
    """
    storage._check_open()
    if storage._private:
        return
    for file in storage._data_files:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            os.fsync(fd)  # the page cache of a MAP_SHARED mapping is the file's
        finally:
            os.close(fd)
    if storage._journal is not None:
        storage._journal.flush()
    storage._header.flush()


def close(storage: MemmapStorage) -> None:
    """Unmap the files; a temporary directory (``path=None``) is removed.

    Every other method of a closed storage raises ``ValueError``.
    """
    storage._closed = True
    storage._row = None
    storage._buffers = []
    storage._np_buffers = None
    storage._mapped = None
    storage._guard = ()
    storage._plain = False
    storage._layout = None
    if getattr(storage, "_journal", None) is not None:
        storage._journal.close()  # type: ignore[union-attr]
        storage._journal = None
    if getattr(storage, "_header", None) is not None:
        storage._header.close()
        storage._header = None  # type: ignore[assignment]
    if storage._versions is not None:
        storage._versions.close()
        storage._versions = None
    if getattr(storage, "_state", None) is not None:
        storage._state.close()
        storage._state = None  # type: ignore[assignment]
    if getattr(storage, "_holders", None) is not None:
        storage._holders.close()  # type: ignore[union-attr]
        storage._holders = None
    finalizer = getattr(storage, "_finalizer", None)
    if finalizer is not None:
        finalizer()


def allocate(storage: MemmapStorage, layout: Layout) -> None:
    """Create and map the files of the layout fixed by the first write, then ``layout.json``."""
    if storage._private:  # never create files in a directory opened copy-on-write
        TensorStorage._allocate(storage, layout)
        return
    meta = storage._meta(layout)
    files = [inside(storage._path, name, "data file") for name in meta["files"]]
    made: list[Path] = []
    try:
        for index, (file, leaf) in enumerate(zip(files, layout.leaves, strict=True)):
            made.append(file)
            size = storage.capacity * leaf.numel * leaf.dtype.itemsize
            create_file(file, size, trailer(storage._id, index))
        storage._map_files(layout, files)
        atomic_write_json(storage._path / LAYOUT_FILE, meta)
    except BaseException:
        storage._buffers, storage._np_buffers, storage._layout = [], None, None
        storage._mapped, storage._guard = None, ()
        for file in made:
            with contextlib.suppress(OSError):
                file.unlink()
        raise
    storage._layout = None  # the base sets it once _allocate returned
