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
files then (without fsync; see ``_lifecycle.py``). Only a kill leaves rows in the
journal alone, for :meth:`open`.

**Every file is checked when it is opened** (``_checks.py``): the metadata's fields,
types and ranges before anything is allocated; each chunk file's schema, row count, every
buffer (``validate(full=True)``) and the addresses the gather kernel reads. Files are opened
without following symlinks, and a symlinked directory is refused.

When every leaf is fixed-shape, a *full* chunk is not rewritten: its fixed-size Arrow
buffers are written in place through a writable mapping of the file (still valid Arrow), so
a ring on its second lap costs about what :class:`MemmapStorage` costs. Bool leaves are
stored as ``uint8`` 0/1 (field metadata ``rbdata.dtype = "bool"``) for that reason: Arrow's
own booleans are bit-packed.
"""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rbdata._files import check_dir, storage_dir
from rbdata._index import check_capacity
from rbdata._layout import RAGGED, STRING, TENSOR, Key, Layout
from rbdata.storages.arrow._checks import TORCH_TO_NUMPY, check_ragged
from rbdata.storages.arrow._chunks import Chunk, open_chunk, seal, seal_left, write_one, write_runs
from rbdata.storages.arrow._gather import chunk_column, gather_items
from rbdata.storages.arrow._items import is_item_list, load_pyarrow, stack_variable_items
from rbdata.storages.arrow._journal import Journal
from rbdata.storages.arrow._lifecycle import flush_when_dropped, reopen, write_meta
from rbdata.storages.arrow._persist import ArrowFiles
from rbdata.storages.arrow._records import log_write
from rbdata.storages.arrow._writer import WriterHold
from rbdata.storages.base import Prepared, WriteTarget

__all__ = ["ArrowStorage"]

_DEFAULT_CHUNK = 1 << 16
_JOURNAL_LIMIT = 32 << 20  # journal bytes after which every row is written to the chunks
_TORCH_TO_NUMPY = TORCH_TO_NUMPY


class ArrowStorage(ArrowFiles):
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
        write_meta(self)
        self._journal: Journal | None = Journal(root)
        # flushed when dropped unclosed (del, gc, exit), as files are: _lifecycle.py
        self._dropped: weakref.finalize | None = flush_when_dropped(self)

    def _init_state(self) -> None:
        # chunks that hold rows, by number: nothing allocated per chunk the capacity allows
        self._chunks: dict[int, Chunk] = {}
        self._epoch = 0  # the journal generation the metadata describes
        self._replaying = False
        self._unsynced = False  # rows written since the last fsync'ed _sync (else: no file write)
        self._journal = None
        self._fixed: list[int] = []  # positions of fixed-shape leaves in the layout
        self._variable: list[int] = []
        self._addresses: np.ndarray | None = None  # [fixed leaf, chunk] buffer addresses
        self._row_bytes = np.zeros(0, np.int64)
        self._specs: list[tuple[tuple[int, ...], torch.dtype]] = []
        self._closed = False
        # the one process that may write (Arrow chunks and the journal are not shareable)
        self._owner_pid = os.getpid()
        self._dropped = None  # the finalizer that flushes a dropped storage
        self._hold = None
        self._write_lock = threading.RLock()  # writes and flushes of several threads, in turn

    # --- opening, closing, pickling --------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], *, recover: bool = True) -> ArrowStorage:
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
        return reopen(cls, path, recover, WriterHold)

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
            for k, chunk in list(self._chunks.items()):
                if chunk.is_open:
                    seal(self, k, fsync)
                elif fsync and chunk.mapped is not None:
                    chunk.mapped.flush()
            self._epoch += 1
            write_meta(self, fsync)
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
        self._chunks = {}
        self._addresses = None
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
            self._chunks = {}
            self._addresses = None
            self._epoch += 1  # first: the journal's records no longer apply
            write_meta(self)
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
        return chunk_column(self, key, chunk)

    def gather(self, idx: torch.Tensor, extra: dict[str, torch.Tensor] | None) -> Any:
        """The items at ``idx``: the fixed-shape leaves copied by one kernel over the chunks."""
        return gather_items(self, idx, extra)

    def _get(self, index: int) -> Any:
        batch = self.gather(torch.tensor([index]), None)
        layout = self._layout
        assert layout is not None
        if layout.kind == TENSOR:
            return batch[0]
        item = batch[0]
        for pos in self._variable:  # a string item: the str itself
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
        for leaf in layout.leaves:
            if leaf.kind != STRING and leaf.dtype not in _TORCH_TO_NUMPY:
                raise TypeError(
                    f"key {leaf.name}: ArrowStorage cannot store dtype {leaf.dtype}; "
                    f"supported: {', '.join(str(d)[6:] for d in _TORCH_TO_NUMPY)}"
                )
        return layout

    def _set_layout(self, layout: Layout) -> None:
        self._layout = layout
        self._fixed = [i for i, leaf in enumerate(layout.leaves) if leaf.kind == TENSOR]
        self._variable = [i for i, leaf in enumerate(layout.leaves) if leaf.kind != TENSOR]
        self._specs = [(layout.leaves[i].shape, layout.leaves[i].dtype) for i in self._fixed]
        self._row_bytes = np.array(
            [layout.leaves[i].numel * layout.leaves[i].dtype.itemsize for i in self._fixed],
            dtype=np.int64,
        )

    def _allocate(self, layout: Layout) -> None:
        self._set_layout(layout)
        write_meta(self)

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
            journal = self._journal
            if journal is not None and not self._replaying:
                log_write(self, journal, target, prepared)
            super().commit(target, prepared)
            seal_left(self)
            if journal is not None and journal.size > _JOURNAL_LIMIT:
                self._sync(fsync=False)  # a kill keeps the page cache: no wait for the disk

    def _set_length(self, n: int) -> None:
        # rows between the old and the new length exist (zeros, empty, "") in open chunks
        cs = self.chunk_size
        for k in range(self._length // cs, -(-n // cs)):
            open_chunk(self, k)
        self._unsynced = True
        self._length = n
        if n == 0:
            self._chunks = {}
            self._addresses = None

    def _write(self, target: WriteTarget, payload: list[Any]) -> None:
        self._unsynced = True
        write_runs(self, target, payload)

    def _write_one(self, index: int, payload: list[Any]) -> None:
        self._unsynced = True
        write_one(self, index, payload)
