"""Checks of what :class:`~rbdata.storages.ArrowStorage` reads: metadata and chunk files.

Everything read from ``_rbdata.json`` is checked before anything is allocated, and every
chunk file is checked against the layout when it is mapped, once: its schema, its row count,
every buffer (``RecordBatch.validate(full=True)``: sizes, offsets monotone and in range,
UTF-8) and the addresses of the buffers the numba gather kernel and the zero-copy views read
(inside the file's mapping, aligned, of the right size). A failed check is a ``ValueError``
naming the file and what is wrong, never a signal in a later read.

The names of the files are here too (:data:`META_FILE`, :func:`chunk_file`), and
:func:`read_dir`, which checks a whole directory before :meth:`ArrowStorage.open` allocates
anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rbdata._core.files import check_dir, inside
from rbdata._core.layout import RAGGED, STRING, TENSOR, Layout, Leaf
from rbdata.storages.arrow._meta import (
    FORMAT,
    MAX_META_BYTES,
    META_FILE,
    VERSION,
    check_ragged,
    chunk_file,
    parse_meta,
    read_meta,
)
from rbdata.storages.arrow._meta import check_meta as check_spec_meta

__all__ = [
    "FORMAT",
    "MAX_META_BYTES",
    "META_FILE",
    "VERSION",
    "arrow_type",
    "chunk_file",
    "check_batch",
    "check_dtypes",
    "check_meta",
    "check_ragged",
    "check_views",
    "parse_meta",
    "read_dir",
]

TORCH_TO_NUMPY = {
    torch.float64: np.float64,
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}


def check_dtypes(leaves: Iterable[Leaf]) -> None:
    """Refuse the leaves whose dtype Arrow lacks (a ``TypeError`` naming the key)."""
    for leaf in leaves:
        if leaf.dtype not in TORCH_TO_NUMPY:
            raise TypeError(
                f"key {leaf.name}: ArrowStorage cannot store dtype {leaf.dtype}; "
                f"supported: {', '.join(str(d)[6:] for d in TORCH_TO_NUMPY)}"
            )


def check_meta(meta: Any, meta_file: Path, fmt: str, version: int) -> dict[str, Any]:
    """:func:`~rbdata.storages.arrow._meta.check_meta`, the layout as a :class:`Layout`."""
    out = check_spec_meta(meta, meta_file, fmt, version)
    if out["layout"] is not None:
        out["layout"] = Layout.from_spec(out["layout"])
    return out


def _value_type(pa: Any, leaf: Leaf) -> Any:
    # fixed-shape bool leaves are stored as uint8 0/1 (written in place); ragged as bool
    packed = leaf.dtype is torch.bool and leaf.kind == TENSOR
    dtype = np.uint8 if packed else TORCH_TO_NUMPY[leaf.dtype]
    prim = pa.from_numpy_dtype(dtype)
    return pa.list_(prim, leaf.numel) if leaf.shape else prim


def arrow_type(pa: Any, leaf: Leaf) -> Any:
    """The Arrow type ArrowStorage stores ``leaf`` as."""
    if leaf.kind == STRING:
        return pa.string()
    if leaf.kind == RAGGED:
        return pa.list_(_value_type(pa, leaf))
    return _value_type(pa, leaf)


def _buffers(array: Any) -> list[Any]:
    return [b for b in array.buffers() if b is not None]


def check_batch(
    pa: Any,
    batch: Any,
    layout: Layout,
    file: Path,
    max_rows: int,
    mapping: tuple[int, int],
) -> None:
    """Check a chunk's record batch against ``layout`` before anything reads it.

    Args:
        pa: the pyarrow module.
        batch: the record batch read from ``file``.
        layout: the storage's layout.
        file: the chunk file (for the messages).
        max_rows: the most rows the chunk may hold.
        mapping: ``(address, size)`` of the file's mapping: every buffer must lie inside it.

    Raises:
        ValueError: naming the file and the column.
    """
    names = [".".join(leaf.key) or "data" for leaf in layout.leaves]
    if batch.schema.names != names:
        raise ValueError(f"{file}: columns {batch.schema.names}, expected {names}")
    rows = batch.num_rows
    if not 0 <= rows <= max_rows:
        raise ValueError(f"{file}: {rows} rows, a chunk holds at most {max_rows}")
    for leaf, name, column in zip(layout.leaves, names, batch.columns, strict=True):
        expected = arrow_type(pa, leaf)
        if not column.type.equals(expected):
            raise ValueError(
                f"{file}: column {name!r} holds {column.type} values, expected {expected}"
            )
        if column.null_count:
            raise ValueError(f"{file}: column {name!r} holds nulls")
    try:
        batch.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowException) as err:
        raise ValueError(f"{file}: corrupt Arrow data ({err})") from None
    start, size = mapping
    for name, column in zip(names, batch.columns, strict=True):
        for buf in _buffers(column):
            if buf.size and not start <= buf.address <= start + size - buf.size:
                raise ValueError(f"{file}: column {name!r} has a buffer outside the file")


def check_views(
    layout: Layout, file: Path, rows: int, mapping: tuple[int, int], views: Sequence[np.ndarray]
) -> None:
    """Check the numpy views of the fixed-shape columns the gather kernel will read.

    Each must hold ``rows`` rows of its leaf, start 8-byte aligned (the kernel copies in
    units of up to 8 bytes) and lie inside the file's mapping ``(address, size)``.

    Raises:
        ValueError: naming the file and the column.
    """
    start, size = mapping
    fixed = [leaf for leaf in layout.leaves if leaf.kind == TENSOR]
    for leaf, view in zip(fixed, views, strict=True):
        address = view.ctypes.data
        if view.size != rows * leaf.numel or (
            view.nbytes and (address % 8 or not start <= address <= start + size - view.nbytes)
        ):
            raise ValueError(
                f"{file}: column {'.'.join(leaf.key) or 'data'!r}: its data buffer does not "
                f"hold {rows} aligned rows inside the file"
            )


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
    meta = check_meta(read_meta(meta_file), meta_file, FORMAT, VERSION)
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
