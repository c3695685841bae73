"""The chunk cache of :class:`~rbdata.storages.ArrowStorage`: chunks in memory and in files.

:class:`ChunkCache` owns a storage's chunks, by number. A chunk is *open* (mutable arrays in
memory, :meth:`ChunkCache.open`: opened from its file once, on the first write to it) or
*sealed* (its file, memory-mapped and checked, :meth:`ChunkCache.map`).
:meth:`ChunkCache.seal` writes an open chunk back as a whole new file (a temporary file, then
``os.replace``) and maps it; the storage seals every chunk the write cursor has left
(:meth:`ChunkCache.seal_left`), and all of them on a flush (:meth:`ChunkCache.sync`). Writes
go to the open chunk, or, for a full chunk of a layout without variable-length leaves, to the
file itself in place through a writable mapping (its fixed-size Arrow buffers stay valid
Arrow).

Reads gather from the same chunks (:meth:`ChunkCache.gather`): fixed-shape leaves are copied
by one numba kernel call per batch (:func:`gather_rows`) from the chunks' buffers
(memory-mapped files or arrays in memory), whose addresses the cache keeps in one
``[fixed leaf, chunk]`` table, dropped whenever a chunk's buffers move; the kernel reads the
table, never a Python object per row. String and ragged leaves are taken per chunk: from the
sealed chunk's Arrow column, or the open chunk's lists.
"""

from __future__ import annotations

import json
import mmap
import os
import warnings
from pathlib import Path
from typing import Any

import numba
import numpy as np
import torch
from tensordict import NonTensorStack

from rbdata._core.files import open_nofollow
from rbdata._core.layout import STRING, TENSOR, Key, Leaf
from rbdata._core.native import voidptr as _nb_voidptr
from rbdata.errors import MissingKeyError
from rbdata.storages._target import WriteTarget
from rbdata.storages.arrow._checks import TORCH_TO_NUMPY, check_batch, check_views, chunk_file
from rbdata.storages.arrow._items import (
    Columns,
    fixed_array,
    load_pyarrow,
    ragged_array,
    ragged_rows,
    variable_values,
)

__all__ = ["Chunk", "ChunkCache", "column_name", "gather_rows"]


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


def gather_rows(
    addresses: np.ndarray,
    chunk_size: int,
    index: np.ndarray,
    row_bytes: np.ndarray,
    out_addresses: np.ndarray,
) -> None:
    """Copy rows of fixed-shape leaves from per-chunk buffers into outputs (one call a batch)."""
    _nb_gather_rows(addresses, chunk_size, index, row_bytes, out_addresses)


def column_name(key: Key) -> str:
    """The Arrow column name of a leaf: its key joined by ``"."`` (``"data"`` for a tensor)."""
    return ".".join(key) or "data"


class Chunk:
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
        """Whether the chunk is held in memory (else it is its mapped file)."""
        return self.batch is None

    def variable_rows(self, j: int, pos: int, leaf: Leaf, rows: np.ndarray) -> list[Any]:
        """Rows of variable leaf ``j`` (layout position ``pos``), as a list."""
        if self.is_open:
            column = self.variable[j]
            return [column[r] for r in rows.tolist()]
        pa = load_pyarrow()
        taken = self.batch.column(pos).take(pa.array(rows))
        if leaf.kind == STRING:
            return [s if s is not None else "" for s in taken.to_pylist()]
        return ragged_rows(pa, taken, leaf)

    def writable_views(self) -> list[np.ndarray]:
        """Writable views of a sealed chunk's fixed-shape columns, through its file mapped."""
        if self.writable is None:
            assert self.file is not None
            with open_nofollow(self.file, "r+b") as f:  # never through a symlink
                stat = os.fstat(f.fileno())
                if (stat.st_dev, stat.st_ino) != self.ident:
                    raise ValueError(f"{self.file}: replaced since it was opened")
                whole = np.memmap(f, dtype=np.uint8, mode="r+")
            self.mapped = whole
            views = []
            for view in self.fixed:
                start = view.ctypes.data - self.base
                raw = whole[start : start + view.nbytes]
                views.append(raw.view(view.dtype).reshape(view.shape))
            self.writable = views
        return self.writable


