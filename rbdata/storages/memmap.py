"""``MemmapStorage``: one memory-mapped file per leaf, shareable across processes, reopenable.

On disk, a storage directory holds:

- ``layout.json``: format name and version, capacity, keys, per-item shapes, dtypes, file names;
- one raw file per leaf (``capacity * item bytes``), written through tensordict's
  :class:`~tensordict.MemoryMappedTensor`;
- ``header.bin``: a 64-byte memory-mapped header of int64s: the filled length, then the slot
  after the last write (where a ring writer resumes). It is updated after the data of each
  write, in shared memory, so a write whose ``extend`` returned is visible to
  :meth:`MemmapStorage.open` even if the writing process died right after.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import MemoryMappedTensor

from rbdata._layout import Layout
from rbdata.storages._files import atomic_write_json, read_meta, storage_dir
from rbdata.storages.tensor import TensorStorage

__all__ = ["DirectoryWriter", "MemmapStorage", "write_directory"]

_FORMAT = "rbdata.memmap"
_VERSION = 1
_LAYOUT_FILE = "layout.json"
_HEADER_FILE = "header.bin"
_HEADER_BYTES = 64


def _leaf_file(i: int, key: tuple[str, ...]) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", ".".join(key) or "data")[:64]
    return f"{i:03d}-{safe}.bin"


class _Header:
    """A tiny shared, memory-mapped int64 array; slot 0 is the filled length.

    A private header (``private=True``) is a copy in this process's memory instead.
    """

    def __init__(self, path: Path, create: bool, private: bool = False) -> None:
        self._mmap: mmap.mmap | None = None
        if create:
            with open(path, "wb") as f:
                f.write(b"\0" * _HEADER_BYTES)
                f.flush()
                os.fsync(f.fileno())
        with open(path, "rb" if private else "r+b") as f:
            if os.fstat(f.fileno()).st_size != _HEADER_BYTES:
                raise ValueError(f"{path}: expected a {_HEADER_BYTES}-byte header, file is corrupt")
            if private:
                self.values = np.fromfile(f, dtype=np.int64)
                return
            self._mmap = mmap.mmap(f.fileno(), _HEADER_BYTES)
        self.values = np.frombuffer(self._mmap, dtype=np.int64)

    @classmethod
    def private_copy(cls, length: int, next_slot: int) -> _Header:
        """A private header holding ``length`` and ``next_slot`` (no file)."""
        self = cls.__new__(cls)
        self._mmap = None
        self.values = np.zeros(_HEADER_BYTES // 8, dtype=np.int64)
        self.values[:2] = length, next_slot
        return self

    def close(self) -> None:
        del self.values
        if self._mmap is not None:
            self._mmap.close()


def _meta(capacity: int, layout: Layout | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"format": _FORMAT, "version": _VERSION, "capacity": capacity}
    if layout is not None:
        meta["layout"] = layout.to_json()
        meta["files"] = [_leaf_file(i, leaf.key) for i, leaf in enumerate(layout.leaves)]
    return meta


def _write_file(file: Path, chunks: Any, size: int, fsync: bool) -> None:
    with open(file, "wb") as f:
        for chunk in chunks:
            f.write(memoryview(chunk))
        f.truncate(size)  # rows past the length read as zeros (a sparse tail)
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


def write_directory(
    storage: TensorStorage, path: str | os.PathLike[str], fsync: bool = True
) -> None:
    """Write a :class:`TensorStorage` (CPU, CUDA or memmap) as a new storage directory.

    :meth:`MemmapStorage.open` reads the directory; every file is fsync'ed unless
    ``fsync=False``. Whole arrays are written: the filled rows, then a sparse zero tail up to
    the capacity.

    Examples:
        >>> import tempfile, torch
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
    header = _Header.private_copy(n, storage.next_slot).values
    _write_file(root / _HEADER_FILE, [header.view(np.uint8)], _HEADER_BYTES, fsync)
    meta = _meta(storage.capacity, layout)
    if layout is not None:
        jobs = sorted(
            zip(meta["files"], storage.buffers, strict=True),
            key=lambda job: -job[1].numel() * job[1].element_size(),
        )

        def write(job: tuple[str, torch.Tensor]) -> None:
            name, buf = job
            size = buf.numel() * buf.element_size()
            _write_file(root / name, _row_blocks(buf, n), size, fsync)

        # two files at a time: one's copy overlaps the other's fsync (both release the GIL)
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(write, jobs))
    atomic_write_json(root / _LAYOUT_FILE, meta, fsync)


def _sync_all(fds: list[int]) -> None:
    for fd in fds:
        os.fdatasync(fd)


