"""The frame files of a :class:`~rbdata.storages.FrameStackStorage` directory: :class:`FrameFiles`.

:class:`FrameFiles` owns ``frames.json`` and the files under ``frames/`` (see ``_format.py``)
and is the :class:`~rbdata.storages.frames._pool.FramePool`'s memory (``_memory.py``): the
pool's arrays are mappings of these files.

*Writable* (the storage's own directory; this process holds it, a second writer is refused):
the files grow in place (their space reserved first: a full disk is an ``OSError``, never a
SIGBUS); a frame is written to a free slot (raw), or appended to the log past every live
blob with its slot's table row (compressed). Nothing a stored step refers to is ever written
over, so a kill at any moment leaves every stored step's frames intact (the storage's commit
takes fresh slots and releases the overwritten steps' slots only after the steps are
committed). The log is never compacted in place: the live blobs are packed into the files of
a new *generation*, fsync'ed, ``frames.json`` is switched to it atomically, and the old files
are removed; a kill before the switch leaves the old generation live (the new files are
removed by the next open).

*Private* (``open(copy_on_write=True)``, ``read_only=True``, a checkpoint restored): the
files are mapped copy-on-write; growth and compaction happen in process memory, the files
never change.

A forked child (a ``DataLoader`` worker) keeps the mappings and reads them; its copy of the
hold and of the files is closed (:attr:`FrameFiles.writer` is the parent): the storage
refuses its writes there.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rbdata._core.atomic import fsync_dir
from rbdata._core.files import inside
from rbdata._core.holders import Holders
from rbdata._core.layout import Layout
from rbdata.storages.frames._format import (
    FRAMES_DIR,
    HEADER,
    FramesMeta,
    check_header,
    data_files,
    header,
    read_frames_meta,
    write_frames_meta,
)
from rbdata.storages.frames._memory import FrameMemory, pack
from rbdata.storages.memmap._rawfile import open_fd, regular_size, reserve

__all__ = ["FrameFiles"]

_OURS = re.compile(r"(frames|log-\d+|table-\d+)\.bin")
_ONE_WRITER = (
    "A FrameStackStorage has one writer process: close it there first (a pickled copy "
    "of it reads a snapshot in memory)"
)


class FrameFiles(FrameMemory):
    """The frame files of a storage directory (see the module docstring).

    Make one with :meth:`create` (a new directory) or :meth:`open`.
    """

    def __init__(self, root: Path, meta: FramesMeta, private: bool) -> None:
        frame = meta.frame or ((), "uint8")
        super().__init__(frame[0], getattr(torch, frame[1]), torch.device("cpu"))
        self.root = root
        self.meta = meta
        self.private = private
        #: a private copy compacts like process memory; the files only when 1/4 is dead
        self.compact_divisor = FrameMemory.compact_divisor if private else 4
        self._fds: dict[str, int] = {}  # kind -> open file (writable only)
        self._hold: Holders | None = None
        #: the process that writes the files (``None``: private, nobody)
        self.writer: int | None = None if private else os.getpid()
        _LIVE.add(self)

    # --- making and opening --------------------------------------------------------------
    @classmethod
    def create(cls, root: Path, meta: FramesMeta) -> FrameFiles:
        """A new storage directory at ``root`` (absent or empty), held by this process.

        Raises:
            FileExistsError: ``root`` holds files already.
        """
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise FileExistsError(
                f"path {str(root)!r} already holds data; reopen it with "
                f"FrameStackStorage.open({str(root)!r}) or choose an empty directory"
            )
        root.mkdir(parents=True, exist_ok=True)
        files = cls(root, meta, private=False)
        files._hold = Holders(root, "FrameStackStorage", advice=_ONE_WRITER)
        try:
            (root / FRAMES_DIR).mkdir()
            write_frames_meta(root, meta)
        except BaseException:
            files.close()
            raise
        return files

    @classmethod
    def open(cls, root: Path, private: bool) -> FrameFiles:
        """The files of the directory ``root``, ``frames.json`` checked (see :meth:`map`).

        Writable (not ``private``): this process becomes the directory's one writer, and
        the files of other generations (a compaction cut by a kill) are removed.

        Raises:
            FileNotFoundError: no ``frames.json`` in ``root``.
            ValueError: a corrupt ``frames.json`` (naming the field), or a symlink.
            StorageInUseError: another process (or storage object) writes the directory.
        """
        meta = read_frames_meta(root)
        files = cls(root, meta, private)
        try:
            folder = inside(root, FRAMES_DIR, "frames directory")
            if not folder.is_dir():
                raise FileNotFoundError(f"{str(root)!r}: no {FRAMES_DIR}/ directory")
            if not private:
                files._hold = Holders(root, "FrameStackStorage", advice=_ONE_WRITER)
                live = set(meta.files().values())
                for entry in os.scandir(folder):
                    if _OURS.fullmatch(entry.name) and entry.name not in live:
                        os.unlink(entry.path)
        except BaseException:
            files.close()
            raise
        return files

    def fix_layout(self, layout: Layout) -> None:
        """Record the layout of the first write in ``frames.json`` (before any frame file)."""
        self.meta = self.meta.with_(layout=layout.spec())
        frame = self.meta.frame
        assert frame is not None
        FrameMemory.__init__(self, frame[0], getattr(torch, frame[1]), self.device)
        if not self.private:
            write_frames_meta(self.root, self.meta)

    def record(self, frames: int, frame_data: int, fsync: bool) -> None:
        """Record the frames held and their bytes in ``frames.json`` (``rbdata inspect``)."""
        if self.writer != os.getpid() or (self.meta.frames, self.meta.frame_data) == (
            frames,
            frame_data,
        ):
            return
        self.meta = self.meta.with_(frames=frames, frame_data=frame_data)
        write_frames_meta(self.root, self.meta, fsync)

    # --- the files, mapped ---------------------------------------------------------------
    def map(
        self, kind: str, nbytes: int, unit: int, grow: bool = True, fresh: bool = False
    ) -> np.ndarray | None:
        """The data of the current generation's ``kind`` file, mapped (``uint8``).

        Writable: a new file (``fresh``: replaced) is made with ``nbytes`` of data, an
        existing one grown to hold them if ``grow`` (else mapped as it is: what an open
        checks the stored steps against). Private: the file as it is (``None`` if it does
        not exist). Its header and a size of whole ``unit`` s are checked first.

        Raises:
            ValueError: naming the file: a bad header or size, or a symlink.
        """
        name = data_files(self.meta.codec is not None, self.meta.generation)[kind]
        path = inside(self.root / FRAMES_DIR, name, "frame file")
        if self.private:
            if not path.exists():
                return None
            fd = open_fd(path, os.O_RDONLY, "a frame file")
        else:
            flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if fresh else 0)
            fd = open_fd(path, flags, "a frame file")
        try:
            size = regular_size(fd, path)
            if size == 0 and not self.private:
                os.pwrite(fd, header(kind, self.meta.ident, self.meta.generation), 0)
                size, grow = HEADER, True
            if size < HEADER or (size - HEADER) % unit:
                raise ValueError(
                    f"{path}: {size} bytes, expected a {HEADER}-byte header and whole "
                    f"{unit}-byte rows; truncated or corrupt"
                )
            check_header(os.pread(fd, HEADER, 0), kind, self.meta.ident, self.meta.generation, path)
            want = HEADER + -(-nbytes // unit) * unit
            if not self.private and grow and size < want:
                reserve(fd, want, path)
                size = want
            access = mmap.ACCESS_COPY if self.private else mmap.ACCESS_WRITE
            mm = mmap.mmap(fd, size, access=access)
        except BaseException:
            os.close(fd)
            raise
        if self.private:
            os.close(fd)
        else:
            old = self._fds.pop(kind, -1)
            if old >= 0 and old != fd:
                os.close(old)
            self._fds[kind] = fd
        return np.frombuffer(mm, np.uint8, size - HEADER, HEADER)

    def frames(self, old: torch.Tensor | None, slots: int, keep: int) -> torch.Tensor:
        """Raw frames: ``frames.bin`` (grown to ``slots``; private: as it is, then memory)."""
        if self.private and old is not None:
            return super().frames(old, slots, keep)
        data = self.map("frames", slots * self.frame_bytes, self.frame_bytes, old is not None)
        if data is None:
            return super().frames(None, slots, 0)
        return torch.from_numpy(data).view(self.dtype).view(-1, *self.frame_shape)

    def table(self, old: np.ndarray | None, slots: int) -> np.ndarray:
        """The slot table ``table-G.bin`` (grown to ``slots``; private: as it is, then memory)."""
        if self.private and old is not None:
            return super().table(old, slots)
        data = self.map("table", slots * 16, 16, old is not None)
        if data is None:
            return super().table(None, slots)
        return data.view(np.int64).reshape(-1, 2)

    def log(self, old: np.ndarray | None, size: int, keep: int) -> np.ndarray:
        """The byte log ``log-G.bin`` (grown to ``size``; private: as it is, then memory)."""
        if self.private and old is not None:
            return super().log(old, size, keep)
        data = self.map("log", size, 1, old is not None)
        return super().log(None, size, 0) if data is None else data

    def compact(
        self, log: np.ndarray, table: np.ndarray, order: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """The live blobs packed into a new generation's files, switched to atomically."""
        if self.private:
            return super().compact(log, table, order)
        old = self.meta.files()
        self.meta = self.meta.with_(generation=self.meta.generation + 1)
        try:
            new_log = self.map("log", log.shape[0], 1, fresh=True)
            rows = self.map("table", table.shape[0] * 16, 16, fresh=True)
            assert new_log is not None and rows is not None
            new_table = rows.view(np.int64).reshape(-1, 2)
            new_table[order] = table[order]
            head = int(pack(log, new_log, new_table, order, False))
            for fd in self._fds.values():
                os.fsync(fd)  # the new generation is on disk before frames.json names it
            write_frames_meta(self.root, self.meta)
        except BaseException:
            self.meta = self.meta.with_(generation=self.meta.generation - 1)
            raise
        fsync_dir(self.root)
        for name in old.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.root / FRAMES_DIR / name)
        return new_log, new_table, head

    def flush(self) -> None:
        """Write every frame file to disk (``fsync``: a shared mapping's pages are the file's)."""
        for fd in self._fds.values():
            os.fsync(fd)

    def close(self) -> None:
        """Close the files and drop the hold (mappings go with the arrays that view them)."""
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = {}
        if self._hold is not None:
            self._hold.close()
            self._hold = None

    def for_copy(self) -> FrameMemory:
        """A pickled copy of the pool keeps its frames in process memory."""
        return FrameMemory(self.frame_shape, self.dtype, self.device)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("FrameFiles are not pickled (a pool's copy keeps its frames in memory)")


_LIVE: weakref.WeakSet[FrameFiles] = weakref.WeakSet()


def _in_child() -> None:
    """A forked child writes none of its parent's frame files: its descriptors of them go."""
    for files in list(_LIVE):
        if files.writer is not None:
            files.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
