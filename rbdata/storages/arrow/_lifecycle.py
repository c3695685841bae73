"""The directory of an :class:`~rbdata.storages.ArrowStorage`: opened, published, dropped.

:func:`read_dir` checks a storage directory before :meth:`ArrowStorage.open` allocates
anything: the metadata file (``_rbdata.json``: every field, type and range) and the chunk
files it names; :func:`reopen` (what ``open`` runs) then maps the chunks and replays the
journal; :func:`write_meta` publishes the metadata (atomically: a temporary file, then
``os.replace``).

**A storage dropped without** ``close()`` **writes its rows out.**

Between flushes an ArrowStorage keeps its newest rows in memory (the open chunks) and in its
redo journal (``_journal.bin``), which only :meth:`ArrowStorage.open` reads: pyarrow, polars
and duckdb see the chunk files alone. Python's buffered files flush when they are dropped;
so does a storage, through :func:`flush_when_dropped`: when it is garbage-collected (``del``,
the last reference gone) or still alive at interpreter exit, its open chunks are written
to their files, the metadata published and the journal removed — what ``flush()`` does,
without the fsync (a dropped Python file is not fsync'ed either; the page cache survives
the process). A SIGKILL runs no finalizer: the journal still covers it, and ``open``
replays it.

The finalizer cannot hold the storage (it would never be collected), so it holds the
storage's attribute dict, which holds everything a flush needs, and runs the flush on a bare
instance that shares that dict. (So no attribute may refer back to the storage itself: it
would keep the storage alive until exit. ``tests/test_arrow_dropped.py`` checks that ``del``
flushes.) Nothing is flushed:

- after ``close()`` (it flushed already), or for a temporary directory (``path=None``, and a
  checkpoint's private copy), which is removed instead;
- for a copy that does not own the writes (unpickled in another process, or opened with
  ``recover=False``: it has no journal), and in a forked child, which inherits the
  finalizer but not the ownership;
- when the directory is gone (removed with its journal: nothing is left to keep).

A flush that fails (a full disk, a directory removed under the storage) warns and loses
nothing: the rows are in the journal, and the next ``open`` replays it.
"""

from __future__ import annotations

import json
import os
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rbdata._files import check_dir, inside, open_nofollow
from rbdata.storages.arrow._checks import check_meta, parse_meta
from rbdata.storages.arrow._chunks import chunk_file, map_chunk
from rbdata.storages.arrow._items import load_pyarrow
from rbdata.storages.arrow._journal import Journal, read_journal
from rbdata.storages.arrow._records import replay
from rbdata.storages.arrow._writer import WriterHold
from rbdata.storages.base import Storage

if TYPE_CHECKING:
    from rbdata.storages.arrow.storage import ArrowStorage

__all__ = ["FORMAT", "MAX_META_BYTES", "META_FILE", "VERSION", "flush_when_dropped"]
__all__ += ["read_dir", "reopen", "write_meta"]

#: the metadata file of an Arrow storage directory
META_FILE = "_rbdata.json"
FORMAT = "rbdata.arrow"
VERSION = 1
MAX_META_BYTES = 1 << 24  # a metadata file is a few KiB


