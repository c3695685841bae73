"""The redo journal of :class:`~rbdata.storages.ArrowStorage`: every write, before it is applied.

``_journal.bin`` is a sequence of records, one per ``commit``::

    header  <4sIQQQ: magic b"RBJ1", crc32 of the slots, epoch, rows n, body bytes
    body    n int64 slots, then per fixed-shape leaf its n rows (raw bytes, layout order),
            then (only with variable-length leaves) an Arrow IPC stream of those columns

A record is appended with one ``write`` before the rows reach the chunks, so a process killed
at any moment leaves a journal whose records are all whole but maybe the last one; a torn
last record (short, or a wrong checksum) is a batch that was never applied, and is dropped.
(A kill cuts a write short but never garbles what was written, so the length is the real
check; the checksum covers the header's slots only, to keep ``extend`` cheap: data garbled
on disk, e.g. by a power loss without :meth:`flush`, is not detected.)
Records carry the epoch of the metadata they extend: when every row is in the chunk files the
storage writes the metadata with a new epoch, then empties the journal, so a kill between
the two leaves records that are ignored.

:class:`Journal` writes a write's record (:meth:`Journal.log_write`: the slots, the fixed
rows raw, the variable rows as Arrow) and reads them back for :meth:`ArrowStorage.open`
(:meth:`Journal.replay`: slots and a batched payload, checked; a ``ValueError`` naming the
journal if a record is wrong).
"""

from __future__ import annotations

import contextlib
import os
import struct
import weakref
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rbdata._core.files import open_nofollow
from rbdata._core.layout import STRING
from rbdata.storages._target import WriteTarget
from rbdata.storages.arrow._checks import arrow_type
from rbdata.storages.arrow._items import (
    Columns,
    load_pyarrow,
    ragged_array,
    ragged_rows,
    variable_values,
)
from rbdata.storages.arrow._meta import JOURNAL_FILE
from rbdata.storages.base import Prepared

__all__ = ["JOURNAL_FILE", "Journal", "read_journal"]

_MAGIC = b"RBJ1"
_HEADER = struct.Struct("<4sIQQQ")


