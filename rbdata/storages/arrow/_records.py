"""The records of the redo journal of :class:`~rbdata.storages.ArrowStorage`: a write as bytes.

A record's body (framed by :mod:`~rbdata.storages.arrow._journal`) is ``n`` int64 slots,
then per fixed-shape leaf its ``n`` rows as raw bytes (layout order), then, only with
variable-length leaves, an Arrow IPC stream of those columns. :func:`log_write` appends a
write's record before the write is applied; :func:`decode_record` turns a record back into
slots and a batched payload, checked (a ``ValueError`` naming the journal if it is wrong);
:func:`replay` applies the whole records that :meth:`ArrowStorage.open` found.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rbdata._layout import STRING, TENSOR
from rbdata.storages.arrow._checks import arrow_type
from rbdata.storages.arrow._chunks import seal_left
from rbdata.storages.arrow._items import (
    fixed_arrays,
    load_pyarrow,
    ragged_array,
    ragged_rows,
    variable_values,
)
from rbdata.storages.arrow._journal import JOURNAL_FILE, Journal
from rbdata.storages.base import Prepared, Storage, WriteTarget

if TYPE_CHECKING:
    from rbdata.storages.arrow.storage import ArrowStorage

__all__ = ["decode_record", "log_write", "replay"]


def log_write(
    storage: ArrowStorage, journal: Journal, target: WriteTarget, prepared: Prepared
) -> None:
    """Append the write to the journal: slots, fixed rows raw, variable rows as Arrow."""
    slots = target.slots_numpy()
    n = len(slots)
    if not n:
        return
    layout = storage._layout
    assert layout is not None
    payload = prepared.payload
    if not prepared.batched:
        payload = [
            [v] if layout.leaves[i].kind != TENSOR else torch.as_tensor(v).unsqueeze(0)
            for i, v in enumerate(payload)
        ]
    parts: list[Any] = [slots]
    for a in fixed_arrays(layout, storage._fixed, payload):
        parts.append(np.ascontiguousarray(a).view(np.uint8).reshape(-1))
    if storage._variable:
        pa = load_pyarrow()
        columns, names = [], []
        for pos in storage._variable:
            leaf = layout.leaves[pos]
            values = variable_values(leaf, list(payload[pos]))
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
    journal.append(storage._epoch, n, parts)


def decode_record(
    storage: ArrowStorage, n: int, body: memoryview
) -> tuple[torch.Tensor, list[Any]]:
    """A journal record back to slots and a batched payload; ``ValueError`` if it is wrong."""
    layout = storage._layout
    assert layout is not None
    where = storage._path / JOURNAL_FILE
    fixed_bytes = int(storage._row_bytes.sum()) * n
    if n < 1 or n > 1 << 40 or len(body) < 8 * n + fixed_bytes:
        raise ValueError(f"{where}: a record of {n} rows holds {len(body)} bytes")
    slots = np.frombuffer(body, np.int64, n).copy()
    if slots.min() < 0 or slots.max() >= storage.capacity:
        raise ValueError(f"{where}: a record writes slots outside [0, {storage.capacity})")
    payload: list[Any] = [None] * len(layout.leaves)
    offset = 8 * n
    for pos, (shape, dtype), width in zip(
        storage._fixed, storage._specs, storage._row_bytes.tolist(), strict=True
    ):
        raw = np.frombuffer(body, np.uint8, width * n, offset).copy()
        payload[pos] = torch.from_numpy(raw).view(dtype).reshape(n, *shape)
        offset += width * n
    if storage._variable:
        pa = load_pyarrow()
        try:
            batch = pa.ipc.open_stream(pa.py_buffer(body[offset:])).read_next_batch()
            batch.validate(full=True)
        except pa.ArrowException as err:
            raise ValueError(f"{where}: a corrupt record ({err})") from None
        for j, pos in enumerate(storage._variable):
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


def replay(storage: ArrowStorage, records: list[tuple[int, memoryview]]) -> None:
    """Apply whole journal records, then write every row to the chunks (``storage``'s docs)."""
    if not records:
        return
    layout = storage._layout
    if layout is None:
        raise ValueError(f"{storage._path / JOURNAL_FILE}: records but no layout in the metadata")
    storage._replaying = True
    try:
        for n, body in records:
            slots, payload = decode_record(storage, n, body)
            target = WriteTarget.of_slots(slots)
            Storage.commit(storage, target, Prepared(payload, n, layout, True))
            seal_left(storage)
    finally:
        storage._replaying = False
    storage._sync(fsync=True)
