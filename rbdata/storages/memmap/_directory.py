"""On-disk format of :class:`~rbdata.storages.MemmapStorage` directories: names, metadata, writers.

``layout.json`` is read and validated here (every field, up front, naming the file and the
field); :func:`write_directory` and :class:`DirectoryWriter` write whole new directories (for
checkpoints and offline datasets) that :meth:`MemmapStorage.open` reads.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import torch

from rbdata._core.files import (
    atomic_write_json,
    preallocate,
    start_writeback,
)
from rbdata._core.ids import new_id
from rbdata._core.layout import Layout
from rbdata.errors import CheckpointError
from rbdata.storages.base import Storage
from rbdata.storages.memmap._header import encode_header
from rbdata.storages.memmap._meta import FORMAT, HEADER_FILE, LAYOUT_FILE, VERSION
from rbdata.storages.memmap._meta import check_meta as check_layout_meta
from rbdata.storages.memmap._rawfile import trailer

__all__ = [
    "DirectoryWriter",
    "check_counts",
    "check_meta",
    "layout_meta",
    "TensorSource",
    "write_directory",
]


def _leaf_file(i: int, key: tuple[str, ...]) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", ".".join(key) or "data")[:64]
    return f"{i:03d}-{safe}.bin"


def check_meta(root: Path, meta: dict[str, Any]) -> tuple[int, Layout | None, list[Path]]:
    """:func:`~rbdata.storages.memmap._meta.check_meta`, the layout as a :class:`Layout`."""
    capacity, spec, paths = check_layout_meta(root, meta)
    return capacity, None if spec is None else Layout.from_spec(spec), paths


def check_counts(storage: Storage, src: Path) -> None:
    """The length and next slot of a storage just opened from ``src``, in range.

    Raises:
        CheckpointError: naming ``src``'s header (the caller closes the storage).
    """
    n, nxt, cap = len(storage), storage.next_slot, storage.capacity
    if not 0 <= n <= cap or not 0 <= nxt < cap or (n and storage.layout is None):
        raise CheckpointError(
            f"{src / HEADER_FILE}: header length {n} / next slot {nxt} out of range for "
            f"capacity {cap}"
        )


def layout_meta(capacity: int, layout: Layout | None, ident: str | None) -> dict[str, Any]:
    """The contents of ``layout.json`` (version 1, without an id, if ``ident`` is ``None``)."""
    meta: dict[str, Any] = {"format": FORMAT, "version": 1 if ident is None else VERSION}
    meta["capacity"] = capacity
    if ident is not None:
        meta["id"] = ident
    if layout is not None:
        meta["layout"] = layout.to_json()
        meta["files"] = [_leaf_file(i, leaf.key) for i, leaf in enumerate(layout.leaves)]
    return meta


def _write_file(
    file: Path, chunks: Any, size: int, fsync: bool, filled: int = 0, tail: bytes = b""
) -> None:
    """Write ``chunks`` (``filled`` bytes in all, if known) to a new ``file`` of ``size`` bytes.

    ``tail`` (the trailer) follows the ``size`` bytes.
    """
    with open(file, "wb") as f:
        preallocate(f.fileno(), 0, filled)  # the filled bytes only: the tail stays sparse
        for chunk in chunks:
            f.write(memoryview(chunk))
        f.truncate(size)  # rows past the length read as zeros (a sparse tail)
        if tail:
            f.seek(size)
            f.write(tail)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def _row_blocks(buf: torch.Tensor, n: int, block_bytes: int = 1 << 26) -> Any:
    """The bytes of ``buf[:n]`` as numpy uint8 arrays (blocks copied to the CPU if needed)."""
    row = max(1, buf[0].numel() * buf.element_size()) if buf.shape[0] else 1
    step = max(1, block_bytes // row) if buf.device.type != "cpu" else max(n, 1)
    for start in range(0, n, step):
        part = buf[start : min(n, start + step)].detach().cpu().contiguous().reshape(-1)
        yield part.view(torch.uint8).numpy()


class TensorSource(Protocol):
    """What :func:`write_directory` reads: a tensor storage's counts, layout and buffers."""

    @property
    def capacity(self) -> int: ...
    @property
    def next_slot(self) -> int: ...
    @property
    def layout(self) -> Layout | None: ...
    @property
    def buffers(self) -> list[torch.Tensor]: ...
    def __len__(self) -> int: ...


def write_directory(
    storage: TensorSource, path: str | os.PathLike[str], fsync: bool = True
) -> None:
    """Write a tensor storage (CPU, CUDA or memmap) as a new storage directory.

    :meth:`MemmapStorage.open` reads the directory; every file is fsync'ed unless
    ``fsync=False``. Whole arrays are written: the filled rows, then a sparse zero tail up to
    the capacity.

    Examples:
        >>> import tempfile, torch
        >>> from rbdata.storages import MemmapStorage, TensorStorage
        >>> src = TensorStorage(8)
        >>> src.set(slice(0, 3), torch.arange(6.0).view(3, 2))
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     write_directory(src, tmp + "/copy")
        ...     copy = MemmapStorage.open(tmp + "/copy")
        ...     print(len(copy), copy[2].tolist())
        ...     copy.close()
        3 [4.0, 5.0]
    """
    root = Path(path)
    root.mkdir(parents=True)
    n, layout = len(storage), storage.layout
    ident = new_id()
    header = encode_header(n, storage.next_slot, ident)
    _write_file(root / HEADER_FILE, [header], len(header), fsync)
    meta = layout_meta(storage.capacity, layout, ident)
    if layout is not None:
        jobs = sorted(
            enumerate(zip(meta["files"], storage.buffers, strict=True)),
            key=lambda job: -job[1][1].numel() * job[1][1].element_size(),
        )

        def write(job: tuple[int, tuple[str, torch.Tensor]]) -> None:
            index, (name, buf) = job
            size = buf.numel() * buf.element_size()
            filled = n * math.prod(buf.shape[1:]) * buf.element_size()
            tail = trailer(ident, index)
            _write_file(root / name, _row_blocks(buf, n), size, fsync, filled, tail)

        # two files at a time: one's copy overlaps the other's fsync (both release the GIL)
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(write, jobs))
    atomic_write_json(root / LAYOUT_FILE, meta, fsync)