class Journal:
    """The append side of ``_journal.bin`` in ``root``.

    The file is created (without following a symlink) at the first record and removed when
    the journal is emptied, so a flushed storage directory holds no journal.
    """

    def __init__(self, root: Path) -> None:
        self._path = root / JOURNAL_FILE
        self._fd = -1
        self._close: Any = None
        self.size = 0

    def _open(self) -> int:
        file = open_nofollow(self._path, "ab")
        self._fd = os.dup(file.fileno())  # a raw descriptor, closed with this object
        file.close()
        self._close = weakref.finalize(self, os.close, self._fd)
        self.size = os.fstat(self._fd).st_size
        return self._fd

    def append(self, epoch: int, n: int, parts: list[Any]) -> None:
        """Append one record of ``n`` rows whose body is the concatenation of ``parts``."""
        fd = self._fd if self._fd >= 0 else self._open()
        views = [memoryview(p).cast("B") for p in parts]
        crc = zlib.crc32(views[0])  # the slots: a kill cuts a record short, it never garbles it
        body = sum(v.nbytes for v in views)
        buffers = [memoryview(_HEADER.pack(_MAGIC, crc, epoch, n, body)), *views]
        while buffers:
            written = os.writev(fd, buffers)
            self.size += written
            while buffers and written >= buffers[0].nbytes:
                written -= buffers[0].nbytes
                buffers.pop(0)
            if buffers and written:
                buffers[0] = buffers[0][written:]

    def log_write(
        self, epoch: int, columns: Columns, target: WriteTarget, prepared: Prepared
    ) -> None:
        """Append a write's record: slots, fixed rows raw, variable rows as Arrow."""
        slots = target.slots_numpy()
        n = len(slots)
        if not n:
            return
        payload = prepared.payload
        if not prepared.batched:
            payload = columns.batch_of_one(payload)
        parts: list[Any] = [slots]
        for a in columns.fixed_arrays(payload):
            parts.append(np.ascontiguousarray(a).view(np.uint8).reshape(-1))
        if columns.variable:
            pa = load_pyarrow()
            arrays, names = [], []
            for pos in columns.variable:
                leaf = columns.layout.leaves[pos]
                values = variable_values(leaf, list(payload[pos]))
                if leaf.kind == STRING:
                    arrays.append(pa.array(values, pa.string()))
                else:
                    arrays.append(ragged_array(pa, values, leaf))
                names.append(str(pos))
            batch = pa.RecordBatch.from_arrays(arrays, names=names)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            parts.append(sink.getvalue())
        self.append(epoch, n, parts)

    def replay(
        self, epoch: int, columns: Columns | None, capacity: int
    ) -> Iterator[tuple[torch.Tensor, list[Any]]]:
        """The whole records of ``epoch`` in the journal, each as slots and a batched payload.

        Raises:
            ValueError: for records but no layout (``columns`` ``None``), or a wrong record
                (raised when it is reached: the records before it come first).
        """
        records = read_journal(self._path.parent, epoch)
        if not records:
            return
        if columns is None:
            raise ValueError(f"{self._path}: records but no layout in the metadata")
        for n, body in records:
            yield self._decode(columns, capacity, n, body)

    def _decode(
        self, columns: Columns, capacity: int, n: int, body: memoryview
    ) -> tuple[torch.Tensor, list[Any]]:
        """A record back to slots and a batched payload; ``ValueError`` if it is wrong."""
        layout = columns.layout
        where = self._path
        fixed_bytes = int(columns.row_bytes.sum()) * n
        if n < 1 or n > 1 << 40 or len(body) < 8 * n + fixed_bytes:
            raise ValueError(f"{where}: a record of {n} rows holds {len(body)} bytes")
        slots = np.frombuffer(body, np.int64, n).copy()
        if slots.min() < 0 or slots.max() >= capacity:
            raise ValueError(f"{where}: a record writes slots outside [0, {capacity})")
        payload: list[Any] = [None] * len(layout.leaves)
        offset = 8 * n
        for pos, (shape, dtype), width in zip(
            columns.fixed, columns.specs, columns.row_bytes.tolist(), strict=True
        ):
            raw = np.frombuffer(body, np.uint8, width * n, offset).copy()
            payload[pos] = torch.from_numpy(raw).view(dtype).reshape(n, *shape)
            offset += width * n
        if columns.variable:
            pa = load_pyarrow()
            try:
                batch = pa.ipc.open_stream(pa.py_buffer(body[offset:])).read_next_batch()
                batch.validate(full=True)
            except pa.ArrowException as err:
                raise ValueError(f"{where}: a corrupt record ({err})") from None
            for j, pos in enumerate(columns.variable):
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

    def reset(self) -> None:
        """Remove the journal (every row it held is in the chunk files and the metadata)."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()
        self.size = 0

    def close(self) -> None:
        """Close the file."""
        if self._close is not None:
            self._close()
            self._close = None
        self._fd = -1


def read_journal(root: Path, epoch: int) -> list[tuple[int, memoryview]]:
    """The whole records of ``epoch`` in ``root``'s journal, in order: ``(rows, body)``.

    Reading stops at the first record that is short, not a record or fails its checksum (a
    write cut by a kill): that one and anything after it are dropped.
    """
    path = root / JOURNAL_FILE
    if not path.exists() and not path.is_symlink():
        return []
    with open_nofollow(path, "rb") as f:
        data = memoryview(f.read())
    records = []
    pos = 0
    while pos + _HEADER.size <= len(data):
        magic, crc, rec_epoch, n, body = _HEADER.unpack_from(data, pos)
        start = pos + _HEADER.size
        if magic != _MAGIC or start + body > len(data):
            break
        payload = data[start : start + body]
        if body < 8 * n or zlib.crc32(payload[: 8 * n]) != crc:
            break
        if rec_epoch == epoch:
            records.append((n, payload))
        pos = start + body
    return records
