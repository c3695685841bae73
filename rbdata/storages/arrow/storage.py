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
once, on the first write to it); a chunk is written back as a whole new file (atomically:
a temporary file, then ``os.replace``) when the write cursor leaves it, and on :meth:`flush`,
:meth:`close` and pickling. A ring writer therefore writes each chunk once per lap, and the
newest ``capacity`` rows are always stored exactly. The trade-off: a random ``set`` into
several chunks rewrites each of them (``chunk_size`` rows each).

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

import json
import mmap
import os
import warnings
import weakref
from pathlib import Path
from typing import Any

import numba
import numpy as np
import torch
from tensordict import NonTensorStack

from rbdata._files import check_dir, inside, open_nofollow, storage_dir
from rbdata._layout import RAGGED, STRING, TENSOR, Key, Layout, Leaf
from rbdata._numba import voidptr as _nb_voidptr
from rbdata.storages.arrow._checks import (
    TORCH_TO_NUMPY,
    arrow_type,
    check_batch,
    check_meta,
    check_ragged,
    check_views,
    parse_meta,
)
from rbdata.storages.arrow._items import (
    fixed_array,
    is_item_list,
    owned_row,
    ragged_array,
    ragged_rows,
    stack_variable_items,
)
from rbdata.storages.arrow._journal import JOURNAL_FILE, Journal, read_journal
from rbdata.storages.arrow._lifecycle import flush_when_dropped
from rbdata.storages.arrow._persist import META_FILE as _META_FILE
from rbdata.storages.arrow._persist import ArrowFiles
from rbdata.storages.base import Prepared, Storage

__all__ = ["ArrowStorage"]

_FORMAT = "rbdata.arrow"
_VERSION = 1
_DEFAULT_CHUNK = 1 << 16

_MAX_META_BYTES = 1 << 24  # a metadata file is a few KiB
_JOURNAL_LIMIT = 32 << 20  # journal bytes after which every row is written to the chunks
_TORCH_TO_NUMPY = TORCH_TO_NUMPY


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.ipc
    except ImportError as err:  # pragma: no cover - the test environment has pyarrow
        raise ImportError("ArrowStorage needs pyarrow: pip install 'rbdata[arrow]'") from err
    return pyarrow


def _column_name(key: Key) -> str:
    return ".".join(key) or "data"


def _chunk_file(k: int) -> str:
    return f"chunk-{k:06d}.arrow"


@numba.njit(cache=True, nogil=True, inline="always")
def _nb_copy_rows(
    src_addresses: Any, chunk_size: int, index: Any, width: int, out_address: int, dtype: Any
) -> None:  # pragma: no cover
    # rows of ``width`` elements of ``dtype``: element loops, no per-row slice objects
    n = index.shape[0]
    out = numba.carray(_nb_voidptr(out_address), (n * width,), dtype)
    for i in range(n):
        k = index[i] // chunk_size
        row = index[i] - k * chunk_size
        src = numba.carray(_nb_voidptr(src_addresses[k]), ((row + 1) * width,), dtype)
        for e in range(width):
            out[i * width + e] = src[row * width + e]