def _start_writeback(ranges: list[tuple[int, int, int]]) -> None:
    for fd, offset, nbytes in ranges:
        start_writeback(fd, offset, nbytes)


class DirectoryWriter:
    """Write a new storage directory front to back, block by block, with plain file writes.

    For implementers of storage builders (the offline datasets' conversion uses it): a large
    storage is built with memory bounded by one block. The rows go to the leaf files with
    ``write``, not through a memory mapping, so written pages are page cache, not resident
    memory of the process. The directory is complete (layout, header, files of full size)
    only after :meth:`close`; :meth:`MemmapStorage.open
    <rbdata.storages.MemmapStorage.open>` reads it.

    Args:
        path: the new directory (must not exist, or be empty).
        capacity: slots of the storage; ``close`` fills the files up to it (sparse zeros).
        layout: keys, per-item shapes and dtypes of the rows (fixed-shape tensors only).
        fsync: fsync every file at ``close``.

    Examples:
        >>> import tempfile, torch
        >>> from rbdata._core.layout import Layout
        >>> from rbdata.storages import MemmapStorage
        >>> layout = Layout.from_data({"obs": torch.zeros(1, 2)}, batched=True)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     writer = DirectoryWriter(tmp + "/d", 4, layout)
        ...     writer.write([torch.arange(6.0).view(3, 2)])
        ...     writer.close()
        ...     storage = MemmapStorage.open(tmp + "/d")
        ...     print(len(storage), storage[2]["obs"].tolist())
        ...     storage.close()
        3 [4.0, 5.0]
    """

    def __init__(
        self, path: str | os.PathLike[str], capacity: int, layout: Layout, *, fsync: bool = True
    ) -> None:
        if not layout.fixed:
            raise TypeError(f"MemmapStorage keeps fixed-shape tensors only, got {layout}")
        self.root = Path(path)
        if self.root.exists() and (not self.root.is_dir() or any(self.root.iterdir())):
            raise FileExistsError(f"path {str(self.root)!r} already holds data")
        self.root.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity
        self.layout = layout
        self.rows = 0
        self._fsync = fsync
        self._id = new_id()
        self._meta = layout_meta(capacity, layout, self._id)
        self._files = [open(self.root / name, "wb") for name in self._meta["files"]]  # noqa: SIM115
        # with fsync, each block's writeback is started (sync_file_range, in a thread) while
        # the caller prepares the next block, so close()'s fsyncs find little left to write
        self._offsets = [0] * len(self._files)
        self._syncer = ThreadPoolExecutor(max_workers=1) if fsync else None
        self._pending: Any = None

    def write(self, tensors: list[torch.Tensor]) -> None:
        """Append rows: one CPU tensor per leaf in layout order, same leading dimension."""
        n = int(tensors[0].shape[0]) if tensors else 0
        if self.rows + n > self.capacity:
            raise ValueError(f"{self.rows + n} rows written, capacity {self.capacity}")
        for leaf, t in zip(self.layout.leaves, tensors, strict=True):  # all, before writing
            if tuple(t.shape) != (n, *leaf.shape) or t.dtype != leaf.dtype:
                raise ValueError(
                    f"key {leaf.name}: expected {leaf.dtype} {[n, *leaf.shape]}, got "
                    f"{t.dtype} {list(t.shape)}"
                )
        for f, leaf, t in zip(self._files, self.layout.leaves, tensors, strict=True):
            row = leaf.numel * leaf.dtype.itemsize
            preallocate(f.fileno(), self.rows * row, n * row)  # this block's bytes only
            f.write(t.contiguous().view(-1).view(torch.uint8).numpy().data)
        self.rows += n
        if self._syncer is not None:
            self._wait()
            ranges = []
            for i, f in enumerate(self._files):
                f.flush()
                end = f.tell()
                ranges.append((f.fileno(), self._offsets[i], end - self._offsets[i]))
                self._offsets[i] = end
            self._pending = self._syncer.submit(_start_writeback, ranges)

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Size the files to the capacity, write the header and the layout (the last step)."""
        self._wait()
        self._shutdown()
        for index, (f, leaf) in enumerate(zip(self._files, self.layout.leaves, strict=True)):
            size = self.capacity * leaf.numel * leaf.dtype.itemsize
            f.truncate(size)
            f.seek(size)
            f.write(trailer(self._id, index))
            if self._fsync:
                f.flush()
                os.fsync(f.fileno())
            f.close()
        header = encode_header(self.rows, self.rows % self.capacity, self._id)
        _write_file(self.root / HEADER_FILE, [header], len(header), self._fsync)
        atomic_write_json(self.root / LAYOUT_FILE, self._meta, self._fsync)

    def abort(self) -> None:
        """Close the files without finishing the directory (the caller removes it)."""
        with contextlib.suppress(OSError):
            self._wait()
        self._shutdown()
        for f in self._files:
            f.close()

    def _shutdown(self) -> None:
        if self._syncer is not None:
            self._syncer.shutdown(wait=True)
            self._syncer = None
