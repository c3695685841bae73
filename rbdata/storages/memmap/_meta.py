"""``layout.json`` and ``header.bin`` of a :class:`~rbdata.storages.MemmapStorage`, torch-free.

What ``MemmapStorage.open`` reads and checks first (:func:`read_layout`, :func:`storage_id`,
:func:`check_meta`: every field, the layout as its metadata record), and :func:`describe_dir`,
what ``describe`` and ``rbdata inspect`` show of a directory: counts, keys and problems,
from these two files and the data files' sizes alone. No torch is imported here.
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
from pathlib import Path
from typing import Any

from rbdata._core.checked import plain_file
from rbdata._core.files import check_dir, inside, open_nofollow
from rbdata._core.ids import TRAILER_BYTES
from rbdata._core.spec import DTYPES, TENSOR, LayoutSpec
from rbdata.errors import CheckpointError
from rbdata.storages._describe import REPLAY_NOTE, StorageInfo, key_infos, regular_size
from rbdata.storages._persist import check_dumped_dir, check_max_size
from rbdata.storages.memmap._header import Header, bad_field

__all__ = [
    "FORMAT",
    "HEADER_FILE",
    "JOURNAL_FILE",
    "LAYOUT_FILE",
    "VERSION",
    "check_dumped",
    "check_meta",
    "describe_dumped",
    "describe_dir",
    "read_layout",
    "storage_id",
]

FORMAT = "rbdata.memmap"
#: version 2 adds the storage's id (``layout.json``'s ``"id"``, each data file's trailer);
#: version 1 directories (no id, no trailers) still open
VERSION = 2
_VERSIONS = (1, 2)
_ID = re.compile(r"[0-9a-f]{32}")
LAYOUT_FILE = "layout.json"
HEADER_FILE = "header.bin"
JOURNAL_FILE = "journal.bin"
_RESERVED = {LAYOUT_FILE, HEADER_FILE, JOURNAL_FILE, "shared.bin", "versions.bin"}
_MAX_META_BYTES = 1 << 24
_MAX_LEAVES = 4096
_MAX_BYTES = 1 << 56  # per file: far beyond any disk, far below an int64 overflow


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_layout(root: Path) -> dict[str, Any]:
    """Read ``layout.json`` of a storage directory (no symlink followed anywhere)."""
    if not root.exists() and not root.is_symlink():
        raise FileNotFoundError(f"{str(root)!r} is not a MemmapStorage: no such directory")
    check_dir(root, "MemmapStorage")
    file = root / LAYOUT_FILE
    if not file.exists() and not file.is_symlink():
        raise FileNotFoundError(f"{str(root)!r} is not a MemmapStorage: no {LAYOUT_FILE}")
    inside(root, LAYOUT_FILE)
    with open_nofollow(file, "rb") as f:
        if os.fstat(f.fileno()).st_size > _MAX_META_BYTES:
            raise ValueError(f"{file}: larger than {_MAX_META_BYTES} bytes; corrupt")
        raw = f.read()
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        what = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise ValueError(f"{file}: corrupt metadata file ({what})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{file}: not an {FORMAT} directory")
    version = meta.get("version")
    if isinstance(version, bool) or version not in _VERSIONS:
        raise ValueError(
            f"{file}: format version {reprlib.repr(version)}, expected one of {_VERSIONS}"
        )
    return meta


def storage_id(root: Path, meta: dict[str, Any]) -> str | None:
    """The id in ``layout.json`` (``None`` for a version-1 directory, which has none)."""
    if meta.get("version") == 1:
        return None
    ident = meta.get("id")
    if not isinstance(ident, str) or not _ID.fullmatch(ident):
        raise bad_field(root / LAYOUT_FILE, "id", ident, "32 lowercase hex digits")
    return ident


def check_meta(root: Path, meta: dict[str, Any]) -> tuple[int, LayoutSpec | None, list[Path]]:
    """Validate every field of ``layout.json``; return capacity, layout and the leaf files.

    The layout comes back as its metadata record (dtype names); ``MemmapStorage.open``
    turns it into a :class:`~rbdata._core.layout.Layout`.
    """
    file = root / LAYOUT_FILE
    value: Any = meta.get("capacity")
    if not _is_int(value) or not 0 < value <= _MAX_BYTES:
        raise bad_field(file, "capacity", value, "a positive integer")
    capacity = int(value)
    if "layout" not in meta:
        if "files" in meta:
            raise bad_field(file, "files", meta["files"], "no files without a layout")
        return capacity, None, []
    layout = meta["layout"]
    if not isinstance(layout, dict) or layout.get("kind") not in ("tensor", "tensordict"):
        raise bad_field(
            file,
            "layout.kind",
            layout.get("kind") if isinstance(layout, dict) else layout,
            "'tensor' or 'tensordict'",
        )
    leaves = layout.get("leaves")
    if not isinstance(leaves, list) or not 0 < len(leaves) <= _MAX_LEAVES:
        raise bad_field(file, "layout.leaves", leaves, f"a list of 1 to {_MAX_LEAVES} leaves")
    keys = set()
    for i, leaf in enumerate(leaves):
        where = f"layout.leaves[{i}]"
        if not isinstance(leaf, dict):
            raise bad_field(file, where, leaf, "an object")
        key, shape, dtype = leaf.get("key"), leaf.get("shape"), leaf.get("dtype")
        tensor_kind = layout["kind"] == "tensor"
        if (
            not isinstance(key, list)
            or not all(isinstance(k, str) and k for k in key)
            or (len(key) != 0 if tensor_kind else not key)
            or len(key) > 32
        ):
            raise bad_field(
                file, f"{where}.key", key, "a list of non-empty strings ([] for a tensor)"
            )
        if tuple(key) in keys:
            raise bad_field(file, f"{where}.key", key, "a key that appears once")
        keys.add(tuple(key))
        if (
            not isinstance(shape, list)
            or len(shape) > 32
            or not all(_is_int(d) and 0 <= d <= _MAX_BYTES for d in shape)
        ):
            raise bad_field(file, f"{where}.shape", shape, "a list of non-negative integers")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise bad_field(file, f"{where}.dtype", dtype, "a torch dtype name")
        if leaf.get("kind", TENSOR) != TENSOR:
            raise bad_field(file, f"{where}.kind", leaf.get("kind"), "'tensor' (fixed-shape only)")
        size = capacity * math.prod(shape) * DTYPES[dtype].itemsize
        if size > _MAX_BYTES:
            raise bad_field(file, f"{where}.shape", shape, f"a leaf of at most {_MAX_BYTES} bytes")
    for key in keys:  # ('a',) and ('a', 'b') cannot both be leaves
        if any(key[:n] in keys for n in range(1, len(key))):
            raise bad_field(file, "layout.leaves", list(key), "no key nested under another key")
    names = meta.get("files")
    if not isinstance(names, list) or len(names) != len(leaves):
        raise bad_field(file, "files", names, f"a list of {len(leaves)} file names (one per leaf)")
    if len(set(map(str, names))) != len(names) or set(map(str, names)) & _RESERVED:
        raise bad_field(file, "files", names, "distinct names of data files")
    paths = []
    for i, name in enumerate(names):
        try:
            paths.append(inside(root, name, "data file"))
        except ValueError as err:  # name the metadata file and field, keep the reason
            raise ValueError(f"{file}: field 'files[{i}]': {err}") from None
    return capacity, LayoutSpec.from_json(layout), paths


def check_dumped(
    name: str, src: Path, config: dict[str, Any], state: Any, meta_file: Path | None = None
) -> tuple[int, list[str]]:
    """Check the metadata and files of a directory dumped by storage class ``name``.

    What ``TensorStorage.check_dump`` (and ``MemmapStorage``'s) does, and what ``rbdata
    inspect`` checks of a checkpoint's storage; returns the capacity (and no plan).
    """
    del meta_file  # the messages name the directory's own files
    check_dumped_dir(name, src, state, LAYOUT_FILE)
    # layout.json is MemmapStorage's own format: its reader checks every field and file name
    file = src / LAYOUT_FILE
    try:
        meta = read_layout(src)
        capacity, layout, leaves = check_meta(src, meta)
        ident = storage_id(src, meta)
    except (OSError, ValueError) as err:
        raise CheckpointError(str(err)) from None
    saved = state.get("id")  # absent from checkpoints written before storage ids
    if saved is not None and saved != ident:
        raise CheckpointError(
            f"{src}: a storage directory of another checkpoint (layout.json's id {ident}, "
            f"checkpoint.json recorded {saved!r:.40}); the folder was swapped or replaced"
        )
    check_max_size(config, capacity, file)
    extra = TRAILER_BYTES if ident is not None else 0
    for leaf, path in zip(layout.leaves if layout else (), leaves, strict=True):
        row = leaf.numel * leaf.itemsize
        size = plain_file(path, "storage").st_size
        if size != capacity * row + extra:
            with_id = f" + a {extra}-byte id trailer" if extra else ""
            raise CheckpointError(
                f"{path}: {size} bytes on disk, expected {capacity * row + extra} ({capacity} "
                f"x {row} bytes{with_id}); truncated or corrupt"
            )
    # the header's format belongs to MemmapStorage: its counts are checked once it is open
    plain_file(src / HEADER_FILE, "storage")
    return capacity, []


def describe_dir(root: Path) -> tuple[StorageInfo, list[str]]:
    """``layout.json`` and ``header.bin`` (read-only, as a copy-on-write open reads them)."""
    meta = read_layout(root)
    capacity, layout, files = check_meta(root, meta)
    ident = storage_id(root, meta)
    extra = TRAILER_BYTES if ident is not None else 0
    header = Header(inside(root, HEADER_FILE), create=False, private=True, ident=ident)
    length, nxt = header.first
    header.close()
    file = root / HEADER_FILE
    if not 0 <= length <= capacity or (layout is None and length):
        raise bad_field(file, "length", length, f"in [0, {capacity}] with a layout")
    if not 0 <= nxt < capacity or nxt > length:
        raise bad_field(file, "next", nxt, f"in [0, {capacity}) and at most the length")
    problems = []
    for leaf, path in zip(layout.leaves if layout else (), files, strict=True):
        expected = capacity * leaf.numel * leaf.itemsize + extra
        size = regular_size(path)
        if size != expected:
            got = "missing or not a regular file" if size is None else f"{size} bytes"
            problems.append(f"{path.name}: {got}, expected {expected} for key {leaf.name}")
    details: dict[str, Any] = {}
    journal = inside(root, JOURNAL_FILE)
    if regular_size(journal):
        with open_nofollow(journal, "rb") as f:  # the head's commit word: 0 means empty
            committed = int.from_bytes(f.read(16)[8:], "little") != 0
        if committed:
            details["journal"] = f"a committed write not yet in the files ({REPLAY_NOTE})"
    return StorageInfo("memmap", capacity, length, nxt, key_infos(layout), details), problems


def describe_dumped(
    directory: Path,
    config: dict[str, Any] | None = None,
    state: Any = None,
    meta_file: Path | None = None,
) -> tuple[StorageInfo, list[str]]:
    """:func:`describe_dir` of a dumped directory (``TensorStorage.describe``'s signature)."""
    del config, state, meta_file
    return describe_dir(directory)
