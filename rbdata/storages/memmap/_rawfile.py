"""The raw files of a :class:`~rbdata.storages.MemmapStorage`: opened, created, mapped.

Only plain files are used, never symlinks (``O_NOFOLLOW``): :func:`open_fd` refuses a symlink
with a ``ValueError`` naming the file, :func:`regular_size` anything but a regular file. A
data file's space is reserved when it is created (:func:`create_file`), so a full disk is an
``OSError`` at the first write, never a SIGBUS.

A data file of a version-2 directory ends with a 32-byte trailer after its rows
(:func:`trailer`, :mod:`rbdata._core.ids`): the storage's id (``layout.json``'s ``"id"``) and the
leaf's index, checked by :func:`map_file` with one 32-byte read, so a file swapped in from
another storage or checkpoint, or renamed to another leaf, is refused at open.

:class:`DataFiles` holds a storage's data files: created for a layout, mapped, flushed.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rbdata._core.ids import TRAILER_BYTES
from rbdata._core.layout import Layout
from rbdata.storages import _memory
from rbdata.storages.memmap._plain import check_trailer, open_fd, regular_size, trailer

__all__ = [
    "DataFiles",
    "as_tensor",
    "check_trailer",
    "create_file",
    "map_file",
    "open_fd",
    "regular_size",
    "reserve",
    "trailer",
]


def create_file(path: Path, size: int, tail: bytes = b"") -> None:
    """Create ``path`` (no symlink followed) with ``size`` bytes reserved on disk.

    ``tail`` (a :func:`trailer`) is written after the ``size`` bytes.

    The space is reserved with ``posix_fallocate`` (a full disk is an ``OSError`` here, not a
    SIGBUS at the first write through a mapping); where that is unsupported the file is sized
    with ``ftruncate`` (sparse). On error the file is removed.
    """
    fd = open_fd(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, "a storage file")
    try:
        if size:
            reserve(fd, size, path)
        if tail:
            os.pwrite(fd, tail, size)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)


def reserve(fd: int, size: int, path: Path) -> None:
    """Grow the open file ``fd`` to ``size`` bytes with their space reserved on disk.

    ``posix_fallocate`` (a full disk is an ``OSError`` naming ``path``, never a SIGBUS at a
    write through a mapping); ``ftruncate`` (sparse) where that is unsupported.
    """
    try:
        os.posix_fallocate(fd, 0, size)
    except AttributeError:  # pragma: no cover - no posix_fallocate (macOS)
        os.ftruncate(fd, size)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise OSError(
                err.errno, f"{path}: cannot reserve {size} bytes ({err.strerror})"
            ) from err
        os.ftruncate(fd, size)


def as_tensor(buf: Any, offset: int, nbytes: int, dtype: torch.dtype, shape: Any) -> torch.Tensor:
    flat = torch.from_numpy(np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=offset))
    return flat.view(dtype).view(shape)


def map_file(
    path: Path,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    expected: int,
    private: bool,
    key: str,
    tail: tuple[str | None, int] = (None, 0),
) -> tuple[torch.Tensor, np.ndarray | None]:
    """Map an existing data file of exactly ``expected`` bytes of rows (symlinks refused).

    ``tail`` is the storage's id and the leaf's index: with an id, the file holds a
    :func:`trailer` after its rows, checked here (see :func:`check_trailer`).

    Returns the tensor and the ``uint8`` numpy array over the mapping that owns its memory
    (``None`` for an empty file): the storage holds it, see ``rbdata/storages/_memory.py``.
    """
    fd = open_fd(path, os.O_RDONLY if private else os.O_RDWR, "a storage file")
    try:
        size = regular_size(fd, path)
        extra = TRAILER_BYTES if tail[0] is not None else 0
        if size != expected + extra:
            with_id = f" + a {extra}-byte id trailer" if extra else ""
            raise ValueError(
                f"{path}: {size} bytes on disk, expected {expected + extra} for key {key} "
                f"({shape[0]} x {list(shape[1:])} {dtype}{with_id}); truncated or corrupt"
            )
        if extra:
            check_trailer(os.pread(fd, extra, expected), *tail, path)
        if expected == 0:
            return torch.zeros(shape, dtype=dtype), None
        access = mmap.ACCESS_COPY if private else mmap.ACCESS_WRITE
        mm = mmap.mmap(fd, expected, access=access)
    finally:
        os.close(fd)
    raw = np.frombuffer(mm, dtype=np.uint8, count=expected)
    return torch.from_numpy(raw).view(dtype).view(shape), raw


class DataFiles:
    """The data files of a storage, one per leaf: created for a layout, mapped, flushed.

    Args:
        capacity: the storage's capacity in items (every file holds that many rows).
        ident: the storage's id, in every file's trailer (``None``: a version-1 directory).
        private: map copy-on-write (reads from the files, writes in this process only).

    Attributes:
        paths: the files mapped as the storage's buffers (empty until a layout is mapped).
    """

    def __init__(self, capacity: int, ident: str | None, private: bool) -> None:
        self.paths: list[Path] = []
        self._capacity = capacity
        self._ident = ident
        self._private = private

    def map(
        self, layout: Layout, files: list[Path]
    ) -> tuple[list[torch.Tensor], list[_memory.Mapping | None]]:
        """Map the leaves' ``files`` (sizes and trailers checked): the buffers, their mappings."""
        buffers, mapped = [], []
        for index, (file, leaf) in enumerate(zip(files, layout.leaves, strict=True)):
            expected = self._capacity * leaf.numel * leaf.dtype.itemsize
            shape = (self._capacity, *leaf.shape)
            tail = (self._ident, index)
            buf, raw = map_file(file, leaf.dtype, shape, expected, self._private, leaf.name, tail)
            buffers.append(buf)
            mapped.append(None if raw is None else _memory.mapping(raw))
        return buffers, mapped

    @contextlib.contextmanager
    def created(self, layout: Layout, files: list[Path]) -> Iterator[None]:
        """Create the leaves' ``files`` (space reserved); removed again if the block raises."""
        made: list[Path] = []
        try:
            for index, (file, leaf) in enumerate(zip(files, layout.leaves, strict=True)):
                made.append(file)
                size = self._capacity * leaf.numel * leaf.dtype.itemsize
                create_file(file, size, trailer(self._ident, index))
            yield
        except BaseException:
            for file in made:
                with contextlib.suppress(OSError):
                    file.unlink()
            raise

    def flush(self) -> None:
        """``fsync`` every mapped file (the page cache of a shared mapping is the file's)."""
        for file in self.paths:
            fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
