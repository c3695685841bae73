"""The batch gather of :class:`~rbdata.storages.ArrowStorage`: rows of many chunks at once.

Fixed-shape leaves are copied by one numba kernel call per batch (:func:`gather_rows`) from
the chunks' buffers (memory-mapped files or arrays in memory), whose addresses the storage
keeps in one ``[fixed leaf, chunk]`` table (:func:`chunk_addresses`); the kernel reads the
table, never a Python object per row. String and ragged leaves are taken per chunk
(:func:`gather_variable`): from the sealed chunk's Arrow column, or the open chunk's lists.
:func:`gather_items` (``ArrowStorage.gather``) puts the two together, in layout order.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
import torch
from tensordict import NonTensorStack

from rbdata._layout import STRING, Key, Leaf
from rbdata._numba import voidptr as _nb_voidptr
from rbdata.storages.arrow._items import load_pyarrow, ragged_rows

if TYPE_CHECKING:
    from rbdata.storages.arrow._chunks import Chunk
    from rbdata.storages.arrow.storage import ArrowStorage

__all__ = ["chunk_addresses", "chunk_column", "gather_items", "gather_rows", "gather_variable"]
__all__ += ["variable_rows"]


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


def chunk_addresses(chunks: dict[int, Chunk], n_fixed: int, n_chunks: int) -> np.ndarray:
    """The ``[fixed leaf, chunk]`` table of buffer addresses of the chunks below ``n_chunks``."""
    # columns for the chunks that hold rows (the gather reads slots < len only)
    addresses = np.zeros((n_fixed, n_chunks), np.int64)
    for k, chunk in chunks.items():
        if k < n_chunks:
            for j, array in enumerate(chunk.fixed):
                addresses[j, k] = array.ctypes.data
    return addresses


def gather_variable(
    chunks: dict[int, Chunk], chunk_size: int, leaf: Leaf, j: int, pos: int, slots: np.ndarray
) -> Any:
    """The rows at ``slots`` of variable leaf ``j`` (layout position ``pos``) as a batch."""
    values: list[Any] = [None] * len(slots)
    chunk_of = slots // chunk_size
    for k in np.unique(chunk_of).tolist():
        where = np.nonzero(chunk_of == k)[0]
        rows = slots[where] - k * chunk_size
        c = chunks[k]
        for w, v in zip(where.tolist(), variable_rows(c, j, pos, leaf, rows), strict=True):
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


def variable_rows(c: Chunk, j: int, pos: int, leaf: Leaf, rows: np.ndarray) -> list[Any]:
    """Rows of variable leaf ``j`` (layout position ``pos``) of one chunk, as a list."""
    if c.is_open:
        column = c.variable[j]
        return [column[r] for r in rows.tolist()]
    pa = load_pyarrow()
    taken = c.batch.column(pos).take(pa.array(rows))
    if leaf.kind == STRING:
        return [s if s is not None else "" for s in taken.to_pylist()]
    return ragged_rows(pa, taken, leaf)


def chunk_column(storage: ArrowStorage, key: str | Key, chunk: int) -> Any:
    """The rows of one leaf in one chunk (:meth:`ArrowStorage.column`)."""
    storage._check_open()
    layout = storage._layout
    key = (key,) if isinstance(key, str) else tuple(key)
    if layout is None or key not in layout.keys:
        raise KeyError(f"no key {key!r} in this storage")
    c = storage._chunks.get(chunk) if isinstance(chunk, int) else None
    if c is None:
        raise IndexError(f"chunk {chunk} holds no rows")
    pos = layout.keys.index(key)
    # an open chunk holds chunk_size rows, filled or not: only the filled ones are rows
    rows = min(c.rows, max(0, storage._length - chunk * storage.chunk_size))
    if pos in storage._fixed:
        view = c.fixed[storage._fixed.index(pos)][:rows]
        with warnings.catch_warnings():  # a read-only mapping: documented as read-only
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(view)
    j = storage._variable.index(pos)
    return variable_rows(c, j, pos, layout.leaves[pos], np.arange(rows))


def gather_items(
    storage: ArrowStorage, idx: torch.Tensor, extra: dict[str, torch.Tensor] | None
) -> Any:
    """``storage.gather``: the items at ``idx``, fixed-shape leaves by one kernel call."""
    storage._check_open()  # the chunks are unmapped: the gather kernel would read address 0
    layout = storage._layout
    if layout is None:
        raise IndexError("the storage is empty")
    n = int(idx.shape[0])
    slots = idx.numpy()
    if not slots.flags.c_contiguous:
        slots = np.ascontiguousarray(slots)
    outputs: list[Any] = []
    if storage._fixed:
        if storage._addresses is None:
            n_chunks = -(-storage._length // storage.chunk_size)
            storage._addresses = chunk_addresses(storage._chunks, len(storage._fixed), n_chunks)
        outputs = [torch.empty((n, *shape), dtype=dtype) for shape, dtype in storage._specs]
        gather_rows(
            storage._addresses,
            storage.chunk_size,
            slots,
            storage._row_bytes,
            np.array([out.data_ptr() for out in outputs], dtype=np.int64),
        )
    if storage._variable:  # back to layout order
        leaves = layout.leaves
        fixed, outputs = outputs, [None] * len(leaves)
        for pos, out in zip(storage._fixed, fixed, strict=True):
            outputs[pos] = out
        for j, pos in enumerate(storage._variable):
            outputs[pos] = gather_variable(
                storage._chunks, storage.chunk_size, leaves[pos], j, pos, slots
            )
    return layout.assemble(outputs, torch.Size((n,)), storage.device, extra)
