"""How an :class:`~rbdata.storages.ArrowStorage` is saved: its Arrow IPC files, copied.

The format behind the storage's persistence hooks (methods of ``ArrowStorage``), as functions
over paths, the checkpoint's config and state. A dump flushes the storage and copies its
metadata and chunk files; a restore copies them to a new temporary directory of its own
(in-place writes would otherwise change the checkpoint), removed when the restored storage is
closed or dropped.

- :func:`data_files`: the files of a directory that hold data (metadata and chunks);
- :func:`copy_files`: those files copied into a dump, checksummed;
- :func:`check_dumped`: a dump's ``_rbdata.json`` and the chunk files it names, before a copy;
- :func:`own_dir`: a new temporary directory, filled (:func:`copy_named`, :func:`write_state`)
  and opened;
- :func:`state_of`: the files as ``uint8`` tensors (``dump_state``);
- ``describe``: ``_meta.describe_dir`` (torch-free, for ``rbdata inspect``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from rbdata._core.atomic import fsync_dir
from rbdata._core.checked import leaf_path, plain_file, read_json
from rbdata._core.checksum import copy_with_crc
from rbdata._core.layout import TENSOR
from rbdata.errors import CheckpointError
from rbdata.storages._persist import check_dumped_dir, check_max_size
from rbdata.storages.arrow._checks import (
    FORMAT,
    META_FILE,
    VERSION,
    check_meta,
    chunk_file,
)
from rbdata.storages.base import Storage

__all__ = [
    "check_dumped",
    "copy_files",
    "copy_named",
    "data_files",
    "own_dir",
    "state_of",
    "write_state",
]

_T = TypeVar("_T")

_SLACK = 1 << 20  # schema, field metadata, footer and alignment of one chunk file


def data_files(root: Path) -> list[Path]:
    """The metadata and chunk files of ``root`` (everything that holds data), sorted.

    Examples:
        >>> import shutil, tempfile
        >>> from pathlib import Path
        >>> root = Path(tempfile.mkdtemp())
        >>> for name in ("_rbdata.json", "chunk-000000.arrow", "_journal.bin"):
        ...     _ = (root / name).write_bytes(b"")
        >>> [file.name for file in data_files(root)]
        ['_rbdata.json', 'chunk-000000.arrow']
        >>> shutil.rmtree(root)
    """
    return [
        file
        for file in sorted(root.iterdir())
        if file.name.startswith("chunk-") or file.name == META_FILE
    ]


def copy_files(
    files: list[Path], directory: Path, fsync: bool
) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
    """Copy ``files`` into ``directory`` (made already): the dump's state and checksums."""
    sums = {file.name: copy_with_crc(file, directory / file.name, fsync) for file in files}
    fsync_dir(directory, fsync)
    return {"dir": directory.name}, sums


def check_dumped(
    cls: type[Storage], src: Path, config: dict[str, Any], state: Any
) -> tuple[int, list[str]]:
    """Check a dump's ``_rbdata.json`` and the chunk files it names (present, plain, not too big).

    Returns:
        The capacity and the names of the files to copy (the metadata first).
    """
    check_dumped_dir(cls.__name__, src, state, "layout.json")
    # _rbdata.json is ArrowStorage's own format: its reader checks every field
    file = src / META_FILE
    meta = read_json(file, "storage")
    try:
        checked = check_meta(meta, file, FORMAT, VERSION)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    capacity, chunk, length = checked["capacity"], checked["chunk_size"], checked["length"]
    check_max_size(config, capacity, file)
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
    limit = 2 * chunk * sum(sizes) + _SLACK if min(sizes, default=-1) >= 0 else None
    names = [META_FILE]
    for k in range(-(-length // chunk)):  # the chunks that hold rows: each must be present
        name = chunk_file(k)
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


def own_dir(fill: Callable[[Path], None], open_dir: Callable[[Path], _T]) -> tuple[_T, Path]:
    """A new temporary directory filled by ``fill``, then opened by ``open_dir``.

    Returns:
        What ``open_dir`` gave, and the directory (removed if filling or opening fails).
    """
    own = Path(tempfile.mkdtemp(prefix="rbdata-arrow-"))
    try:
        fill(own)
        return open_dir(own), own
    except BaseException:
        shutil.rmtree(own, ignore_errors=True)
        raise


def copy_named(src: Path, names: list[str], own: Path) -> None:
    """Copy the files ``names`` of ``src`` into ``own`` (only those, no symlink followed)."""
    for name in names:
        copy_with_crc(src / name, own / name, fsync=False)


def write_state(state: Any, own: Path) -> None:
    """Write the files of a :func:`state_of` state into ``own``."""
    for name, data in state["files"].items():
        if not isinstance(name, str) or name.startswith("."):
            raise CheckpointError(f"ArrowStorage: bad file name {name!r}")
        data.numpy().tofile(leaf_path(own, name, Path("state"), "files"))


def state_of(files: list[Path]) -> dict[str, Any]:
    """``{"files": {name: the file's bytes as a uint8 tensor}}``."""
    return {
        "files": {file.name: torch.from_numpy(np.fromfile(file, dtype=np.uint8)) for file in files}
    }