@numba.njit(cache=True, nogil=True)
def _nb_gather_rows(
    addresses: Any, chunk_size: int, index: Any, row_bytes: Any, out_addresses: Any
) -> None:  # pragma: no cover
    # every leaf at once: out[leaf][i] = chunk[leaf][index[i] // chunk_size][row], copied
    # in the widest unit that divides the row (buffers are at least 8-byte aligned)
    for leaf in range(addresses.shape[0]):
        width = row_bytes[leaf]
        src, out = addresses[leaf], out_addresses[leaf]
        if width % 8 == 0:
            _nb_copy_rows(src, chunk_size, index, width // 8, out, np.uint64)
        elif width % 4 == 0:
            _nb_copy_rows(src, chunk_size, index, width // 4, out, np.uint32)
        elif width % 2 == 0:
            _nb_copy_rows(src, chunk_size, index, width // 2, out, np.uint16)
        else:
            _nb_copy_rows(src, chunk_size, index, width, out, np.uint8)


def _gather_rows(
    addresses: np.ndarray,
    chunk_size: int,
    index: np.ndarray,
    row_bytes: np.ndarray,
    out_addresses: np.ndarray,
) -> None:
    """Copy rows of fixed-shape leaves from per-chunk buffers into outputs (one call a batch)."""
    _nb_gather_rows(addresses, chunk_size, index, row_bytes, out_addresses)


class _Chunk:
    """One chunk: sealed (a memory-mapped record batch) or open (mutable arrays in memory).

    ``fixed`` holds one numpy array per fixed-shape leaf (read-only views of the file when
    sealed, ``chunk_size``-row arrays when open); ``variable`` one list per string or ragged
    leaf (open chunks only; a sealed chunk reads them from ``batch``).
    """

    __slots__ = (
        "base",
        "batch",
        "file",
        "fixed",
        "ident",
        "mapped",
        "rows",
        "variable",
        "writable",
    )

    def __init__(self) -> None:
        self.batch: Any = None
        self.file: Path | None = None
        self.base = 0  # the address of the file's mapping (sealed)
        self.ident = (0, 0)  # (st_dev, st_ino) of the mapped file
        self.mapped: Any = None  # the writable np.memmap of the file (in-place writes)
        self.writable: list[np.ndarray] | None = None  # writable views of the file's columns
        self.fixed: list[np.ndarray] = []
        self.variable: list[list[Any]] = []
        self.rows = 0

    @property
    def is_open(self) -> bool:
        return self.batch is None


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

    def __init__(
        self,
        max_size: int,
        path: str | os.PathLike[str] | None = None,
        chunk_size: int | None = None,
        ragged: tuple[str | Key, ...] | list[str | Key] = (),
    ) -> None:
        _pyarrow()
        super().__init__(max_size, device="cpu")
        if chunk_size is None:
            chunk_size = min(self.capacity, _DEFAULT_CHUNK)
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        self.chunk_size = min(chunk_size, self.capacity)
        self._ragged = check_ragged(ragged)
        root, self._finalizer = storage_dir(self, path, "rbdata-arrow-")
        self._path = check_dir(root, "ArrowStorage")
        self._init_state()
        self._write_meta()
        self._journal: Journal | None = Journal(root)
        # flushed when dropped unclosed (del, gc, exit), as files are: _lifecycle.py
        self._dropped: weakref.finalize | None = flush_when_dropped(self)

    def _init_state(self) -> None:
        # chunks that hold rows, by number: nothing allocated per chunk the capacity allows
        self._chunks: dict[int, _Chunk] = {}
        self._epoch = 0  # the journal generation the metadata describes
        self._replaying = False
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
            recover: replay the journal (default). ``False`` opens the state of the last
                flush without writing anything (what an unpickled copy in another process
                does: the owner may still be writing).

        Raises:
            FileNotFoundError: if ``path`` or its metadata file does not exist.
            ValueError: for a symlinked directory or file, or corrupt metadata or chunks.
        """
        pa = _pyarrow()
        root = Path(path)
        if root.is_symlink() or root.is_dir():
            check_dir(root, "ArrowStorage")
        meta_file = inside(root, _META_FILE, "metadata file")
        if not meta_file.is_file():
            raise FileNotFoundError(f"{str(root)!r} is not a ArrowStorage: no {_META_FILE}")
        with open_nofollow(meta_file, "rb") as f:
            if os.fstat(f.fileno()).st_size > _MAX_META_BYTES:
                raise ValueError(f"{meta_file}: too large for a metadata file")
            raw = f.read()
        meta = check_meta(parse_meta(raw, meta_file), meta_file, _FORMAT, _VERSION)
        length, cs = meta["length"], meta["chunk_size"]
        needed = -(-length // cs)
        # the metadata's sizes against the files present, before anything is allocated
        present = sum(1 for e in os.scandir(root) if e.name.startswith("chunk-"))
        files = []
        for k in range(min(needed, present + 1)):
            file = inside(root, _chunk_file(k), "chunk file")
            if not file.is_file():
                expected = min(cs, length - k * cs)
                raise ValueError(f"{file}: missing; the metadata says {expected} rows")
            files.append(file)
        self = cls.__new__(cls)
        Storage.__init__(self, meta["capacity"], device="cpu")
        self.chunk_size = cs
        self._ragged = meta["ragged"]
        self._finalizer = None
        self._path = root
        self._init_state()
        self._epoch = meta["epoch"]
        if meta["layout"] is not None:
            self._set_layout(meta["layout"])
        for k, file in enumerate(files):
            expected = min(cs, length - k * cs)
            try:
                chunk = self._sealed_chunk(file, k)
            except (OSError, pa.ArrowException) as err:
                raise ValueError(f"{file}: not a readable Arrow IPC file ({err})") from err
            if chunk.rows < expected:
                raise ValueError(
                    f"{file}: {chunk.rows} rows, expected {expected}; truncated or corrupt"
                )
            self._chunks[k] = chunk
        self._length, self._next = length, meta["next"]
        if recover:
            records = read_journal(root, self._epoch)
            self._journal = Journal(root)
            self._replay(records)
            self._dropped = flush_when_dropped(self)
        return self

    def _replay(self, records: list[tuple[int, memoryview]]) -> None:
        """Apply whole journal records, then write every row to the chunks (see module)."""
        if not records:
            return
        layout = self._layout
        if layout is None:
            raise ValueError(f"{self._path / JOURNAL_FILE}: records but no layout in the metadata")
        self._replaying = True
        try:
            for n, body in records:
                slots, payload = self._decode(n, body)
                Storage.commit(self, slots, Prepared(payload, n, layout, True))
                self._seal_left()
        finally:
            self._replaying = False
        self._sync(fsync=True)

    def flush(self) -> None:
        """Write every row to the chunk files and the metadata, fsync'ed (then plain Arrow)."""
        self._check_open()
        self._sync(fsync=True)

    def _sync(self, fsync: bool) -> None:
        """Seal the open chunks, publish the metadata (a new epoch), empty the journal."""
        for k, chunk in list(self._chunks.items()):
            if chunk.is_open:
                self._seal(k, fsync)
            elif fsync and chunk.mapped is not None:
                chunk.mapped.flush()
        self._epoch += 1
        self._write_meta(fsync)
        if self._journal is not None:
            self._journal.reset()

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
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    def __getstate__(self) -> dict[str, Any]:
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
        super().clear()
        self._chunks = {}
        self._addresses = None
        self._epoch += 1  # first: the journal's records no longer apply
        self._write_meta()
        if self._journal is not None:
            self._journal.reset()
        for file in self._path.iterdir():
            if file.name.startswith("chunk-") and file.name.endswith(".arrow"):
                file.unlink(missing_ok=True)

    def _write_meta(self, fsync: bool = True) -> None:
        meta: dict[str, Any] = {
            "format": _FORMAT,
            "version": _VERSION,
            "capacity": self.capacity,
            "chunk_size": self.chunk_size,
            "ragged": [list(k) for k in self._ragged],
            "length": self._length,
            "next": self._next,
            "epoch": self._epoch,
        }
        if self._layout is not None:
            meta["layout"] = self._layout.to_json()
        file = self._path / _META_FILE
        tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
        with open_nofollow(tmp, "wb") as f:
            f.write(json.dumps(meta, indent=1).encode())
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, file)

    # --- reading -----------------------------------------------------------------------------
    def column(self, key: str | Key, chunk: int = 0) -> Any:
        """The rows of one leaf in one chunk, without a copy for fixed-shape leaves.

        A fixed-shape leaf gives a **read-only** tensor ``[rows, *shape]`` that views the
        memory-mapped file (or the chunk held in memory); bool leaves are bit-packed in Arrow
        and come back as a copy. Variable leaves give a list.
        """
        self._check_open()
        layout = self._layout
        key = (key,) if isinstance(key, str) else tuple(key)
        if layout is None or key not in layout.keys:
            raise KeyError(f"no key {key!r} in this storage")
        c = self._chunks.get(chunk) if isinstance(chunk, int) else None
        if c is None:
            raise IndexError(f"chunk {chunk} holds no rows")
        pos = layout.keys.index(key)
        # an open chunk holds chunk_size rows, filled or not: only the filled ones are rows
        rows = min(c.rows, max(0, self._length - chunk * self.chunk_size))
        if pos in self._fixed:
            view = c.fixed[self._fixed.index(pos)][:rows]
            with warnings.catch_warnings():  # a read-only mapping: documented as read-only
                warnings.simplefilter("ignore", UserWarning)
                return torch.from_numpy(view)
        return self._variable_rows(c, self._variable.index(pos), np.arange(rows))

    def gather(self, idx: torch.Tensor, extra: dict[str, torch.Tensor] | None) -> Any:
        """The items at ``idx``: the fixed-shape leaves copied by one kernel over the chunks."""
        self._check_open()  # the chunks are unmapped: the gather kernel would read address 0
        layout = self._layout
        if layout is None:
            raise IndexError("the storage is empty")
        n = int(idx.shape[0])
        slots = idx.numpy()
        if not slots.flags.c_contiguous:
            slots = np.ascontiguousarray(slots)
        outputs: list[Any] = []
        if self._fixed:
            if self._addresses is None:
                self._refresh_addresses()
            outputs = [torch.empty((n, *shape), dtype=dtype) for shape, dtype in self._specs]
            _gather_rows(
                self._addresses,  # type: ignore[arg-type]
                self.chunk_size,
                slots,
                self._row_bytes,
                np.array([out.data_ptr() for out in outputs], dtype=np.int64),
            )
        if self._variable:  # back to layout order
            leaves = layout.leaves
            fixed, outputs = outputs, [None] * len(leaves)
            for pos, out in zip(self._fixed, fixed, strict=True):
                outputs[pos] = out
            for j, pos in enumerate(self._variable):
                outputs[pos] = self._gather_variable(leaves[pos], j, slots)
        return layout.assemble(outputs, torch.Size((n,)), self.device, extra)

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

    def _gather_variable(self, leaf: Leaf, j: int, slots: np.ndarray) -> Any:
        values: list[Any] = [None] * len(slots)
        chunk_of = slots // self.chunk_size
        for k in np.unique(chunk_of).tolist():
            where = np.nonzero(chunk_of == k)[0]
            rows = slots[where] - k * self.chunk_size
            c = self._chunks[k]
            for w, v in zip(where.tolist(), self._variable_rows(c, j, rows), strict=True):
                values[w] = v
        if leaf.kind == STRING:
            return NonTensorStack.from_list(values)
        if not values:
            return torch.empty((0, 0, *leaf.shape), dtype=leaf.dtype)
        lengths = torch.tensor([len(v) for v in values], dtype=torch.long)
        offsets = torch.zeros(len(values) + 1, dtype=torch.long)
        torch.cumsum(lengths, 0, out=offsets[1:])
        # np.concatenate copies into a new, writable array: torch.from_numpy on each row, a
        # read-only view of a sealed (memory-mapped) chunk, warned "not writable" (an error
        # under -W error) and then copied anyway in torch.cat
        flat = torch.from_numpy(np.concatenate(values)).to(leaf.dtype)
        return torch.nested.nested_tensor_from_jagged(flat, offsets)

    def _variable_rows(self, c: _Chunk, j: int, rows: np.ndarray) -> list[Any]:
        if c.is_open:
            column = c.variable[j]
            return [column[r] for r in rows.tolist()]
        pa = _pyarrow()
        leaf = self._layout.leaves[self._variable[j]]  # type: ignore[union-attr]
        taken = c.batch.column(self._variable[j]).take(pa.array(rows))
        if leaf.kind == STRING:
            return [s if s is not None else "" for s in taken.to_pylist()]
        return ragged_rows(pa, taken, leaf)

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
        self._write_meta()

    def commit(self, index: int | list[slice] | torch.Tensor, prepared: Prepared) -> None:
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
        if prepared.layout is not None:
            self._ensure_layout(prepared.layout)  # the metadata names the layout first
        journal = self._journal
        if journal is not None and not self._replaying:
            self._log(journal, index, prepared)
        super().commit(index, prepared)
        self._seal_left()
        if journal is not None and journal.size > _JOURNAL_LIMIT:
            self._sync(fsync=False)  # a kill keeps the page cache: no wait for the disk

    def _seal_left(self) -> None:
        tail = self._next // self.chunk_size
        for k, chunk in list(self._chunks.items()):
            if chunk.is_open and k != tail:
                self._seal(k)

    # --- the journal -------------------------------------------------------------------------
    def _log(self, journal: Journal, index: Any, prepared: Prepared) -> None:
        """Append the write to the journal: slots, fixed rows raw, variable rows as Arrow."""
        if isinstance(index, int):
            slots = np.array([index], dtype=np.int64)
        elif isinstance(index, list):
            runs = [np.arange(r.start, r.stop, dtype=np.int64) for r in index]
            slots = np.concatenate(runs) if runs else np.zeros(0, np.int64)
        else:
            slots = np.ascontiguousarray(index.numpy(), dtype=np.int64)
        n = len(slots)
        if not n:
            return
        layout = self._layout
        assert layout is not None
        payload = prepared.payload
        if not prepared.batched:
            payload = [
                [v] if layout.leaves[i].kind != TENSOR else torch.as_tensor(v).unsqueeze(0)
                for i, v in enumerate(payload)
            ]
        parts: list[Any] = [slots]
        for a in self._fixed_arrays(payload):
            parts.append(np.ascontiguousarray(a).view(np.uint8).reshape(-1))
        if self._variable:
            pa = _pyarrow()
            columns, names = [], []
            for pos in self._variable:
                leaf = layout.leaves[pos]
                values = self._variable_values(pos, list(payload[pos]))
                if leaf.kind == STRING:
                    columns.append(pa.array(values, pa.string()))
                else:
                    columns.append(ragged_array(pa, values, leaf))
                names.append(str(pos))
            batch = pa.RecordBatch.from_arrays(columns, names=names)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            parts.append(sink.getvalue())
        journal.append(self._epoch, n, parts)

    def _decode(self, n: int, body: memoryview) -> tuple[torch.Tensor, list[Any]]:
        """A journal record back to slots and a batched payload; ``ValueError`` if it is wrong."""
        layout = self._layout
        assert layout is not None
        where = self._path / JOURNAL_FILE
        fixed_bytes = int(self._row_bytes.sum()) * n
        if n < 1 or n > 1 << 40 or len(body) < 8 * n + fixed_bytes:
            raise ValueError(f"{where}: a record of {n} rows holds {len(body)} bytes")
        slots = np.frombuffer(body, np.int64, n).copy()
        if slots.min() < 0 or slots.max() >= self.capacity:
            raise ValueError(f"{where}: a record writes slots outside [0, {self.capacity})")
        payload: list[Any] = [None] * len(layout.leaves)
        offset = 8 * n
        for pos, (shape, dtype), width in zip(
            self._fixed, self._specs, self._row_bytes.tolist(), strict=True
        ):
            raw = np.frombuffer(body, np.uint8, width * n, offset).copy()
            payload[pos] = torch.from_numpy(raw).view(dtype).reshape(n, *shape)
            offset += width * n
        if self._variable:
            pa = _pyarrow()
            try:
                batch = pa.ipc.open_stream(pa.py_buffer(body[offset:])).read_next_batch()
                batch.validate(full=True)
            except pa.ArrowException as err:
                raise ValueError(f"{where}: a corrupt record ({err})") from None
            for j, pos in enumerate(self._variable):
                leaf = layout.leaves[pos]
                column = batch.column(j)
                if len(column) != n or not column.type.equals(arrow_type(pa, leaf)):
                    raise ValueError(f"{where}: a record's column {leaf.name} does not fit")
                if leaf.kind == STRING:
                    payload[pos] = [s if s is not None else "" for s in column.to_pylist()]
                else:
                    rows = ragged_rows(pa, column, leaf)
                    payload[pos] = [torch.from_numpy(np.array(r)) for r in rows]
        return torch.from_numpy(slots), payload

    def _set_length(self, n: int) -> None:
        # rows between the old and the new length exist (zeros, empty, "") in open chunks
        cs = self.chunk_size
        for k in range(self._length // cs, -(-n // cs)):
            self._open_chunk(k)
        self._length = n
        if n == 0:
            self._chunks = {}
            self._addresses = None

    def _open_chunk(self, k: int) -> _Chunk:
        """The chunk ``k`` in memory, opened from its file (a copy) or new."""
        chunk = self._chunks.get(k)
        if chunk is not None and chunk.is_open:
            return chunk
        layout = self._layout
        assert layout is not None
        rows = min(self.chunk_size, self.capacity - k * self.chunk_size)
        new = _Chunk()
        new.rows = rows
        for pos in self._fixed:
            leaf = layout.leaves[pos]
            new.fixed.append(np.zeros((rows, *leaf.shape), dtype=_TORCH_TO_NUMPY[leaf.dtype]))
        for pos in self._variable:
            leaf = layout.leaves[pos]
            empty = (
                ""
                if leaf.kind == STRING
                else np.zeros((0, *leaf.shape), _TORCH_TO_NUMPY[leaf.dtype])
            )
            new.variable.append([empty] * rows)
        if chunk is not None:  # copy the sealed rows
            held = chunk.rows
            for dst, src in zip(new.fixed, chunk.fixed, strict=True):
                dst[:held] = src[:held]
            for j, column in enumerate(new.variable):
                column[:held] = self._variable_rows(chunk, j, np.arange(held))
        self._chunks[k] = new
        self._addresses = None
        return new

    def _write(self, index: list[slice] | torch.Tensor, payload: list[Any]) -> None:
        fixed = self._fixed_arrays(payload)
        if isinstance(index, torch.Tensor):
            self._write_slots(index.numpy(), fixed, payload)
            return
        cs, offset = self.chunk_size, 0
        for run in index:  # contiguous runs (a ring writer's path): slice copies per chunk
            start = run.start
            while start < run.stop:
                k = start // cs
                stop = min(run.stop, (k + 1) * cs)
                row, count = start - k * cs, stop - start
                targets, chunk = self._targets(k)
                for dst, src in zip(targets, fixed, strict=True):
                    dst[row : row + count] = src[offset : offset + count]
                for j, pos in enumerate(self._variable):
                    values = payload[pos][offset : offset + count]
                    chunk.variable[j][row : row + count] = self._variable_values(pos, values)
                offset += count
                start = stop

    def _write_one(self, index: int, payload: list[Any]) -> None:
        layout = self._layout
        assert layout is not None
        batch = [
            [v] if layout.leaves[i].kind != TENSOR else torch.as_tensor(v).unsqueeze(0)
            for i, v in enumerate(payload)
        ]
        slot = np.array([index], dtype=np.int64)
        self._write_slots(slot, self._fixed_arrays(batch), batch)

    def _fixed_arrays(self, payload: list[Any]) -> list[np.ndarray]:
        layout = self._layout
        assert layout is not None
        return [
            payload[pos].detach().to(device="cpu", dtype=layout.leaves[pos].dtype).numpy()
            for pos in self._fixed
        ]

    def _variable_values(self, pos: int, values: list[Any]) -> list[Any]:
        leaf = self._layout.leaves[pos]  # type: ignore[union-attr]
        if leaf.kind == RAGGED:  # copies: the storage owns its rows, never the caller's
            return [
                owned_row(v.detach().to(device="cpu", dtype=leaf.dtype, copy=True)) for v in values
            ]
        return list(values)  # str: immutable

    def _write_slots(self, slots: np.ndarray, fixed: list[np.ndarray], payload: list[Any]) -> None:
        cs = self.chunk_size
        chunk_of = slots // cs
        for k in np.unique(chunk_of).tolist():
            targets, chunk = self._targets(k)
            where = np.nonzero(chunk_of == k)[0]
            rows = slots[where] - k * cs
            for dst, src in zip(targets, fixed, strict=True):
                dst[rows] = src[where]  # duplicates: the last one wins, as in numpy
            for j, pos in enumerate(self._variable):
                values = self._variable_values(pos, [payload[pos][w] for w in where.tolist()])
                column = chunk.variable[j]
                for r, v in zip(rows.tolist(), values, strict=True):
                    column[r] = v

    # --- chunk files -----------------------------------------------------------------------
    def _seal(self, k: int, fsync: bool = False) -> None:
        """Write open chunk ``k`` (its filled rows) to its file and map the file."""
        pa = _pyarrow()
        chunk = self._chunks[k]
        assert chunk.is_open
        layout = self._layout
        assert layout is not None
        rows = min(chunk.rows, max(0, self._length - k * self.chunk_size))
        columns, fields = [], []
        fixed_iter, variable_iter = iter(chunk.fixed), iter(chunk.variable)
        for leaf in layout.leaves:
            if leaf.kind == TENSOR:
                array = fixed_array(pa, next(fixed_iter)[:rows], leaf)
            elif leaf.kind == STRING:
                array = pa.array(next(variable_iter)[:rows], pa.string())
            else:
                array = ragged_array(pa, next(variable_iter)[:rows], leaf)
            meta = {
                "rbdata.shape": json.dumps(list(leaf.shape)),
                "rbdata.dtype": str(leaf.dtype)[6:],
            }
            fields.append(pa.field(_column_name(leaf.key), array.type, metadata=meta))
            columns.append(array)
        batch = pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))
        file = self._path / _chunk_file(k)
        tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
        with open_nofollow(tmp, "wb") as f, pa.PythonFile(f, mode="w") as sink:
            # open_nofollow: a planted symlink is refused, never followed
            with pa.ipc.new_file(sink, batch.schema) as writer:
                writer.write_batch(batch)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, file)  # replaces a symlink itself, never its target
        self._chunks[k] = self._sealed_chunk(file, k)
        self._addresses = None

    def _sealed_chunk(self, file: Path, k: int) -> _Chunk:
        """Map a chunk file, check it against the layout, and view its fixed-shape columns.

        Everything the gather kernel, the views and the in-place writes will touch is
        checked here, once (see :func:`~rbdata.storages.arrow._checks.check_batch`).
        """
        pa = _pyarrow()
        layout = self._layout
        if layout is None:
            raise ValueError(f"{file}: a chunk file but no layout in the metadata")
        with open_nofollow(file, "rb") as f:
            stat = os.fstat(f.fileno())
            if stat.st_size == 0:
                raise ValueError(f"{file}: an empty file, not an Arrow IPC file")
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buffer = pa.py_buffer(mapping)
        chunk = _Chunk()
        chunk.file = file
        chunk.ident = (stat.st_dev, stat.st_ino)
        chunk.base = buffer.address  # byte 0 of the mapping
        try:
            reader = pa.ipc.open_file(pa.BufferReader(buffer))
            if reader.num_record_batches != 1:
                raise ValueError(f"{file}: {reader.num_record_batches} record batches, expected 1")
            batch = chunk.batch = reader.get_batch(0)
            if batch.num_columns != len(layout.leaves):
                raise ValueError(
                    f"{file}: {batch.num_columns} columns, expected {len(layout.leaves)}"
                )
            full = min(self.chunk_size, self.capacity - k * self.chunk_size)
            check_batch(pa, batch, layout, file, full, (chunk.base, stat.st_size))
            chunk.rows = batch.num_rows
            for pos in self._fixed:
                leaf = layout.leaves[pos]
                column = batch.column(pos)
                flat = column.flatten() if leaf.shape else column
                view = flat.to_numpy(zero_copy_only=True)  # bools are stored as uint8
                if leaf.dtype is torch.bool:
                    view = view.view(np.bool_)
                chunk.fixed.append(view.reshape(batch.num_rows, *leaf.shape))
            check_views(layout, file, batch.num_rows, (chunk.base, stat.st_size), chunk.fixed)
        except pa.ArrowException as err:
            raise ValueError(f"{file}: not a readable Arrow IPC file ({err})") from None
        return chunk

    def _targets(self, k: int) -> tuple[list[np.ndarray], _Chunk]:
        """Where a write to chunk ``k`` goes: its file in place, or the chunk in memory.

        A full chunk of a layout without variable-length leaves is written in place
        through a writable mapping of its file (fixed-size Arrow buffers stay valid Arrow),
        like :class:`MemmapStorage`: a ring on its second lap rewrites no file.
        """
        chunk = self._chunks.get(k)
        full = min(self.chunk_size, self.capacity - k * self.chunk_size)
        if chunk is None or chunk.is_open or self._variable or chunk.rows != full:
            chunk = self._open_chunk(k)
            return chunk.fixed, chunk
        if chunk.writable is None:
            assert chunk.file is not None
            with open_nofollow(chunk.file, "r+b") as f:  # never through a symlink
                stat = os.fstat(f.fileno())
                if (stat.st_dev, stat.st_ino) != chunk.ident:
                    raise ValueError(f"{chunk.file}: replaced since it was opened")
                whole = np.memmap(f, dtype=np.uint8, mode="r+")
            chunk.mapped = whole
            views = []
            for view in chunk.fixed:
                start = view.ctypes.data - chunk.base
                raw = whole[start : start + view.nbytes]
                views.append(raw.view(view.dtype).reshape(view.shape))
            chunk.writable = views
        return chunk.writable, chunk

    def _refresh_addresses(self) -> None:
        # columns for the chunks that hold rows (the gather reads slots < len only)
        n = -(-self._length // self.chunk_size)
        addresses = np.zeros((len(self._fixed), n), np.int64)
        for k, chunk in self._chunks.items():
            if k < n:
                for j, array in enumerate(chunk.fixed):
                    addresses[j, k] = array.ctypes.data
        self._addresses = addresses