class DirectoryWriter:
    """Write a new storage directory front to back, block by block, with plain file writes.

    For building a large storage (an offline dataset) with memory bounded by one block: the
    rows go to the leaf files with ``write``, not through a memory mapping, so written pages
    are page cache, not resident memory of the process. The directory is complete (layout,
    header, files of full size) only after :meth:`close`; :meth:`MemmapStorage.open` reads it.

    Args:
        path: the new directory (must not exist, or be empty).
        capacity: slots of the storage; ``close`` fills the files up to it (sparse zeros).
        layout: keys, per-item shapes and dtypes of the rows (fixed-shape tensors only).
        fsync: fsync every file at ``close``.

    Examples:
        >>> import tempfile, torch
        >>> from rbdata._layout import Layout
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
        self._meta = _meta(capacity, layout)
        self._files = [open(self.root / name, "wb") for name in self._meta["files"]]  # noqa: SIM115
        # with fsync, each block's writeback runs in a thread (fdatasync releases the GIL)
        # while the caller prepares the next block, so close() waits for one block, not all
        self._syncer = ThreadPoolExecutor(max_workers=1) if fsync else None
        self._pending: Any = None

    def write(self, tensors: list[torch.Tensor]) -> None:
        """Append rows: one CPU tensor per leaf in layout order, same leading dimension."""
        n = int(tensors[0].shape[0]) if tensors else 0
        if self.rows + n > self.capacity:
            raise ValueError(f"{self.rows + n} rows written, capacity {self.capacity}")
        for f, leaf, t in zip(self._files, self.layout.leaves, tensors, strict=True):
            if tuple(t.shape) != (n, *leaf.shape) or t.dtype != leaf.dtype:
                raise ValueError(
                    f"key {leaf.name}: expected {leaf.dtype} {[n, *leaf.shape]}, got "
                    f"{t.dtype} {list(t.shape)}"
                )
            f.write(t.contiguous().view(-1).view(torch.uint8).numpy().data)
        self.rows += n
        if self._syncer is not None:
            self._wait()
            for f in self._files:
                f.flush()
            fds = [f.fileno() for f in self._files]
            self._pending = self._syncer.submit(_sync_all, fds)

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Size the files to the capacity, write the header and the layout (the last step)."""
        self._wait()
        self._shutdown()
        for f, leaf in zip(self._files, self.layout.leaves, strict=True):
            f.truncate(self.capacity * leaf.numel * leaf.dtype.itemsize)
            if self._fsync:
                f.flush()
                os.fsync(f.fileno())
            f.close()
        header = _Header.private_copy(self.rows, self.rows % self.capacity).values
        _write_file(self.root / _HEADER_FILE, [header.view(np.uint8)], _HEADER_BYTES, self._fsync)
        atomic_write_json(self.root / _LAYOUT_FILE, self._meta, self._fsync)

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


