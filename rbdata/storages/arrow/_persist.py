"""How an :class:`~rbdata.storages.ArrowStorage` is saved: its Arrow IPC files, copied.

:class:`ArrowFiles` holds the persistence hooks of :class:`~rbdata.storages.Storage` for the
Arrow storage. A dump flushes the storage and copies its metadata and chunk files; a restore
copies them to a new temporary directory of its own (in-place writes would otherwise change
the checkpoint), removed when the restored storage is closed or dropped. ``describe`` reads
``_rbdata.json`` only, checked as :meth:`ArrowStorage.open` checks it; chunk files by size.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from rbdata._core.atomic import fsync_dir
from rbdata._core.checked import leaf_path, plain_file, read_json
from rbdata._core.checksum import copy_with_crc
from rbdata._core.files import inside, open_nofollow, remove_with
from rbdata._core.layout import TENSOR, Key, Layout
from rbdata.errors import CheckpointError
from rbdata.storages._describe import REPLAY_NOTE, StorageInfo, key_infos, regular_size
from rbdata.storages._persist import check_config, check_dumped_dir, check_max_size
from rbdata.storages.arrow._checks import (
    FORMAT,
    MAX_META_BYTES,
    META_FILE,
    TORCH_TO_NUMPY,
    VERSION,
    check_meta,
    chunk_file,
    parse_meta,
)
from rbdata.storages.arrow._journal import JOURNAL_FILE
from rbdata.storages.base import Codec, SavedStorage, Storage

__all__ = ["ArrowFiles"]

_A = TypeVar("_A", bound="ArrowFiles")

_SLACK = 1 << 20  # schema, field metadata, footer and alignment of one chunk file


def _check_dumped(src: Path, config: dict[str, Any]) -> tuple[int, list[str]]:
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


def describe_dir(root: Path) -> tuple[StorageInfo, list[str]]:
    """``_rbdata.json`` checked as :meth:`ArrowStorage.open` checks it; chunk files by size."""
    file = inside(root, META_FILE, "metadata file")
    if not file.is_file():
        raise FileNotFoundError(f"{str(root)!r} is not an ArrowStorage: no {META_FILE}")
    with open_nofollow(file, "rb") as f:
        if os.fstat(f.fileno()).st_size > MAX_META_BYTES:
            raise ValueError(f"{file}: too large for a metadata file")
        meta = check_meta(parse_meta(f.read(), file), file, FORMAT, VERSION)
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


class ArrowFiles(Storage):
    """The persistence hooks of :class:`~rbdata.storages.ArrowStorage`: its files, copied."""

    kind = "arrow"
    marker_file = META_FILE
    _finalizer: Any = None  # removes a temporary directory (see _files.storage_dir)
    chunk_size: int
    _ragged: tuple[Key, ...]
    _path: Path

    @classmethod
    @abstractmethod
    def open(cls: type[_A], path: str | os.PathLike[str], *, recover: bool = True) -> _A:
        """Reopen a storage directory (:meth:`ArrowStorage.open`)."""

    def _data_files(self) -> list[Path]:
        """Flush; return the metadata and chunk files (everything that holds data)."""
        self.flush()
        return [
            file
            for file in sorted(self._path.iterdir())
            if file.name.startswith("chunk-") or file.name == META_FILE
        ]

    @classmethod
    def _own_copy(cls: type[_A], fill: Callable[[Path], None]) -> _A:
        """Open a storage in a new temporary directory of its own, filled by ``fill``."""
        own = Path(tempfile.mkdtemp(prefix="rbdata-arrow-"))
        try:
            fill(own)
            arrow = cls.open(own)
        except BaseException:
            shutil.rmtree(own, ignore_errors=True)
            raise
        arrow._finalizer = remove_with(arrow, own)
        return arrow

    def abort(self) -> None:
        """Give up a storage being filled: close it without a flush, keep its directory.

        For a writer that failed midway (its caller removes the files): nothing more is
        written, not even when the storage is dropped. Every other method then raises
        ``ValueError``.
        """
        self._finalizer = None
        self._closed = True

    @property
    def block_rows(self) -> int | None:
        """:attr:`chunk_size`: a bulk copy reads or writes one chunk file at a time."""
        return self.chunk_size

    @classmethod
    def check_layout(cls, layout: Layout) -> None:
        """Refuse dtypes that Arrow lacks."""
        for leaf in layout.leaves:
            if leaf.dtype not in TORCH_TO_NUMPY:
                raise TypeError(
                    f"key {leaf.name}: ArrowStorage cannot store dtype {leaf.dtype}; "
                    f"supported: {', '.join(str(d)[6:] for d in TORCH_TO_NUMPY)}"
                )

    @classmethod
    def empty_like(
        cls: type[_A],
        src: Storage,
        path: str | os.PathLike[str] | None = None,
        block_rows: int | None = None,
    ) -> _A:
        """A new storage of ``src``'s capacity and ragged keys at ``path``.

        Its chunk size is ``block_rows``, else ``src``'s for an Arrow ``src``, else the
        default.
        """
        ragged = src._ragged if isinstance(src, ArrowFiles) else ()
        return cls(  # type: ignore[call-arg]
            src.capacity, path=path, chunk_size=block_rows or src.block_rows, ragged=ragged
        )

    def dump(
        self, directory: Path, codec: Codec, tensors: list[torch.Tensor], fsync: bool = True
    ) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
        """Flush, then copy the metadata and chunk files into ``directory``."""
        directory.mkdir()
        sums = {
            file.name: copy_with_crc(file, directory / file.name, fsync)
            for file in self._data_files()
        }
        fsync_dir(directory, fsync)
        return {"dir": directory.name}, sums

    @classmethod
    def check_dump(
        cls, directory: Path, config: dict[str, Any], state: Any, meta_file: Path
    ) -> Any:
        """Check ``_rbdata.json`` and the chunk files it names (present, plain, not too big)."""
        check_dumped_dir(cls, directory, state, "layout.json")
        return _check_dumped(directory, config)

    @classmethod
    def restore(cls: type[_A], saved: SavedStorage) -> _A:
        """A copy of the files the metadata names, in a temporary directory of its own."""
        directory, config, plan = saved.directory, saved.config, saved.plan
        names = plan[1]

        def copy(own: Path) -> None:  # only the files the metadata names, no symlink
            for name in names:
                copy_with_crc(directory / name, own / name, fsync=False)

        storage = cls._own_copy(copy)
        check_config(storage, config)
        return storage

    def dump_state(self, codec: Codec) -> dict[str, Any]:
        """``{"files": {name: the file's bytes as a uint8 tensor}}``, after a flush."""
        files = {
            file.name: torch.from_numpy(np.fromfile(file, dtype=np.uint8))
            for file in self._data_files()
        }
        return {"files": files}

    @classmethod
    def from_state(cls: type[_A], config: dict[str, Any], state: Any, codec: Codec) -> _A:
        """The files written to a temporary directory of its own, then opened."""

        def write(own: Path) -> None:
            for name, data in state["files"].items():
                if not isinstance(name, str) or name.startswith("."):
                    raise CheckpointError(f"ArrowStorage: bad file name {name!r}")
                data.numpy().tofile(leaf_path(own, name, Path("state"), "files"))

        storage = cls._own_copy(write)
        check_config(storage, config)
        return storage

    @classmethod
    def describe(
        cls,
        directory: Path,
        config: dict[str, Any] | None = None,
        state: Any = None,
        meta_file: Path | None = None,
    ) -> tuple[StorageInfo, list[str]]:
        """``_rbdata.json`` (checked as ``open`` checks it); chunk files by size."""
        return describe_dir(directory)
