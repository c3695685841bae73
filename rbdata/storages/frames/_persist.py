"""The persistence of a :class:`~rbdata.storages.FrameStackStorage`: :class:`FramePersistence`.

:class:`FramePersistence` is the storage's private base (as ``ArrowFiles`` is the Arrow
storage's): its directory (``path=``, :meth:`~FramePersistence.open`,
:meth:`~FramePersistence.flush`, :meth:`~FramePersistence.close`) and the persistence hooks
of :class:`~rbdata.storages.Storage` that checkpoints, state dicts, ``rbdata inspect`` and
in-place loads call. The files themselves are :class:`~rbdata.storages.frames._files.FrameFiles`'
(the frames) and a :class:`~rbdata.storages.MemmapStorage`'s (the steps); a dump is the same
directory format (``_format.py``, ``_dumped.py``).

**Crash safety.** A write stores its new frames in slots no stored step refers to (fresh
slots: the overwritten steps' slots are released only after the steps are committed), then
commits the steps, atomically (the steps' journal). The frames are in the files (page cache)
before the steps that refer to them; :meth:`~FramePersistence.open` rebuilds the reference
counts from the stored steps' refs, so whatever a killed write stored and did not commit is
free. Against power loss, :meth:`~FramePersistence.flush` (``fsync``) after the writes that
must be durable.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from rbdata._core.atomic import fsync_dir
from rbdata._core.files import check_dir, inside
from rbdata._core.ids import new_id
from rbdata._core.layout import Layout
from rbdata.errors import CheckpointError, ReadOnlyError
from rbdata.storages._describe import StorageInfo
from rbdata.storages._persist import check_config
from rbdata.storages.base import Codec, SavedStorage, Storage
from rbdata.storages.frames._codecs import FrameCodec
from rbdata.storages.frames._dumped import check_dumped, describe_dir, write_frames
from rbdata.storages.frames._files import FrameFiles
from rbdata.storages.frames._format import META_FILE, STEPS_DIR, FramesMeta
from rbdata.storages.frames._pool import FramePool
from rbdata.storages.frames._streams import StreamTracker
from rbdata.storages.memmap import MemmapStorage
from rbdata.storages.tensor import TensorStorage

__all__ = ["FramePersistence"]

_F = TypeVar("_F", bound="FramePersistence")


class FramePersistence(Storage):
    """The directory and persistence hooks of :class:`~rbdata.storages.FrameStackStorage`."""

    kind = "frames"
    marker_file = META_FILE
    _read_only = False  # opened read_only=True: every write refused
    # the storage's parts (set by FrameStackStorage)
    _steps: Storage
    _pool: FramePool | None
    _tracker: StreamTracker | None
    _files: FrameFiles | None
    _path: Path | None
    _codec: FrameCodec | None
    _steps_layout: Layout

    # --- its directory -------------------------------------------------------------------
    @classmethod
    def open(
        cls: type[_F],
        path: str | os.PathLike[str],
        copy_on_write: bool = False,
        read_only: bool = False,
    ) -> _F:
        """Reopen a storage directory written with ``path=`` (after a restart, a crash, a kill).

        ``frames.json``, the steps' files (:meth:`MemmapStorage.open
        <rbdata.storages.MemmapStorage.open>`: a committed write left by a killed writer is
        replayed) and the frame files' headers and sizes are checked first; then the frames'
        reference counts are rebuilt from the stored steps' refs, so the frames of a write cut
        by a kill are simply free. Every ``extend`` that returned is there, the one cut by the
        kill wholly there or wholly absent.

        Args:
            path: the storage directory.
            copy_on_write: map the files privately: writes stay in this process (how a
                checkpoint is loaded).
            read_only: as ``copy_on_write``, and every write is refused (``ReadOnlyError``).

        Raises:
            FileNotFoundError: no storage directory at ``path``.
            ValueError: naming the file and the field that is corrupt or out of range.
            StorageInUseError: another process (or storage object) writes the directory.

        Examples:
            >>> import shutil, tempfile, torch
            >>> from tensordict import TensorDict
            >>> from rbdata.storages import FrameStackStorage
            >>> frames = torch.arange(5 * 4, dtype=torch.uint8).view(5, 2, 2)
            >>> obs = torch.stack([frames[i : i + 2] for i in range(3)])  # stacks of 2
            >>> nxt = torch.stack([frames[i + 1 : i + 3] for i in range(3)])
            >>> tmp = tempfile.mkdtemp()
            >>> path = tmp + "/pixels"
            >>> storage = FrameStackStorage(100, 2, path=path, codec="lz4")
            >>> td = TensorDict({"observation": obs, "next": {"observation": nxt}}, [3])
            >>> storage.set(slice(0, 3), td)
            >>> storage.close()
            >>> again = FrameStackStorage.open(path)
            >>> len(again), again.frames_stored, bool((again[2] == td[2]).all())
            (3, 5, True)
            >>> again.close()
            >>> shutil.rmtree(tmp)
        """
        root = check_dir(Path(path), "FrameStackStorage")
        files = FrameFiles.open(root, private=copy_on_write or read_only)
        meta = files.meta
        try:
            storage = cls(meta.capacity, meta.stack, key=meta.key, codec=meta.codec)  # type: ignore[call-arg, arg-type]
        except BaseException:
            files.close()
            raise
        storage._path, storage._files, storage._read_only = root, files, read_only
        try:
            steps = inside(root, STEPS_DIR, "steps directory")
            storage._steps = MemmapStorage.open(steps, copy_on_write, read_only)
            storage._attach(meta.layout)
        except BaseException:
            storage.close()
            raise
        return storage

    def _attach(self, layout: Layout | None) -> None:
        """Take the steps as they are: the layout, the counts and the frames' references."""
        steps = self._steps
        if steps.capacity != self.capacity or (layout is None and steps.layout is not None):
            raise ValueError(
                f"{self._path}: the steps (capacity {steps.capacity}, {steps.layout}) do not "
                f"match frames.json (capacity {self.capacity}, layout {layout})"
            )
        n = len(steps)
        if layout is not None:
            self.check_layout(layout)
            self._ensure_layout(layout)
            if steps.layout not in (None, self._steps_layout):
                raise ValueError(f"{self._path}: the steps' layout {steps.layout} does not match")
            assert self._pool is not None and self._tracker is not None
            refs = steps.buffers[-1][:n].cpu().numpy() if n else np.zeros(0)  # type: ignore[attr-defined]
            self._tracker.forget(None)  # the counts are rebuilt: no pins
            self._pool.rebuild(refs.astype(np.int64))
        self._set_length(n)
        self._set_next(steps.next_slot)

    @property
    def path(self) -> Path | None:
        """The storage directory (``None`` in memory)."""
        self._check_open()
        return self._path

    def flush(self) -> None:
        """Write the frames, then the steps, to their files durably (``fsync``)."""
        self._check_open()
        if self._files is None or self._files.writer != os.getpid():
            return
        if self._pool is not None:
            self._pool.flush()  # first: the steps refer to the frames
        self._steps.flush()
        self._record(fsync=True)

    def _record(self, fsync: bool) -> None:
        """The frames held and their bytes, in ``frames.json`` (for ``rbdata inspect``)."""
        files, pool = self._files, self._pool
        if files is not None and pool is not None:
            data = pool.blob_bytes if self._codec is not None else pool.live * pool.frame_bytes
            files.record(pool.live, data, fsync)

    def close(self) -> None:
        """Close the files (a storage with a path); every other method then raises."""
        if self._closed:
            return
        if self._files is not None and self._files.writer == os.getpid():
            with contextlib.suppress(OSError):
                self._record(fsync=False)
        self._closed = True
        close = getattr(self._steps, "close", None)
        if close is not None:
            close()
        if self._pool is not None:
            self._pool.close()
        if self._files is not None:
            self._files.close()

    def _writes_here(self) -> bool:
        """Whether this process may write (not read-only, not a forked copy of a writer)."""
        files = self._files
        return not self._read_only and (files is None or files.writer in (None, os.getpid()))

    def _check_writable(self) -> None:
        self._check_open()
        if self._read_only:
            raise ReadOnlyError(
                f"FrameStackStorage at {str(self._path)!r} was opened with read_only=True: it "
                "refuses writes; open it without read_only; nothing was written"
            )
        files = self._files
        if files is not None and files.writer not in (None, os.getpid()):
            raise RuntimeError(
                f"FrameStackStorage at {str(self._path)!r}: written from process "
                f"{os.getpid()}, a forked copy; process {files.writer} writes it (one writer "
                "process: write there, or send a pickled copy, which is a snapshot in memory); "
                "nothing was written"
            )

    # --- checkpoints, state dicts, in-place loads, ``rbdata inspect`` ----------------------
    def copy_from(self, src: Storage) -> None:
        """Hold what ``src`` holds: frames slot for slot and the steps (same stack and codec).

        The steps are emptied first, so a kill leaves this storage empty or a whole copy.
        Another storage (or another codec) is copied row by row through :meth:`set`.
        """
        self._check_writable()
        ignore = {"device": ""}
        if (
            not isinstance(src, FramePersistence)
            or src.layout is None
            or src._pool is None
            or src.config() | ignore != self.config() | ignore
        ):
            super().copy_from(src)
            self._steps._set_next(self.next_slot)  # where the files say a writer resumes
            return
        self.clear()
        self._ensure_layout(src.layout)
        assert self._pool is not None
        self._pool.load(*src._pool.export())
        self._steps.copy_from(src._steps)
        self._attach(self._layout)
        self._items_written += len(src)

    def _frames_meta(self) -> FramesMeta:
        """``frames.json`` of a dump of this storage (a new id, generation 0)."""
        config, pool = self.config(), self._pool
        live = 0 if pool is None else pool.live
        data = 0 if pool is None else (pool.blob_bytes if self._codec else live * pool.frame_bytes)
        key = tuple(config["key"])
        return FramesMeta(
            new_id(),
            self.capacity,
            config["stack"],
            key,
            config["codec"],
            self.layout,
            0,
            live,
            data,
        )

    def dump(
        self, directory: Path, codec: Codec, tensors: list[torch.Tensor], fsync: bool = True
    ) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
        """Write a storage directory: ``frames.json``, the steps (their own hook), the frames."""
        self._check_open()
        directory.mkdir()
        steps, steps_sums = self._steps.dump(directory / STEPS_DIR, codec, tensors, fsync)
        meta = self._frames_meta()
        data, table = (np.zeros(0, np.uint8), np.zeros((0, 2), np.int64))
        if self._pool is not None:
            data, table = self._pool.export()
        sums = write_frames(directory, meta, data, table, fsync)
        sums.update({f"{STEPS_DIR}/{name}": rec for name, rec in steps_sums.items()})
        fsync_dir(directory, fsync)
        return {"dir": directory.name, "id": meta.ident, "steps": steps}, sums

    @classmethod
    def check_dump(
        cls, directory: Path, config: dict[str, Any], state: Any, meta_file: Path
    ) -> Any:
        """Check ``frames.json``, the steps' files and the frame files (sizes, headers, ids)."""
        return check_dumped(cls, directory, config, state, meta_file)

    @classmethod
    def restore(cls: type[_F], saved: SavedStorage) -> _F:
        """The dumped directory opened copy-on-write (lazy; writes never reach it).

        A storage saved from a GPU is copied to its device.
        """
        directory, config = saved.directory, saved.config
        try:
            storage = cls.open(directory, copy_on_write=True)
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{directory}: {err}") from err
        check_config(storage, config)
        if torch.device(config.get("device", "cpu")).type == "cpu":
            return storage
        own = cls(**config)
        try:
            own.copy_from(storage)
        finally:
            storage.close()
        return own

    def dump_state(self, codec: Codec) -> dict[str, Any]:
        """The layout, the steps' state (their own hook) and the frames (``uint8`` tensors)."""
        self._check_open()
        layout = self.layout
        state: dict[str, Any] = {"steps": self._steps.dump_state(codec)}
        state["layout"] = None if layout is None else layout.to_json()
        if self._pool is not None:
            data, table = self._pool.export()
            state["frames"] = torch.from_numpy(data.copy())
            state["table"] = torch.from_numpy(table.copy())
        return state

    @classmethod
    def from_state(cls: type[_F], config: dict[str, Any], state: Any, codec: Codec) -> _F:
        """A new storage in memory, filled from :meth:`dump_state`."""
        storage = cls(**config)
        try:
            raw = state["layout"]
            steps = {"max_size": storage.capacity, "device": str(storage.device)}
            storage._steps = TensorStorage.from_state(steps, state["steps"], codec)
            if raw is not None:
                layout = Layout.from_json(raw)
                storage.check_layout(layout)
                storage._ensure_layout(layout)
                data, table = state["frames"], state["table"]
                if data.dtype != torch.uint8 or table.dtype != torch.int64 or table.dim() != 2:
                    raise ValueError("'frames' must be uint8 and 'table' int64 [slots, 2]")
                assert storage._pool is not None
                storage._pool.load(data.numpy(), table.numpy())
                storage._attach(layout)
            elif len(storage._steps):
                raise ValueError("steps without a layout")
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as err:
            raise CheckpointError(f"{cls.__name__}: state: {err}") from err
        return storage

    @classmethod
    def describe(
        cls,
        directory: Path,
        config: dict[str, Any] | None = None,
        state: Any = None,
        meta_file: Path | None = None,
    ) -> tuple[StorageInfo, list[str]]:
        """``frames.json`` and the steps' metadata: stack, codec, frames held, bytes per step."""
        return describe_dir(directory)

    @classmethod
    def empty_like(
        cls: type[_F],
        src: Storage,
        path: str | os.PathLike[str] | None = None,
        block_rows: int | None = None,
    ) -> _F:
        """A new, empty storage like ``src`` (a FrameStackStorage) at ``path``."""
        if not isinstance(src, FramePersistence):
            raise TypeError(
                f"{cls.__name__} is made from another FrameStackStorage (its stack and key); "
                "build one with FrameStackStorage(capacity, stack, path=...) and write to it"
            )
        config = src.config()
        key, codec = tuple(config["key"]), config["codec"]
        return cls(src.capacity, config["stack"], key=key, codec=codec, path=path)  # type: ignore[call-arg]
