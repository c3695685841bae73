"""Up-front checks of a checkpoint's storage directory: names, counts and sizes, no symlink.

:func:`check_storage` reads the storage metadata (``layout.json`` of a memmap directory,
``_rbdata.json`` of an Arrow one) and checks every field and every file it names against the
files actually present, before anything is mapped, copied or allocated. The storages' own
``open`` checks again what it reads (the header's counts, the Arrow buffers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rbdata._layout import TENSOR
from rbdata.checkpoint._validate import (
    check_int,
    leaf_path,
    plain_file,
    read_json,
)
from rbdata.errors import CheckpointError
from rbdata.storages.arrow import ArrowStorage
from rbdata.storages.arrow._checks import check_meta as check_arrow_meta
from rbdata.storages.arrow.storage import _FORMAT as ARROW_FORMAT
from rbdata.storages.arrow.storage import _VERSION as ARROW_VERSION
from rbdata.storages.base import Storage
from rbdata.storages.list import ListStorage
from rbdata.storages.memmap._directory import check_meta, read_layout
from rbdata.storages.tensor import TensorStorage

__all__ = ["ARROW_META", "DIR", "HEADER", "LAYOUT", "check_storage"]

#: the subdirectory of a checkpoint that holds the storage's files
DIR = "storage"
#: the file names of the storage directories (MemmapStorage, ArrowStorage) that restores read
LAYOUT = "layout.json"
HEADER = "header.bin"
ARROW_META = "_rbdata.json"
_ARROW_SLACK = 1 << 20  # schema, field metadata, footer and alignment of one chunk file


def check_storage(cls: type[Storage], config: dict[str, Any], state: Any, root: Path) -> Any:
    """Check a storage's metadata and files under checkpoint directory ``root``.

    Nothing is allocated or mapped: every count, size and name is checked against the
    metadata and the files actually present (plain files inside the directory, no symlink).
    Returns what :func:`restore_storage` needs: the capacity, and for Arrow the files to copy.
    """
    where = f"{root / 'checkpoint.json'}"
    if issubclass(cls, ListStorage):
        capacity = check_int(config.get("max_size"), where, "storage.config.max_size", 1)
        return capacity, []
    if not isinstance(state, dict) or state.get("dir") != DIR:
        raise CheckpointError(f"{cls.__name__}: the state must name its directory {DIR!r}")
    src = root / DIR
    if src.is_symlink() or not src.is_dir():
        what = "a symlink" if src.is_symlink() else "missing"
        raise CheckpointError(f"{src}: the storage directory is {what} (no {LAYOUT})")
    if issubclass(cls, ArrowStorage):
        return _check_arrow(config, src)
    if issubclass(cls, TensorStorage):
        return _check_memmap(config, src), []
    raise CheckpointError(f"no restore rule for storage class {cls.__name__}")


def _check_max_size(config: dict[str, Any], capacity: int, file: Path) -> None:
    if "max_size" in config and config["max_size"] != capacity:
        raise CheckpointError(
            f"{file}: capacity {capacity}, the checkpoint's storage config says max_size="
            f"{config['max_size']!r:.40}"
        )


def _storage_meta(file: Path, fmt: str) -> dict[str, Any]:
    meta = read_json(file, "storage")
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        raise CheckpointError(f"{file}: not an {fmt} directory")
    return meta


def _check_memmap(config: dict[str, Any], src: Path) -> int:
    # layout.json is MemmapStorage's own format: its reader checks every field and file name
    file = src / LAYOUT
    try:
        capacity, layout, leaves = check_meta(src, read_layout(src))
    except (OSError, ValueError) as err:
        raise CheckpointError(str(err)) from None
    _check_max_size(config, capacity, file)
    for leaf, path in zip(layout.leaves if layout else (), leaves, strict=True):
        row = leaf.numel * leaf.dtype.itemsize
        size = plain_file(path, "storage").st_size
        if size != capacity * row:
            raise CheckpointError(
                f"{path}: {size} bytes on disk, expected {capacity * row} ({capacity} x "
                f"{row} bytes); truncated or corrupt"
            )
    # the header's format belongs to MemmapStorage: its counts are checked once it is open
    plain_file(src / HEADER, "storage")
    return capacity


def _check_arrow(config: dict[str, Any], src: Path) -> tuple[int, list[str]]:
    # _rbdata.json is ArrowStorage's own format: its reader checks every field
    file = src / ARROW_META
    meta = read_json(file, "storage")
    try:
        checked = check_arrow_meta(meta, file, ARROW_FORMAT, ARROW_VERSION)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    capacity, chunk, length = checked["capacity"], checked["chunk_size"], checked["length"]
    _check_max_size(config, capacity, file)
    for key, value in (("chunk_size", chunk), ("ragged", meta.get("ragged", []))):
        if key in config and config[key] != value:
            raise CheckpointError(
                f"{file}: {key}={value!r:.60}, the checkpoint's storage config says "
                f"{config[key]!r:.60}"
            )
    layout = checked["layout"]
    sizes = [
        leaf.numel * leaf.dtype.itemsize if leaf.kind == TENSOR else -1
        for leaf in (layout.leaves if layout is not None else ())
    ]
    # with fixed-shape leaves only, a chunk file is its rows plus a small Arrow framing: a
    # larger file is junk, refused before it is copied (variable-length leaves: no bound)
    limit = 2 * chunk * sum(sizes) + _ARROW_SLACK if min(sizes, default=-1) >= 0 else None
    names = [ARROW_META]
    for k in range(-(-length // chunk)):  # the chunks that hold rows: each must be present
        name = f"chunk-{k:06d}.arrow"
        path = leaf_path(src, name, file, "length")
        if not path.exists():
            raise CheckpointError(f"{path}: missing; the metadata says {length} rows")
        size = plain_file(path, "storage").st_size
        if limit is not None and size > limit:
            raise CheckpointError(
                f"{path}: {size} bytes, a chunk of {chunk} rows of this layout takes at most "
                f"{limit}; corrupt"
            )
        names.append(name)
    return capacity, names