class ChunkCache:
    """The chunks of one storage directory: by number, open in memory or mapped files.

    Args:
        path: the storage directory.
        capacity: the storage's capacity in rows.
        chunk_size: rows per chunk.

    Attributes:
        chunks: the chunks that hold rows, by number (nothing per chunk the capacity allows).
        columns: the layout's leaves as the chunks keep them (``None`` before the first write).
    """

    def __init__(self, path: Path, capacity: int, chunk_size: int) -> None:
        self.path = path
        self.capacity = capacity
        self.chunk_size = chunk_size
        self.chunks: dict[int, Chunk] = {}
        self.columns: Columns | None = None
        self._addresses: np.ndarray | None = None  # [fixed leaf, chunk] buffer addresses

    def _columns(self) -> Columns:
        columns = self.columns
        assert columns is not None
        return columns

    def full_rows(self, k: int) -> int:
        """The rows chunk ``k`` holds when full (the last one may be short)."""
        return min(self.chunk_size, self.capacity - k * self.chunk_size)

    def clear(self) -> None:
        """Forget every chunk (their files are the storage's to remove)."""
        self.chunks = {}
        self._addresses = None

    # --- open chunks and sealing ---------------------------------------------------------
    def open(self, k: int) -> Chunk:
        """The chunk ``k`` in memory, opened from its file (a copy) or new."""
        chunk = self.chunks.get(k)
        if chunk is not None and chunk.is_open:
            return chunk
        columns = self._columns()
        leaves = columns.layout.leaves
        rows = self.full_rows(k)
        new = Chunk()
        new.rows = rows
        for pos in columns.fixed:
            leaf = leaves[pos]
            new.fixed.append(np.zeros((rows, *leaf.shape), dtype=TORCH_TO_NUMPY[leaf.dtype]))
        for pos in columns.variable:
            leaf = leaves[pos]
            empty = (
                ""
                if leaf.kind == STRING
                else np.zeros((0, *leaf.shape), TORCH_TO_NUMPY[leaf.dtype])
            )
            new.variable.append([empty] * rows)
        if chunk is not None:  # copy the sealed rows
            held = chunk.rows
            for dst, src in zip(new.fixed, chunk.fixed, strict=True):
                dst[:held] = src[:held]
            for j, column in enumerate(new.variable):
                pos = columns.variable[j]
                column[:held] = chunk.variable_rows(j, pos, leaves[pos], np.arange(held))
        self.chunks[k] = new
        self._addresses = None
        return new

    def seal_left(self, cursor: int, length: int) -> None:
        """Seal every open chunk but the one the write cursor (slot ``cursor``) is in."""
        tail = cursor // self.chunk_size
        for k, chunk in list(self.chunks.items()):
            if chunk.is_open and k != tail:
                self.seal(k, length)

    def sync(self, length: int, fsync: bool) -> None:
        """Seal every open chunk; with ``fsync``, also flush the in-place writes to disk."""
        for k, chunk in list(self.chunks.items()):
            if chunk.is_open:
                self.seal(k, length, fsync)
            elif fsync and chunk.mapped is not None:
                chunk.mapped.flush()

    def seal(self, k: int, length: int, fsync: bool = False) -> None:
        """Write open chunk ``k`` (its rows below ``length``) to its file and map the file."""
        pa = load_pyarrow()
        chunk = self.chunks[k]
        assert chunk.is_open
        layout = self._columns().layout
        rows = min(chunk.rows, max(0, length - k * self.chunk_size))
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
            fields.append(pa.field(column_name(leaf.key), array.type, metadata=meta))
            columns.append(array)
        batch = pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))
        file = self.path / chunk_file(k)
        tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
        with open_nofollow(tmp, "wb") as f, pa.PythonFile(f, mode="w") as sink:
            # open_nofollow: a planted symlink is refused, never followed
            with pa.ipc.new_file(sink, batch.schema) as writer:
                writer.write_batch(batch)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, file)  # replaces a symlink itself, never its target
        self.chunks[k] = self.map(file, k)
        self._addresses = None

    def load(self, files: list[Path], length: int) -> None:
        """Map the chunk files of a directory being opened (file ``k`` is chunk ``k``)."""
        pa = load_pyarrow()
        for k, file in enumerate(files):
            expected = min(self.chunk_size, length - k * self.chunk_size)
            try:
                chunk = self.map(file, k)
            except (OSError, pa.ArrowException) as err:
                raise ValueError(f"{file}: not a readable Arrow IPC file ({err})") from err
            if chunk.rows < expected:
                raise ValueError(
                    f"{file}: {chunk.rows} rows, expected {expected}; truncated or corrupt"
                )
            self.chunks[k] = chunk
        self._addresses = None

    def map(self, file: Path, k: int) -> Chunk:
        """Map a chunk file, check it against the layout, and view its fixed-shape columns.

        Everything the gather kernel, the views and the in-place writes will touch is
        checked here, once (see :func:`~rbdata.storages.arrow._checks.check_batch`).
        """
        pa = load_pyarrow()
        if self.columns is None:
            raise ValueError(f"{file}: a chunk file but no layout in the metadata")
        layout = self.columns.layout
        with open_nofollow(file, "rb") as f:
            stat = os.fstat(f.fileno())
            if stat.st_size == 0:
                raise ValueError(f"{file}: an empty file, not an Arrow IPC file")
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buffer = pa.py_buffer(mapping)
        chunk = Chunk()
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
            check_batch(pa, batch, layout, file, self.full_rows(k), (chunk.base, stat.st_size))
            chunk.rows = batch.num_rows
            for pos in self.columns.fixed:
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

    # --- writes --------------------------------------------------------------------------
    def write_runs(self, target: WriteTarget, payload: list[Any], in_place: bool) -> None:
        """Write a batched ``payload`` where ``target`` says: runs (slice copies) or slots.

        ``in_place``: full chunks of a layout without variable-length leaves may be written
        through a writable mapping of their file (no reading copy maps them).
        """
        columns = self._columns()
        fixed = columns.fixed_arrays(payload)
        runs = target.runs
        if runs is None:
            self.write_slots(target.slots_numpy(), fixed, payload, in_place)
            return
        cs, offset, leaves = self.chunk_size, 0, columns.layout.leaves
        for run in runs:  # contiguous runs (a ring writer's path): slice copies per chunk
            start = run.start
            while start < run.stop:
                k = start // cs
                stop = min(run.stop, (k + 1) * cs)
                row, count = start - k * cs, stop - start
                targets, chunk = self._targets(k, in_place)
                for dst, src in zip(targets, fixed, strict=True):
                    dst[row : row + count] = src[offset : offset + count]
                for j, pos in enumerate(columns.variable):
                    values = payload[pos][offset : offset + count]
                    chunk.variable[j][row : row + count] = variable_values(leaves[pos], values)
                offset += count
                start = stop

    def write_one(self, index: int, payload: list[Any], in_place: bool) -> None:
        """Write one item (an unbatched payload) at slot ``index``."""
        columns = self._columns()
        batch = columns.batch_of_one(payload)
        slot = np.array([index], dtype=np.int64)
        self.write_slots(slot, columns.fixed_arrays(batch), batch, in_place)

    def write_slots(
        self, slots: np.ndarray, fixed: list[np.ndarray], payload: list[Any], in_place: bool
    ) -> None:
        """Write rows at ``slots`` (any order, duplicates: the last one wins), chunk by chunk."""
        columns = self._columns()
        cs, leaves = self.chunk_size, columns.layout.leaves
        chunk_of = slots // cs
        for k in np.unique(chunk_of).tolist():
            targets, chunk = self._targets(k, in_place)
            where = np.nonzero(chunk_of == k)[0]
            rows = slots[where] - k * cs
            for dst, src in zip(targets, fixed, strict=True):
                dst[rows] = src[where]  # duplicates: the last one wins, as in numpy
            for j, pos in enumerate(columns.variable):
                values = variable_values(leaves[pos], [payload[pos][w] for w in where.tolist()])
                column = chunk.variable[j]
                for r, v in zip(rows.tolist(), values, strict=True):
                    column[r] = v

    def _targets(self, k: int, in_place: bool) -> tuple[list[np.ndarray], Chunk]:
        """Where a write to chunk ``k`` goes: its file in place, or the chunk in memory.

        A full chunk of a layout without variable-length leaves is written in place
        through a writable mapping of its file (fixed-size Arrow buffers stay valid Arrow),
        like :class:`MemmapStorage`: a ring on its second lap rewrites no file.
        """
        chunk = self.chunks.get(k)
        if (
            chunk is None
            or chunk.is_open
            or self._columns().variable
            or chunk.rows != self.full_rows(k)
            or not in_place  # copies map the file: rewrite it whole, never in place
        ):
            chunk = self.open(k)
            return chunk.fixed, chunk
        return chunk.writable_views(), chunk

    # --- reads ---------------------------------------------------------------------------
    def column(self, key: Key, k: Any, length: int) -> Any:
        """The rows below ``length`` of leaf ``key`` in chunk ``k`` (``ArrowStorage.column``)."""
        columns = self.columns
        if columns is None or key not in columns.layout.keys:
            raise MissingKeyError(f"no key {key!r} in this storage")
        c = self.chunks.get(k) if isinstance(k, int) else None
        if c is None:
            raise IndexError(f"chunk {k} holds no rows")
        pos = columns.layout.keys.index(key)
        # an open chunk holds chunk_size rows, filled or not: only the filled ones are rows
        rows = min(c.rows, max(0, length - k * self.chunk_size))
        if pos in columns.fixed:
            view = c.fixed[columns.fixed.index(pos)][:rows]
            with warnings.catch_warnings():  # a read-only mapping: documented as read-only
                warnings.simplefilter("ignore", UserWarning)
                return torch.from_numpy(view)
        j = columns.variable.index(pos)
        return c.variable_rows(j, pos, columns.layout.leaves[pos], np.arange(rows))

    def gather(self, slots: np.ndarray, length: int) -> list[Any]:
        """Every leaf's rows at ``slots`` (below ``length``), in layout order.

        The fixed-shape leaves are copied by one kernel call (:func:`gather_rows`).
        """
        columns = self._columns()
        n = len(slots)
        outputs: list[Any] = []
        if columns.fixed:
            if self._addresses is None:
                self._addresses = self._address_table(-(-length // self.chunk_size))
            outputs = [torch.empty((n, *shape), dtype=dtype) for shape, dtype in columns.specs]
            gather_rows(
                self._addresses,
                self.chunk_size,
                slots,
                columns.row_bytes,
                np.array([out.data_ptr() for out in outputs], dtype=np.int64),
            )
        if columns.variable:  # back to layout order
            leaves = columns.layout.leaves
            fixed, outputs = outputs, [None] * len(leaves)
            for pos, out in zip(columns.fixed, fixed, strict=True):
                outputs[pos] = out
            for j, pos in enumerate(columns.variable):
                outputs[pos] = self._gather_variable(leaves[pos], j, pos, slots)
        return outputs

    def _address_table(self, n_chunks: int) -> np.ndarray:
        """The ``[fixed leaf, chunk]`` buffer addresses of the chunks below ``n_chunks``."""
        # columns for the chunks that hold rows (the gather reads slots < len only)
        addresses = np.zeros((len(self._columns().fixed), n_chunks), np.int64)
        for k, chunk in self.chunks.items():
            if k < n_chunks:
                for j, array in enumerate(chunk.fixed):
                    addresses[j, k] = array.ctypes.data
        return addresses

    def _gather_variable(self, leaf: Leaf, j: int, pos: int, slots: np.ndarray) -> Any:
        """The rows at ``slots`` of variable leaf ``j`` (layout position ``pos``) as a batch."""
        values: list[Any] = [None] * len(slots)
        cs = self.chunk_size
        chunk_of = slots // cs
        for k in np.unique(chunk_of).tolist():
            where = np.nonzero(chunk_of == k)[0]
            rows = slots[where] - k * cs
            taken = self.chunks[k].variable_rows(j, pos, leaf, rows)
            for w, v in zip(where.tolist(), taken, strict=True):
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