def read_dir(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any], list[Path]]:
    """The directory, its checked metadata and the chunk files that hold its rows.

    Raises:
        FileNotFoundError: if ``path`` or its metadata file does not exist.
        ValueError: for a symlinked directory or file, corrupt metadata or a missing chunk.
    """
    root = Path(path)
    if root.is_symlink() or root.is_dir():
        check_dir(root, "ArrowStorage")
    meta_file = inside(root, META_FILE, "metadata file")
    if not meta_file.is_file():
        raise FileNotFoundError(f"{str(root)!r} is not a ArrowStorage: no {META_FILE}")
    with open_nofollow(meta_file, "rb") as f:
        if os.fstat(f.fileno()).st_size > MAX_META_BYTES:
            raise ValueError(f"{meta_file}: too large for a metadata file")
        raw = f.read()
    meta = check_meta(parse_meta(raw, meta_file), meta_file, FORMAT, VERSION)
    length, cs = meta["length"], meta["chunk_size"]
    needed = -(-length // cs)
    # the metadata's sizes against the files present, before anything is allocated
    present = sum(1 for e in os.scandir(root) if e.name.startswith("chunk-"))
    files = []
    for k in range(min(needed, present + 1)):
        file = inside(root, chunk_file(k), "chunk file")
        if not file.is_file():
            expected = min(cs, length - k * cs)
            raise ValueError(f"{file}: missing; the metadata says {expected} rows")
        files.append(file)
    return root, meta, files


def write_meta(storage: ArrowStorage, fsync: bool = True) -> None:
    """Publish ``storage``'s metadata: sizes, layout, length, next slot and epoch."""
    meta: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "capacity": storage.capacity,
        "chunk_size": storage.chunk_size,
        "ragged": [list(k) for k in storage._ragged],
        "length": storage._length,
        "next": storage._next,
        "epoch": storage._epoch,
    }
    if storage._layout is not None:
        meta["layout"] = storage._layout.to_json()
    file = storage._path / META_FILE
    tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    with open_nofollow(tmp, "wb") as f:
        f.write(json.dumps(meta, indent=1).encode())
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, file)


def flush_when_dropped(storage: Any) -> weakref.finalize:
    """Flush ``storage`` (an ArrowStorage that owns a journal) when it is collected or at exit.

    Returns the finalizer: call ``detach()`` on it when the storage is closed.
    """
    return weakref.finalize(storage, _flush_dropped, type(storage), storage.__dict__)


def _flush_dropped(cls: type[Any], state: dict[str, Any]) -> None:
    """Write the open chunks of a storage whose attributes are ``state`` (see the module)."""
    if (
        state.get("_closed", True)
        or state.get("_finalizer") is not None  # a temporary directory: removed, not flushed
        or state.get("_journal") is None  # a reading copy: the owner writes
        or state.get("_owner_pid") != os.getpid()  # a forked child
        or not os.path.isdir(state.get("_path", ""))  # removed: journal and all
    ):
        return
    bare = object.__new__(cls)
    bare.__dict__ = state
    try:
        bare._sync(fsync=False)
    except Exception as err:  # a finalizer cannot raise: say it, the journal keeps the rows
        path = state.get("_path")
        warnings.warn(
            f"ArrowStorage at {str(path)!r} was dropped without close() and its rows could "
            f"not be written to the chunk files ({type(err).__name__}: {err}); they are in "
            "its journal: ArrowStorage.open(path) recovers them",
            RuntimeWarning,
            stacklevel=1,
        )


def reopen(
    cls: type[ArrowStorage],
    path: str | os.PathLike[str],
    recover: bool,
    hold: Callable[[Path], WriterHold],
) -> ArrowStorage:
    """``ArrowStorage.open``: check the directory, map its chunks, replay the journal.

    With ``recover``, ``hold(root)`` takes the directory as its one writer first (it raises
    while another process or storage object writes it).
    """
    pa = load_pyarrow()
    root, meta, files = read_dir(path)
    length, cs = meta["length"], meta["chunk_size"]
    storage = cls.__new__(cls)
    Storage.__init__(storage, meta["capacity"], device="cpu")
    storage.chunk_size = cs
    storage._ragged = meta["ragged"]
    storage._finalizer = None
    storage._path = root
    storage._init_state()
    storage._epoch = meta["epoch"]
    if meta["layout"] is not None:
        storage._set_layout(meta["layout"])
    for k, file in enumerate(files):
        expected = min(cs, length - k * cs)
        try:
            chunk = map_chunk(storage, file, k)
        except (OSError, pa.ArrowException) as err:
            raise ValueError(f"{file}: not a readable Arrow IPC file ({err})") from err
        if chunk.rows < expected:
            raise ValueError(
                f"{file}: {chunk.rows} rows, expected {expected}; truncated or corrupt"
            )
        storage._chunks[k] = chunk
    storage._length, storage._next = length, meta["next"]
    if recover:  # the one writer: refused while another process (or object) writes it
        storage._hold = hold(root)
        try:
            records = read_journal(root, storage._epoch)
            storage._journal = Journal(root)
            replay(storage, records)
        except BaseException:
            storage._hold.close()
            storage._hold = None
            raise
        storage._dropped = flush_when_dropped(storage)
    return storage
