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

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rbdata._core.files import check_dir, inside, open_nofollow
from rbdata._core.layout import RAGGED, STRING, TENSOR, Key, Layout, Leaf

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

#: the metadata file of an Arrow storage directory
META_FILE = "_rbdata.json"
FORMAT = "rbdata.arrow"
VERSION = 1
MAX_META_BYTES = 1 << 24  # a metadata file is a few KiB; refuse to read a huge one
_MAX_CAPACITY = 1 << 48

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


def check_ragged(ragged: Any) -> tuple[Key, ...]:
    """The ``ragged`` argument as key tuples: a list/tuple of ``str`` or of tuples of ``str``.

    Raises:
        TypeError: naming the argument and what was given.

    Examples:
        >>> check_ragged(["boxes", ("next", "boxes")])
        (('boxes',), ('next', 'boxes'))
        >>> check_ragged([3])
        Traceback (most recent call last):
        ...
        TypeError: ragged: expected a list of keys (str or tuple of str), got an element 3
    """
    if isinstance(ragged, (str, bytes)) or not isinstance(ragged, (list, tuple)):
        raise TypeError(f"ragged: expected a list of keys (str or tuple of str), got {ragged!r}")
    keys = []
    for key in ragged:
        if isinstance(key, str):
            keys.append((key,))
        elif isinstance(key, (list, tuple)) and key and all(isinstance(part, str) for part in key):
            keys.append(tuple(key))
        else:
            raise TypeError(
                f"ragged: expected a list of keys (str or tuple of str), got an element {key!r}"
            )
    return tuple(keys)


def parse_meta(raw: bytes, meta_file: Path) -> Any:
    """JSON from ``raw`` bytes of ``meta_file``; ``ValueError`` for anything unreadable."""
    if len(raw) > MAX_META_BYTES:
        raise ValueError(f"{meta_file}: over {MAX_META_BYTES} bytes, too large for metadata")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ValueError(f"{meta_file}: corrupt metadata file ({type(err).__name__})") from None


def _int(meta: dict[str, Any], name: str, meta_file: Path, low: int, high: int) -> int:
    if name not in meta:
        raise ValueError(f"{meta_file}: field {name!r} is missing")
    value = meta[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"{meta_file}: field {name!r} must be an integer in [{low}, {high}], got {value!r}"
        )
    return value


def _layout(obj: Any, meta_file: Path) -> Layout:
    where = f"{meta_file}: field 'layout'"
    if not isinstance(obj, dict) or not isinstance(obj.get("leaves"), list):
        raise ValueError(f"{where} must be an object with a list of 'leaves'")
    if obj.get("kind") not in ("tensor", "tensordict"):
        raise ValueError(f"{where}: 'kind' must be 'tensor' or 'tensordict'")
    leaves = obj["leaves"]
    if not leaves or (obj["kind"] == "tensor" and len(leaves) != 1):
        raise ValueError(f"{where}: {len(leaves)} leaves for kind {obj['kind']!r}")
    for i, entry in enumerate(leaves):
        bad = ""
        if not isinstance(entry, dict):
            bad = "is not an object"
        elif not isinstance(entry.get("key"), list) or not all(
            isinstance(p, str) and p for p in entry["key"]
        ):
            bad = "'key' must be a list of names"
        elif not isinstance(entry.get("shape"), list) or not all(
            type(s) is int and 0 <= s < 1 << 31 for s in entry["shape"]
        ):
            bad = "'shape' must be a list of non-negative integers"
        elif len(entry["shape"]) > 16 or math.prod(entry["shape"]) >= 1 << 31:
            bad = "'shape' is too large"
        elif not isinstance(entry.get("dtype"), str):
            bad = "'dtype' must be a string"
        elif entry.get("kind", TENSOR) not in (TENSOR, RAGGED, STRING):
            bad = f"unknown 'kind' {entry.get('kind')!r}"
        if bad:
            raise ValueError(f"{where}: leaf {i} {bad}")
    try:
        layout = Layout.from_json(obj)
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"{where}: {err}") from None
    keys = [leaf.key for leaf in layout.leaves]
    if len(set(keys)) != len(keys) or (layout.kind == "tensor" and keys != [()]):
        raise ValueError(f"{where}: duplicate or misplaced keys {keys}")
    for leaf in layout.leaves:
        if leaf.kind != STRING and leaf.dtype not in TORCH_TO_NUMPY:
            raise ValueError(f"{where}: key {leaf.name}: dtype {leaf.dtype} cannot be stored")
    return layout


def check_meta(meta: Any, meta_file: Path, fmt: str, version: int) -> dict[str, Any]:
    """Every field of an ArrowStorage metadata object, checked and converted.

    Returns a dict with ``capacity``, ``chunk_size``, ``ragged``, ``length``, ``next``,
    ``layout`` (a :class:`Layout` or ``None``) and ``epoch`` (journal generation).

    Raises:
        ValueError: naming the file and the field.
    """
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        raise ValueError(f"{meta_file}: not an {fmt} directory")
    if meta.get("version") != version:
        raise ValueError(f"{meta_file}: format version {meta.get('version')!r}, expected {version}")
    capacity = _int(meta, "capacity", meta_file, 1, _MAX_CAPACITY)
    out: dict[str, Any] = {
        "capacity": capacity,
        "chunk_size": _int(meta, "chunk_size", meta_file, 1, capacity),
        "length": _int(meta, "length", meta_file, 0, 1 << 62),
        "next": _int(meta, "next", meta_file, 0, 1 << 62),
        "epoch": _int(meta, "epoch", meta_file, 0, 1 << 62) if "epoch" in meta else 0,
    }
    if out["length"] > capacity or out["next"] >= capacity:
        raise ValueError(
            f"{meta_file}: length {out['length']} / next slot {out['next']} out of range for "
            f"capacity {capacity} (fields 'length', 'next')"
        )
    try:
        out["ragged"] = check_ragged(meta.get("ragged", []))
    except TypeError as err:
        raise ValueError(f"{meta_file}: field 'ragged': {err}") from None
    out["layout"] = _layout(meta["layout"], meta_file) if "layout" in meta else None
    if out["layout"] is None and out["length"]:
        raise ValueError(f"{meta_file}: {out['length']} rows but no field 'layout'")
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


def chunk_file(k: int) -> str:
    """The file name of chunk ``k``."""
    return f"chunk-{k:06d}.arrow"


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
