"""``_rbdata.json`` of an :class:`~rbdata.storages.ArrowStorage` directory, torch-free.

Its file names (:data:`META_FILE`, :func:`chunk_file`, :data:`JOURNAL_FILE`), the checks of
every field (:func:`check_meta`, the layout as its metadata record; what
:meth:`ArrowStorage.open <rbdata.storages.ArrowStorage.open>` checks first, through
``_checks``), and :func:`describe_dir`, what ``describe`` and ``rbdata inspect`` show of a
directory. No torch (nor pyarrow) is imported here.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from rbdata._core.files import inside, open_nofollow
from rbdata._core.spec import RAGGED, STRING, TENSOR, LayoutSpec
from rbdata.storages._describe import REPLAY_NOTE, StorageInfo, key_infos, regular_size

__all__ = [
    "ARROW_DTYPES",
    "FORMAT",
    "JOURNAL_FILE",
    "MAX_META_BYTES",
    "META_FILE",
    "VERSION",
    "check_meta",
    "check_ragged",
    "chunk_file",
    "describe_dir",
    "parse_meta",
    "read_meta",
]

#: the metadata file of an Arrow storage directory
META_FILE = "_rbdata.json"
FORMAT = "rbdata.arrow"
VERSION = 1
MAX_META_BYTES = 1 << 24  # a metadata file is a few KiB; refuse to read a huge one
_MAX_CAPACITY = 1 << 48

#: the journal of a storage being filled (``_journal``)
JOURNAL_FILE = "_journal.bin"
#: the dtypes an Arrow storage keeps (``_checks.TORCH_TO_NUMPY`` maps them to numpy)
ARROW_DTYPES = ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")


def check_ragged(ragged: Any) -> tuple[tuple[str, ...], ...]:
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


def _layout(obj: Any, meta_file: Path) -> LayoutSpec:
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
        layout = LayoutSpec.from_json(obj)
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"{where}: {err}") from None
    keys = [leaf.key for leaf in layout.leaves]
    if len(set(keys)) != len(keys) or (layout.kind == "tensor" and keys != [()]):
        raise ValueError(f"{where}: duplicate or misplaced keys {keys}")
    for leaf in layout.leaves:
        if leaf.kind != STRING and leaf.dtype not in ARROW_DTYPES:
            raise ValueError(f"{where}: key {leaf.name}: dtype torch.{leaf.dtype} cannot be stored")
    return layout


def check_meta(meta: Any, meta_file: Path, fmt: str, version: int) -> dict[str, Any]:
    """Every field of an ArrowStorage metadata object, checked and converted.

    Returns a dict with ``capacity``, ``chunk_size``, ``ragged``, ``length``, ``next``,
    ``layout`` (its metadata record, a :class:`~rbdata._core.spec.LayoutSpec`, or ``None``;
    ``_checks.check_meta`` makes it a ``Layout``) and ``epoch`` (journal generation).

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


def chunk_file(k: int) -> str:
    """The file name of chunk ``k``."""
    return f"chunk-{k:06d}.arrow"


def read_meta(file: Path) -> Any:
    """The metadata file ``file`` (``_rbdata.json``, not followed if a symlink), parsed.

    Its fields are left to the caller's ``check_meta`` (this module's, or the one that also
    builds the layout).

    Raises:
        ValueError: a file too large for metadata, or not JSON (:func:`parse_meta`).
    """
    with open_nofollow(file, "rb") as f:
        if os.fstat(f.fileno()).st_size > MAX_META_BYTES:
            raise ValueError(f"{file}: too large for a metadata file")
        raw = f.read()
    return parse_meta(raw, file)


def describe_dir(root: Path) -> tuple[StorageInfo, list[str]]:
    """``_rbdata.json`` checked as :meth:`ArrowStorage.open` checks it; chunk files by size."""
    file = inside(root, META_FILE, "metadata file")
    if not file.is_file():
        raise FileNotFoundError(f"{str(root)!r} is not an ArrowStorage: no {META_FILE}")
    meta = check_meta(read_meta(file), file, FORMAT, VERSION)
    length, chunk = meta["length"], meta["chunk_size"]
    problems = [
        f"{chunk_file(k)}: missing; the metadata says {min(chunk, length - k * chunk)} rows"
        for k in range(-(-length // chunk))
        if regular_size(inside(root, chunk_file(k), "chunk file")) is None
    ]
    details: dict[str, Any] = {"chunk_size": chunk}
    journal = regular_size(inside(root, JOURNAL_FILE))
    if journal:
        details["journal"] = f"{journal} bytes of writes since the last flush ({REPLAY_NOTE})"
    keys = key_infos(meta["layout"])
    return StorageInfo("arrow", meta["capacity"], length, meta["next"], keys, details), problems
