"""The chunk cache of :class:`~rbdata.storages.ArrowStorage`: chunks in memory and in files.

A chunk is *open* (mutable arrays in memory, :func:`open_chunk`: opened from its file once,
on the first write to it) or *sealed* (its file, memory-mapped and checked,
:func:`map_chunk`). :func:`seal` writes an open chunk back as a whole new file (a temporary
file, then ``os.replace``) and maps it; the storage seals every chunk the write cursor has
left (:func:`seal_left`), and all of them on a flush. Writes (:func:`write_runs`,
:func:`write_slots`) go where :func:`write_targets` says: the open chunk, or, for a full chunk of
a layout without variable-length leaves, the file itself in place through a writable
mapping (its fixed-size Arrow buffers stay valid Arrow).

The functions take the storage whose chunks they handle (``storage._chunks``, by number);
they drop its address table (``storage._addresses``) whenever a chunk's buffers move.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rbdata._files import open_nofollow
from rbdata._layout import STRING, TENSOR, Key
from rbdata.storages._target import WriteTarget
from rbdata.storages.arrow._checks import TORCH_TO_NUMPY, check_batch, check_views
from rbdata.storages.arrow._gather import variable_rows
from rbdata.storages.arrow._items import (
    fixed_array,
    fixed_arrays,
    load_pyarrow,
    ragged_array,
    variable_values,
)

if TYPE_CHECKING:
    from rbdata.storages.arrow.storage import ArrowStorage

__all__ = [
    "Chunk",
    "chunk_file",
    "column_name",
    "map_chunk",
    "open_chunk",
    "seal",
    "seal_left",
    "write_one",
    "write_runs",
    "write_targets",
    "write_slots",
]


def column_name(key: Key) -> str:
    """The Arrow column name of a leaf: its key joined by ``"."`` (``"data"`` for a tensor)."""
    return ".".join(key) or "data"


def chunk_file(k: int) -> str:
    """The file name of chunk ``k``."""
    return f"chunk-{k:06d}.arrow"


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
        return self.batch is None


def open_chunk(storage: ArrowStorage, k: int) -> Chunk:
    """The chunk ``k`` in memory, opened from its file (a copy) or new."""
    chunk = storage._chunks.get(k)
    if chunk is not None and chunk.is_open:
        return chunk
    layout = storage._layout
    assert layout is not None
    rows = min(storage.chunk_size, storage.capacity - k * storage.chunk_size)
    new = Chunk()
    new.rows = rows
    for pos in storage._fixed:
        leaf = layout.leaves[pos]
        new.fixed.append(np.zeros((rows, *leaf.shape), dtype=TORCH_TO_NUMPY[leaf.dtype]))
    for pos in storage._variable:
        leaf = layout.leaves[pos]
        empty = (
            "" if leaf.kind == STRING else np.zeros((0, *leaf.shape), TORCH_TO_NUMPY[leaf.dtype])
        )
        new.variable.append([empty] * rows)
    if chunk is not None:  # copy the sealed rows
        held = chunk.rows
        for dst, src in zip(new.fixed, chunk.fixed, strict=True):
            dst[:held] = src[:held]
        for j, column in enumerate(new.variable):
            pos = storage._variable[j]
            column[:held] = variable_rows(chunk, j, pos, layout.leaves[pos], np.arange(held))
    storage._chunks[k] = new
    storage._addresses = None
    return new


def write_runs(storage: ArrowStorage, target: WriteTarget, payload: list[Any]) -> None:
    """Write ``payload`` where ``target`` says: runs (slice copies per chunk) or slots."""
    layout = storage._layout
    assert layout is not None
    fixed = fixed_arrays(layout, storage._fixed, payload)
    runs = target.runs
    if runs is None:
        write_slots(storage, target.slots_numpy(), fixed, payload)
        return
    cs, offset, leaves = storage.chunk_size, 0, layout.leaves
    for run in runs:  # contiguous runs (a ring writer's path): slice copies per chunk
        start = run.start
        while start < run.stop:
            k = start // cs
            stop = min(run.stop, (k + 1) * cs)
            row, count = start - k * cs, stop - start
            targets, chunk = write_targets(storage, k)
            for dst, src in zip(targets, fixed, strict=True):
                dst[row : row + count] = src[offset : offset + count]
            for j, pos in enumerate(storage._variable):
                values = payload[pos][offset : offset + count]
                chunk.variable[j][row : row + count] = variable_values(leaves[pos], values)
            offset += count
            start = stop


def write_one(storage: ArrowStorage, index: int, payload: list[Any]) -> None:
    """Write one item (an unbatched payload) at slot ``index``."""
    layout = storage._layout
    assert layout is not None
    batch = [
        [v] if layout.leaves[i].kind != TENSOR else torch.as_tensor(v).unsqueeze(0)
        for i, v in enumerate(payload)
    ]
    slot = np.array([index], dtype=np.int64)
    write_slots(storage, slot, fixed_arrays(layout, storage._fixed, batch), batch)


def write_slots(
    storage: ArrowStorage, slots: np.ndarray, fixed: list[np.ndarray], payload: list[Any]
) -> None:
    """Write rows at ``slots`` (any order, duplicates: the last one wins), chunk by chunk."""
    cs, leaves = storage.chunk_size, storage._layout.leaves  # type: ignore[union-attr]
    chunk_of = slots // cs
    for k in np.unique(chunk_of).tolist():
        targets, chunk = write_targets(storage, k)
        where = np.nonzero(chunk_of == k)[0]
        rows = slots[where] - k * cs
        for dst, src in zip(targets, fixed, strict=True):
            dst[rows] = src[where]  # duplicates: the last one wins, as in numpy
        for j, pos in enumerate(storage._variable):
            values = variable_values(leaves[pos], [payload[pos][w] for w in where.tolist()])
            column = chunk.variable[j]
            for r, v in zip(rows.tolist(), values, strict=True):
                column[r] = v


def seal_left(storage: ArrowStorage) -> None:
    """Seal every open chunk but the one the write cursor is in."""
    tail = storage._next // storage.chunk_size
    for k, chunk in list(storage._chunks.items()):
        if chunk.is_open and k != tail:
            seal(storage, k)


def seal(storage: ArrowStorage, k: int, fsync: bool = False) -> None:
    """Write open chunk ``k`` (its filled rows) to its file and map the file."""
    pa = load_pyarrow()
    chunk = storage._chunks[k]
    assert chunk.is_open
    layout = storage._layout
    assert layout is not None
    rows = min(chunk.rows, max(0, storage._length - k * storage.chunk_size))
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
    file = storage._path / chunk_file(k)
    tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    with open_nofollow(tmp, "wb") as f, pa.PythonFile(f, mode="w") as sink:
        # open_nofollow: a planted symlink is refused, never followed
        with pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, file)  # replaces a symlink itself, never its target
    storage._chunks[k] = map_chunk(storage, file, k)
    storage._addresses = None


def map_chunk(storage: ArrowStorage, file: Path, k: int) -> Chunk:
    """Map a chunk file, check it against the layout, and view its fixed-shape columns.

    Everything the gather kernel, the views and the in-place writes will touch is
    checked here, once (see :func:`~rbdata.storages.arrow._checks.check_batch`).
    """
    pa = load_pyarrow()
    layout = storage._layout
    if layout is None:
        raise ValueError(f"{file}: a chunk file but no layout in the metadata")
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
            raise ValueError(f"{file}: {batch.num_columns} columns, expected {len(layout.leaves)}")
        full = min(storage.chunk_size, storage.capacity - k * storage.chunk_size)
        check_batch(pa, batch, layout, file, full, (chunk.base, stat.st_size))
        chunk.rows = batch.num_rows
        for pos in storage._fixed:
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


def write_targets(storage: ArrowStorage, k: int) -> tuple[list[np.ndarray], Chunk]:
    """Where a write to chunk ``k`` goes: its file in place, or the chunk in memory.

    A full chunk of a layout without variable-length leaves is written in place
    through a writable mapping of its file (fixed-size Arrow buffers stay valid Arrow),
    like :class:`MemmapStorage`: a ring on its second lap rewrites no file.
    """
    chunk = storage._chunks.get(k)
    full = min(storage.chunk_size, storage.capacity - k * storage.chunk_size)
    if (
        chunk is None
        or chunk.is_open
        or storage._variable
        or chunk.rows != full
        or storage._hold is None  # a reading copy (refused writes first)
        or storage._hold.readers  # copies map the file: rewrite it whole, never in place
    ):
        chunk = open_chunk(storage, k)
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
