"""The directory of a :class:`~rbdata.storages.FrameStackStorage`: :class:`FrameDirectory`.

A storage made with ``path=`` (or reopened by ``FrameStackStorage.open``) holds one: its path,
its frame files (:class:`~rbdata.storages.frames._files.FrameFiles`, which hold
``frames.json`` and know the directory's one writer process), whether it was opened
read-only, and the steps' subdirectory. A storage in memory holds one without a path; every
check then passes.

**Crash safety.** A write stores its new frames in slots no stored step refers to (fresh
slots: the overwritten steps' slots are released only after the steps are committed), then
commits the steps, atomically (the steps' journal). The frames are in the files (page cache)
before the steps that refer to them; ``FrameStackStorage.open`` rebuilds the reference counts
from the stored steps' refs, so whatever a killed write stored and did not commit is free.
Against power loss, :meth:`FrameDirectory.flush` (``fsync``) after the writes that must be
durable.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch

from rbdata._core.files import check_dir, inside
from rbdata._core.layout import Layout
from rbdata.errors import ReadOnlyError
from rbdata.storages.base import Storage
from rbdata.storages.frames._files import FrameFiles
from rbdata.storages.frames._format import STEPS_DIR, FramesMeta
from rbdata.storages.frames._pool import FramePool
from rbdata.storages.memmap import MemmapStorage
from rbdata.storages.tensor import TensorStorage

__all__ = ["FrameDirectory"]


class FrameDirectory:
    """A storage's directory: path, frame files, read-only flag (see the module docstring).

    Args:
        path: the directory (``None``: the storage is in memory).
        files: its frame files (``None`` in memory).
        read_only: every write is refused (``ReadOnlyError``).
    """

    def __init__(
        self, path: Path | None = None, files: FrameFiles | None = None, read_only: bool = False
    ) -> None:
        self.path = path
        self.files = files
        self.read_only = read_only

    @classmethod
    def create(cls, path: Path | None, meta: FramesMeta) -> FrameDirectory:
        """A new directory at ``path`` (``frames.json`` written), or none (``None``)."""
        return cls() if path is None else cls(path, FrameFiles.create(path, meta))

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], copy_on_write: bool, read_only: bool
    ) -> FrameDirectory:
        """An existing directory: ``frames.json`` and the frame files' headers checked."""
        root = check_dir(Path(path), "FrameStackStorage")
        return cls(root, FrameFiles.open(root, private=copy_on_write or read_only), read_only)

    @property
    def meta(self) -> FramesMeta:
        """``frames.json`` (a directory with files only)."""
        assert self.files is not None
        return self.files.meta

    def new_steps(self, capacity: int, device: torch.device) -> Storage:
        """Empty steps: a ``TensorStorage`` in memory, a ``MemmapStorage`` in ``steps/``."""
        if self.path is None:
            return TensorStorage(capacity, device)
        return MemmapStorage(capacity, self.path / STEPS_DIR)

    def open_steps(self, copy_on_write: bool) -> MemmapStorage:
        """The stored steps (``steps/``), mapped as this directory is."""
        assert self.path is not None
        steps = inside(self.path, STEPS_DIR, "steps directory")
        return MemmapStorage.open(steps, copy_on_write, self.read_only)

    def fix_layout(self, layout: Layout) -> None:
        """Name the layout in ``frames.json`` (before any frame file); nothing in memory."""
        if self.files is not None:
            self.files.fix_layout(layout)

    # --- its one writer --------------------------------------------------------------------
    def writer_here(self) -> bool:
        """Whether this process writes the directory's files (none in memory)."""
        return self.files is not None and self.files.writer == os.getpid()

    def writes_here(self) -> bool:
        """Whether this process may write (not read-only, not a forked copy of a writer)."""
        files = self.files
        return not self.read_only and (files is None or files.writer in (None, os.getpid()))

    def check_writable(self) -> None:
        """Raise unless this process may write (:meth:`writes_here`), naming why."""
        if self.read_only:
            raise ReadOnlyError(
                f"FrameStackStorage at {str(self.path)!r} was opened with read_only=True: it "
                "refuses writes; open it without read_only; nothing was written"
            )
        files = self.files
        if files is not None and files.writer not in (None, os.getpid()):
            raise RuntimeError(
                f"FrameStackStorage at {str(self.path)!r}: written from process "
                f"{os.getpid()}, a forked copy; process {files.writer} writes it (one writer "
                "process: write there, or send a pickled copy, which is a snapshot in memory); "
                "nothing was written"
            )

    # --- its files -------------------------------------------------------------------------
    def record(self, pool: FramePool | None, fsync: bool) -> None:
        """The frames held and their bytes, in ``frames.json`` (for ``rbdata inspect``)."""
        if self.files is not None and pool is not None:
            self.files.record(pool.live, pool.data_bytes, fsync)

    def flush(self, pool: FramePool | None, steps: Storage) -> None:
        """Write the frames, then the steps, to their files durably (``fsync``)."""
        if not self.writer_here():
            return
        if pool is not None:
            pool.flush()  # first: the steps refer to the frames
        steps.flush()
        self.record(pool, fsync=True)

    def record_last(self, pool: FramePool | None) -> None:
        """:meth:`record` before closing, by the writer (a failure to write is ignored)."""
        if self.writer_here():
            with contextlib.suppress(OSError):
                self.record(pool, fsync=False)

    def close(self) -> None:
        """Close the frame files (after the pool that maps them)."""
        if self.files is not None:
            self.files.close()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a FrameDirectory is its storage's: pickle the storage")
