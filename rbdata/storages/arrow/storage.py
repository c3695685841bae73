"""``ArrowStorage``: items in Arrow IPC (Feather v2) chunk files, memory-mapped.

On disk, a storage directory holds:

- ``_rbdata.json``: format name and version, capacity, chunk size, layout, filled length and
  the slot after the last write (where a ring writer resumes);
- ``chunk-000000.arrow``, ...: chunk ``k`` holds slots ``[k * chunk_size, (k + 1) *
  chunk_size)`` in slot order, as one record batch of a plain Arrow IPC file. Column names
  are the keys joined by ``"."`` (``"data"`` for plain-tensor items).

Names starting with ``_`` or ``.`` are skipped by ``pyarrow.dataset``, so
``pyarrow.dataset.dataset(path, format="arrow")`` (and polars, duckdb) read exactly the stored
rows once the storage is flushed, closed or dropped.

- ``_journal.bin`` (only between flushes): the redo journal, see below.

**The unit of rewrite is a chunk.** Writes go to the chunk in memory (opened from its file
once, on the first write to it; the chunk cache is ``_chunks.py``); a chunk is written back
as a whole new file (atomically: a temporary file, then ``os.replace``) when the write
cursor leaves it, and on :meth:`flush`, :meth:`close` and pickling. A ring writer therefore
writes each chunk once per lap, and the newest ``capacity`` rows are always stored exactly.
The trade-off: a random ``set`` into several chunks rewrites each of them (``chunk_size``
rows each).

**What survives a crash.** Every write (``set``, ``extend``) is first appended to the redo
journal as one checksummed record (the slots and the rows; see ``_journal.py``), then
applied. The metadata is written only when every row is in the chunk files (on
:meth:`flush`, :meth:`close`, pickling, and when the journal passes 32 MiB), with a new
*epoch*; the journal is then removed, and records of an older epoch are ignored. So the
metadata never claims a row that is not in a chunk file, and :meth:`open` rebuilds the rest
by replaying the journal's whole records in order (writes are absolute, so replaying a write
that already reached a file is harmless), then writes them to the chunks. Whatever happens
to the process (normal exit without :meth:`close`, ``del``, SIGKILL), every ``extend`` that
returned is there after :meth:`open`, and the one cut by the kill is wholly absent (its
record is short or fails its checksum, and it was never applied) or wholly present — never
torn, even when it overwrote a full ring in place. A kill keeps the page cache, so none of
this waits for the disk; surviving a power loss needs :meth:`flush` (fsync). Chunk files are
plain Arrow once flushed or closed — or dropped: like a Python file, a storage dropped without
:meth:`close` (``del``, garbage collection, interpreter exit) writes its rows to the chunk
files then (without fsync; see below). Only a kill leaves rows in the journal alone, for
:meth:`open`.

**Every file is checked when it is opened** (``_checks.py``): the metadata's fields,
types and ranges before anything is allocated; each chunk file's schema, row count, every
buffer (``validate(full=True)``) and the addresses the gather kernel reads. Files are opened
without following symlinks, and a symlinked directory is refused.

When every leaf is fixed-shape, a *full* chunk is not rewritten: its fixed-size Arrow
buffers are written in place through a writable mapping of the file (still valid Arrow), so
a ring on its second lap costs about what :class:`MemmapStorage` costs. Bool leaves are
stored as ``uint8`` 0/1 (field metadata ``rbdata.dtype = "bool"``) for that reason: Arrow's
own booleans are bit-packed.

**A storage dropped without** ``close()`` **writes its rows out.** Between flushes an
ArrowStorage keeps its newest rows in memory (the open chunks) and in its redo journal, which
only :meth:`open` reads: pyarrow, polars and duckdb see the chunk files alone. Python's
buffered files flush when they are dropped; so does a storage: when it is garbage-collected
(``del``, the last reference gone) or still alive at interpreter exit, its open chunks are
written to their files, the metadata published and the journal removed — what ``flush()``
does, without the fsync (a dropped Python file is not fsync'ed either; the page cache
survives the process). A SIGKILL runs no finalizer: the journal still covers it, and
``open`` replays it.

The finalizer cannot hold the storage (it would never be collected), so it holds the
storage's attribute dict, which holds everything a flush needs (the chunk cache, the
journal), and runs the flush on a bare instance that shares that dict. (So no attribute may
refer back to the storage itself: it would keep the storage alive until exit.
``tests/storages/arrow/test_arrow_dropped.py`` checks that ``del`` flushes.) Nothing is flushed:

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
import threading
import warnings
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from rbdata._core.files import check_dir, open_nofollow, remove_with, storage_dir
from rbdata._core.index import check_capacity
from rbdata._core.layout import RAGGED, STRING, TENSOR, Key, Layout
from rbdata.storages._describe import StorageInfo
from rbdata.storages._persist import check_config
from rbdata.storages.arrow._checks import (
    FORMAT,
    META_FILE,
    VERSION,
    check_dtypes,
    check_ragged,
    read_dir,
)
from rbdata.storages.arrow._chunks import ChunkCache
from rbdata.storages.arrow._items import (
    Columns,
    is_item_list,
    load_pyarrow,
    stack_variable_items,
)
from rbdata.storages.arrow._journal import Journal
from rbdata.storages.arrow._meta import describe_dir
from rbdata.storages.arrow._persist import (
    check_dumped,
    copy_files,
    copy_named,
    data_files,
    own_dir,
    state_of,
    write_state,
)
from rbdata.storages.arrow._writer import WriterHold
from rbdata.storages.base import Codec, Prepared, SavedStorage, Storage, WriteTarget

__all__ = ["ArrowStorage"]

_DEFAULT_CHUNK = 1 << 16
_JOURNAL_LIMIT = 32 << 20  # journal bytes after which every row is written to the chunks

_A = TypeVar("_A", bound="ArrowStorage")


class ArrowStorage(Storage):
    """Items in memory-mapped Arrow IPC chunk files; keeps variable-length fields and strings.

    Args:
        max_size: capacity in items.
        path: directory for the files. ``None`` makes a temporary directory that is removed
            when the storage is closed or garbage-collected; an explicit path is kept. An
            explicit path that already holds files is refused: reopen it with
            :meth:`ArrowStorage.open`.
        chunk_size: rows per chunk file (the unit of rewrite, see the module docs).
        ragged: keys whose first dimension varies per item, for when the first write is a
            single item (a batch's list of tensors is recognised without it).

    What comes back, per Arrow column type:

    ========================================  ============================  ======================
    stored (first write gives)                Arrow type                    batch of ``B``
    ========================================  ============================  ======================
    tensor ``[B, *shape]``, numeric/bool      primitive, or                 tensor ``[B, *shape]``
                                              ``fixed_size_list`` (flat;
                                              bool as uint8)
    list of ``B`` tensors ``[L_i, *shape]``   ``list<...>``                 jagged nested tensor
    list of ``B`` ``str``                     ``string``                    ``NonTensorStack``
    ========================================  ============================  ======================

    A single item gives a tensor, a tensor ``[L, *shape]`` and a ``str`` respectively.

    Examples:
        >>> import torch
        >>> storage = ArrowStorage(100, chunk_size=8)
        >>> storage.set(slice(0, 3), {
        ...     "obs": torch.arange(6.0).view(3, 2),
        ...     "boxes": [torch.ones(2, 4), torch.ones(0, 4), torch.ones(1, 4)],
        ...     "text": ["go left", "stop", "go right"],
        ... })
        >>> batch = storage[[2, 0]]
        >>> batch["obs"].tolist(), batch["text"].tolist()
        ([[4.0, 5.0], [0.0, 1.0]], ['go right', 'go left'])
        >>> [b.shape for b in batch["boxes"].unbind()]
        [torch.Size([1, 4]), torch.Size([2, 4])]
        >>> storage.close()
    """

    kind = "arrow"
    marker_file = META_FILE
    _finalizer: Any = None  # removes a temporary directory (see _files.storage_dir)
    #: this process's hold on the directory, as its one writer (``None`` for a reading copy)
    _hold: WriterHold | None

    def __init__(
        self,
        max_size: int,
        path: str | os.PathLike[str] | None = None,
        chunk_size: int | None = None,
        ragged: tuple[str | Key, ...] | list[str | Key] = (),
    ) -> None:
        load_pyarrow()
        super().__init__(max_size, device="cpu")
        if chunk_size is None:
            chunk_size = min(self.capacity, _DEFAULT_CHUNK)
        self.chunk_size = min(check_capacity(chunk_size, "chunk_size"), self.capacity)
        self._ragged = check_ragged(ragged)
        root, self._finalizer = storage_dir(self, path, "rbdata-arrow-")
        self._path = check_dir(root, "ArrowStorage")
        self._init_state()
        self._hold = WriterHold(root)  # a new directory: this process is its one writer
        self._write_meta()
        self._journal: Journal | None = Journal(root)
        # flushed when dropped unclosed (del, gc, exit), as files are: see the module docs
        self._dropped: weakref.finalize | None = self._flush_when_dropped()

    def _init_state(self) -> None:
        # the chunks (open in memory, or mapped files), their writes and the gather
        self._cache = ChunkCache(self._path, self.capacity, self.chunk_size)
        self._epoch = 0  # the journal generation the metadata describes
        self._unsynced = False  # rows written since the last fsync'ed _sync (else: no file write)
        self._journal = None
        self._closed = False
        # the one process that may write (Arrow chunks and the journal are not shareable)
        self._owner_pid = os.getpid()
        self._dropped = None  # the finalizer that flushes a dropped storage
        self._hold = None
        self._write_lock = threading.RLock()  # writes and flushes of several threads, in turn

    # --- opening, closing, pickling --------------------------------------------------------
    @classmethod
    def open(cls: type[_A], path: str | os.PathLike[str], *, recover: bool = True) -> _A:
        """Reopen a storage directory read/write (after a restart, a crash or a kill).

        Every field of the metadata and every chunk file the metadata names is checked
        first (a clear ``ValueError`` naming the file, never a crash in a later read), then
        the journal's whole records are replayed: every ``extend`` that returned is back,
        a batch cut by a kill is wholly absent. The replayed rows are then written to the
        chunk files (plain Arrow again) and the journal emptied.

        Args:
            path: the storage directory.
            recover: replay the journal (default) and become the storage's one writer:
                refused (``StorageInUseError``) while another process, or another storage
                object of this one, writes the directory. ``False`` opens the state of the
                last flush without writing anything (what an unpickled copy in another
                process does: the owner may still be writing).

        Raises:
            StorageInUseError: another process or object writes the directory.
            FileNotFoundError: if ``path`` or its metadata file does not exist.
            ValueError: for a symlinked directory or file, or corrupt metadata or chunks.
        """
        load_pyarrow()
        root, meta, files = read_dir(path)
        storage = cls.__new__(cls)
        Storage.__init__(storage, meta["capacity"], device="cpu")
        storage.chunk_size = meta["chunk_size"]
        storage._ragged = meta["ragged"]
        storage._finalizer = None
        storage._path = root
        storage._init_state()
        storage._epoch = meta["epoch"]
        if meta["layout"] is not None:
            storage._set_layout(meta["layout"])
        storage._cache.load(files, meta["length"])
        storage._length, storage._next = meta["length"], meta["next"]
        if recover:  # the one writer: refused while another process (or object) writes it
            storage._hold = WriterHold(root)
            try:
                storage._journal = Journal(root)
                storage._replay(storage._journal)
            except BaseException:
                storage._hold.close()
                storage._hold = None
                raise
            storage._dropped = storage._flush_when_dropped()
        return storage

    def _replay(self, journal: Journal) -> None:
        """Apply the journal's whole records, then write every row to the chunks."""
        replayed = False
        for slots, payload in journal.replay(self._epoch, self._cache.columns, self.capacity):
            replayed = True
            prepared = Prepared(payload, len(slots), self._layout, True)
            super().commit(WriteTarget.of_slots(slots), prepared)  # not journalled again
            self._cache.seal_left(self._next, self._length)
        if replayed:
            self._sync(fsync=True)

    def _write_meta(self, fsync: bool = True) -> None:
        """Publish the metadata: sizes, layout, length, next slot and epoch (atomically)."""
        meta: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "capacity": self.capacity,
            "chunk_size": self.chunk_size,
            "ragged": [list(k) for k in self._ragged],
            "length": self._length,
            "next": self._next,
            "epoch": self._epoch,
        }
        if self._layout is not None:
            meta["layout"] = self._layout.to_json()
        file = self._path / META_FILE
        tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
        with open_nofollow(tmp, "wb") as f:
            f.write(json.dumps(meta, indent=1).encode())
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, file)

    def _flush_when_dropped(self) -> weakref.finalize:
        """Flush when collected or at exit (see the module docs); ``detach()`` it on close."""
        return weakref.finalize(self, ArrowStorage._flush_dropped, type(self), self.__dict__)

    @staticmethod
    def _flush_dropped(cls: type[ArrowStorage], state: dict[str, Any]) -> None:
        """Write the open chunks of a dropped storage whose attributes are ``state``."""
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

    def flush(self) -> None:
        """Write every row to the chunk files and the metadata, fsync'ed (then plain Arrow)."""
        self._check_open()
        self._sync(fsync=True)

    def _sync(self, fsync: bool) -> None:
        """Seal the open chunks, publish the metadata (a new epoch), empty the journal.

        Nothing is written when no row changed since the last ``fsync`` sync (or the open):
        closing or dropping a storage that was only read writes no file (a read-only
        directory, a reading copy in another process).
        """
        with self._write_lock:  # a write of another thread lands before or after, whole
            if not self._unsynced:
                return
            self._cache.sync(self._length, fsync)
            self._epoch += 1
            self._write_meta(fsync)
            if self._journal is not None:
                self._journal.reset()
            self._unsynced = not fsync

    def close(self) -> None:
        """Flush, then unmap the files; a temporary directory (``path=None``) is removed."""
        if self._closed:
            return
        if self._finalizer is None:
            self.flush()
        if self._dropped is not None:
            self._dropped.detach()
            self._dropped = None
        self._cache.clear()
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._hold is not None:
            self._hold.close()
            self._hold = None
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    def __getstate__(self) -> dict[str, Any]:
        with self._write_lock:  # no write of another thread between the two steps
            if self._hold is not None:  # the receiver maps the files: none changes in place
                self._hold.readers = True
            self.flush()  # the receiving process maps the files: they must hold every row
        return {"path": str(self._path), "owner": self._owner_pid}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # the owner may go on writing: a copy neither replays nor empties its journal
        other = type(self).open(state["path"], recover=False)
        self.__dict__.update(other.__dict__)
        other.__dict__.clear()
        # the process that owns the writes stays the owner: a copy in another process reads
        self._owner_pid = int(state.get("owner", os.getpid()))

    @property
    def path(self) -> Path:
        """The storage directory."""
        self._check_open()
        return self._path

    def config(self) -> dict[str, Any]:
        """``max_size``, ``chunk_size`` and the declared ``ragged`` keys."""
        self._check_open()
        return {
            "max_size": self.capacity,
            "chunk_size": self.chunk_size,
            "ragged": [list(k) for k in self._ragged],
        }

    def clear(self) -> None:
        """Forget all items; the chunk files are removed (the layout is kept)."""
        with self._write_lock:
            super().clear()
            self._cache.clear()
            self._epoch += 1  # first: the journal's records no longer apply
            self._write_meta()
            if self._journal is not None:
                self._journal.reset()
            for file in self._path.iterdir():
                if file.name.startswith("chunk-") and file.name.endswith(".arrow"):
                    file.unlink(missing_ok=True)

    # --- reading -----------------------------------------------------------------------------
    def column(self, key: str | Key, chunk: int = 0) -> Any:
        """The rows of one leaf in one chunk, without a copy for fixed-shape leaves.

        A fixed-shape leaf gives a **read-only** tensor ``[rows, *shape]`` that views the
        memory-mapped file (or the chunk held in memory); bool leaves are bit-packed in Arrow
        and come back as a copy. Variable leaves give a list.
        """
        self._check_open()
        key = (key,) if isinstance(key, str) else tuple(key)
        return self._cache.column(key, chunk, self._length)

    def gather(self, idx: torch.Tensor, extra: dict[str, torch.Tensor] | None) -> Any:
        """The items at ``idx``: the fixed-shape leaves copied by one kernel over the chunks."""
        self._check_open()  # the chunks are unmapped: the gather kernel would read address 0
        layout = self._layout
        if layout is None:
            raise IndexError("the storage is empty")
        slots = idx.numpy()
        if not slots.flags.c_contiguous:
            slots = np.ascontiguousarray(slots)
        outputs = self._cache.gather(slots, self._length)
        return layout.assemble(outputs, torch.Size((len(slots),)), self.device, extra)

    def _get(self, index: int) -> Any:
        batch = self.gather(torch.tensor([index]), None)
        layout, columns = self._layout, self._cache.columns
        assert layout is not None and columns is not None
        if layout.kind == TENSOR:
            return batch[0]
        item = batch[0]
        for pos in columns.variable:  # a string item: the str itself
            if layout.leaves[pos].kind == STRING:
                item.set_non_tensor(layout.keys[pos], batch.get(layout.keys[pos])[0])
        return item

    # --- writing -------------------------------------------------------------------------
    def prepare(self, data: Any, batched: bool) -> Prepared:
        """Validate ``data`` (see :meth:`Storage.prepare`); a list of items is stacked per key.

        A list of dict-like items becomes one batch leaf by leaf
        (:func:`~rbdata.storages.arrow._items.stack_variable_items`): ``str`` values a string
        leaf, the values of a ragged key (declared in ``ragged=`` or stored as ragged) a list
        of ragged rows, whatever their lengths; any other key whose shapes differ between
        items is refused with a ``ValueError`` naming the item and the key.
        """
        if batched and is_item_list(data):
            self._check_open()
            layout = self._current_layout()
            ragged = set(self._ragged)
            if layout is not None:
                ragged.update(leaf.key for leaf in layout.leaves if leaf.kind == RAGGED)
            data = stack_variable_items(data, ragged)
        return super().prepare(data, batched)

    def _infer_layout(self, data: Any, batched: bool) -> Layout:
        """The first write's layout; string and ragged leaves allowed, dtypes Arrow keeps."""
        layout = Layout.from_data(data, batched, variable=True, ragged=self._ragged)
        check_dtypes(leaf for leaf in layout.leaves if leaf.kind != STRING)
        return layout

    def _set_layout(self, layout: Layout) -> None:
        self._layout = layout
        self._cache.columns = Columns(layout)

    def _allocate(self, layout: Layout) -> None:
        self._set_layout(layout)
        self._write_meta()

    def commit(self, target: WriteTarget, prepared: Prepared) -> None:
        """Journal the write, apply it, then write back every chunk the cursor has left."""
        self._check_open()
        if self._owner_pid != os.getpid():
            raise RuntimeError(
                f"ArrowStorage at {str(self._path)!r}: written from process {os.getpid()}, "
                f"which does not own it (process {self._owner_pid} does; this is a pickled "
                "or forked copy). An ArrowStorage has one writer process, copies in other "
                "processes only read. Write from the owner, or use a MemmapStorage, which "
                "many processes may extend at once; nothing was written"
            )
        with self._write_lock:  # against a flush (pickling) in another thread
            if prepared.layout is not None:
                self._ensure_layout(prepared.layout)  # the metadata names the layout first
            journal, columns = self._journal, self._cache.columns
            if journal is not None and columns is not None:  # no layout: nothing is written
                journal.log_write(self._epoch, columns, target, prepared)
            super().commit(target, prepared)
            self._cache.seal_left(self._next, self._length)
            if journal is not None and journal.size > _JOURNAL_LIMIT:
                self._sync(fsync=False)  # a kill keeps the page cache: no wait for the disk

    def _set_length(self, n: int) -> None:
        # rows between the old and the new length exist (zeros, empty, "") in open chunks
        cs = self.chunk_size
        for k in range(self._length // cs, -(-n // cs)):
            self._cache.open(k)
        self._unsynced = True
        self._length = n
        if n == 0:
            self._cache.clear()

    def _in_place(self) -> bool:
        """Whether full chunks may be written in place (no reading copy maps the files)."""
        return self._hold is not None and not self._hold.readers

    def _write(self, target: WriteTarget, payload: list[Any]) -> None:
        self._unsynced = True
        self._cache.write_runs(target, payload, self._in_place())

    def _write_one(self, index: int, payload: list[Any]) -> None:
        self._unsynced = True
        self._cache.write_one(index, payload, self._in_place())

    # --- persistence hooks: the files, copied (the format: _persist.py) --------------------
    def abort(self) -> None:
        """Give up a storage being filled: close it without a flush, keep its directory.

        For a writer that failed midway (its caller removes the files): nothing more is
        written, not even when the storage is dropped. Every other method then raises
        ``ValueError``.
        """
        self._finalizer = None
        self._closed = True

    @property
    def block_rows(self) -> int | None:
        """The chunk size (``chunk_size``): a bulk copy reads or writes one chunk file at a time."""
        return self.chunk_size

    @classmethod
    def check_layout(cls, layout: Layout) -> None:
        """Refuse dtypes that Arrow lacks."""
        check_dtypes(layout.leaves)

    @classmethod
    def empty_like(
        cls: type[_A],
        src: Storage,
        path: str | os.PathLike[str] | None = None,
        block_rows: int | None = None,
    ) -> _A:
        """A new storage of ``src``'s capacity and ragged keys at ``path``.

        Its chunk size is ``block_rows``, else ``src``'s for an Arrow ``src``, else the
        default.
        """
        ragged = src._ragged if isinstance(src, ArrowStorage) else ()
        return cls(src.capacity, path=path, chunk_size=block_rows or src.block_rows, ragged=ragged)

    def _data_files(self) -> list[Path]:
        """Flush; return the metadata and chunk files (everything that holds data)."""
        self.flush()
        return data_files(self._path)

    @classmethod
    def _own_copy(cls: type[_A], fill: Callable[[Path], None]) -> _A:
        """Open a storage in a new temporary directory of its own, filled by ``fill``."""
        storage, own = own_dir(fill, cls.open)
        storage._finalizer = remove_with(storage, own)
        return storage

    def dump(
        self, directory: Path, codec: Codec, tensors: list[torch.Tensor], fsync: bool = True
    ) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
        """Flush, then copy the metadata and chunk files into ``directory``."""
        directory.mkdir()
        return copy_files(self._data_files(), directory, fsync)

    @classmethod
    def check_dump(
        cls, directory: Path, config: dict[str, Any], state: Any, meta_file: Path
    ) -> Any:
        """Check ``_rbdata.json`` and the chunk files it names (present, plain, not too big)."""
        return check_dumped(cls, directory, config, state)

    @classmethod
    def restore(cls: type[_A], saved: SavedStorage) -> _A:
        """A copy of the files the metadata names, in a temporary directory of its own."""
        storage = cls._own_copy(partial(copy_named, saved.directory, saved.plan[1]))
        check_config(storage, saved.config)
        return storage

    def dump_state(self, codec: Codec) -> dict[str, Any]:
        """``{"files": {name: the file's bytes as a uint8 tensor}}``, after a flush."""
        return state_of(self._data_files())

    @classmethod
    def from_state(cls: type[_A], config: dict[str, Any], state: Any, codec: Codec) -> _A:
        """The files written to a temporary directory of its own, then opened."""
        storage = cls._own_copy(partial(write_state, state))
        check_config(storage, config)
        return storage

    @classmethod
    def describe(
        cls,
        directory: Path,
        config: dict[str, Any] | None = None,
        state: Any = None,
        meta_file: Path | None = None,
    ) -> tuple[StorageInfo, list[str]]:
        """``_rbdata.json`` (checked as ``open`` checks it); chunk files by size."""
        return describe_dir(directory)