class MemmapStorage(TensorStorage):
    """Items in memory-mapped files, one per leaf, plus a JSON layout and a tiny header.

    Args:
        max_size: capacity in items.
        path: directory for the files. ``None`` makes a temporary directory that is removed
            when the storage is closed or garbage-collected; an explicit path is kept. An
            explicit path that already holds files is refused: reopen it with
            :meth:`MemmapStorage.open`.

    Pickling (DataLoader workers, ``multiprocessing`` spawn) sends the path, not the data:
    the receiving process maps the same files, so its writes are visible to the sender.

    Examples:
        >>> import torch
        >>> storage = MemmapStorage(1000)
        >>> storage.set([0, 1, 2], torch.arange(6.0).view(3, 2))
        >>> reopened = MemmapStorage.open(storage.path)
        >>> len(reopened), reopened[2].tolist()
        (3, [4.0, 5.0])
        >>> storage.close()
    """

    def __init__(self, max_size: int, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(max_size, device="cpu")
        root, self._finalizer = storage_dir(self, path, "rbdata-memmap-")
        self._path = root
        self._private = False
        self._header = _Header(root / _HEADER_FILE, create=True)
        atomic_write_json(root / _LAYOUT_FILE, self._meta(None))

    # --- opening, closing, pickling --------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], copy_on_write: bool = False) -> MemmapStorage:
        """Reopen an existing storage directory (e.g. after a restart).

        File sizes are checked against the layout: a truncated or foreign file is refused.

        Args:
            path: the storage directory.
            copy_on_write: map the files privately: reads come from the files, lazily;
                writes stay in this process's memory and never reach the files (how a
                checkpoint is loaded). Such a storage pickles its data, not its path.
                ``False`` (default): read/write, shared with every process that opens it.
        """
        root = Path(path)
        meta = read_meta(root, _LAYOUT_FILE, _FORMAT, _VERSION, "MemmapStorage")
        self = cls.__new__(cls)
        TensorStorage.__init__(self, int(meta["capacity"]), device="cpu")
        self._finalizer = None
        self._path = root
        self._private = bool(copy_on_write)
        self._header = _Header(root / _HEADER_FILE, create=False, private=self._private)
        self._load_layout(meta)
        length = len(self)
        if not 0 <= length <= self.capacity:
            raise ValueError(f"{root}: header length {length} outside [0, {self.capacity}]")
        return self

    def config(self) -> dict[str, Any]:
        """``max_size`` (checkpoints carry the data; the path is chosen when loading)."""
        return {"max_size": self.capacity}

    def _meta(self, layout: Layout | None) -> dict[str, Any]:
        return _meta(self.capacity, layout)

    def _load_layout(self, meta: dict[str, Any]) -> None:
        if "layout" not in meta:
            return
        layout = Layout.from_json(meta["layout"])
        buffers = []
        for name, leaf in zip(meta["files"], layout.leaves, strict=True):
            file = self._path / name
            expected = self.capacity * leaf.numel * leaf.dtype.itemsize
            size = file.stat().st_size if file.is_file() else -1
            if size != expected:
                raise ValueError(
                    f"{file}: {size} bytes on disk, expected {expected} for key {leaf.name} "
                    f"(capacity {self.capacity} x {list(leaf.shape)} {leaf.dtype}); truncated or "
                    "corrupt"
                )
            shape = (self.capacity, *leaf.shape)
            if self._private:  # MAP_PRIVATE: lazy reads, writes never reach the file
                numel = self.capacity * leaf.numel
                flat = torch.from_file(str(file), shared=False, size=numel, dtype=leaf.dtype)
                buffers.append(flat.view(shape))
            else:
                mmt = MemoryMappedTensor.from_filename(str(file), leaf.dtype, shape)
                buffers.append(mmt.as_subclass(torch.Tensor))
        self._set_buffers(buffers, layout)
        self._layout = layout

    def _current_layout(self) -> Layout | None:
        if self._layout is None and not self._private:  # another process's first write?
            self._load_layout(json.loads((self._path / _LAYOUT_FILE).read_text(encoding="utf-8")))
        return self._layout

    def __getstate__(self) -> dict[str, Any]:
        if not self._private:
            return {"path": str(self._path)}
        # private writes are in this process only: send the data (like a TensorStorage)
        layout = None if self._layout is None else self._layout.to_json()
        values = self._header.values
        return {
            "path": str(self._path),
            "capacity": self.capacity,
            "layout": layout,
            "buffers": self._buffers,
            "header": [int(values[0]), int(values[1])],
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "buffers" not in state:
            other = type(self).open(state["path"])
            self.__dict__.update(other.__dict__)
            other.__dict__.clear()
            return
        TensorStorage.__init__(self, state["capacity"], device="cpu")
        self._finalizer, self._path, self._private = None, Path(state["path"]), True
        self._header = _Header.private_copy(*state["header"])
        if state["layout"] is not None:
            self._layout = Layout.from_json(state["layout"])
            self._set_buffers(state["buffers"], self._layout)

    def close(self) -> None:
        """Unmap the files; a temporary directory (``path=None``) is removed."""
        self._buffers = []
        self._np_buffers = None
        self._plain = False
        self._layout = None
        if getattr(self, "_header", None) is not None:
            self._header.close()
            self._header = None  # type: ignore[assignment]
        if self._finalizer is not None:
            self._finalizer()

    @property
    def path(self) -> Path:
        """The storage directory."""
        return self._path

    # --- hooks -----------------------------------------------------------------------------
    def __len__(self) -> int:
        header = self._header
        if header is None:
            raise ValueError("the storage is closed")
        n = int(header.values[0])
        if n and self._layout is None:
            self._current_layout()
        return n

    def _set_length(self, n: int) -> None:
        self._header.values[0] = n

    @property
    def next_slot(self) -> int:
        """The slot after the last write, kept in the header: a ring writer resumes there."""
        return int(self._header.values[1])

    def _set_next(self, slot: int) -> None:
        self._header.values[1] = slot

    def _allocate(self, layout: Layout) -> None:
        if self._private:  # never create files in a directory opened copy-on-write
            TensorStorage._allocate(self, layout)
            return
        meta = self._meta(layout)
        buffers = []
        for name, leaf in zip(meta["files"], layout.leaves, strict=True):
            mmt = MemoryMappedTensor.zeros(
                (self.capacity, *leaf.shape), dtype=leaf.dtype, filename=str(self._path / name)
            )
            buffers.append(mmt.as_subclass(torch.Tensor))
        self._set_buffers(buffers, layout)
        atomic_write_json(self._path / _LAYOUT_FILE, meta)
