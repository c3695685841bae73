"""What the processes of a shared :class:`~rbdata.storages.MemmapStorage` share.

- :class:`SharedState`: ``shared.bin``, the write lock and the total-writes counter, created
  when a storage is first shared between processes (pickled, forked, ``share()``); see
  ``docs/distributed.md`` for how writers and the learner use it;
- :class:`Sharing`: a storage's side of it: the state (this process's until shared), the
  per-slot version words (``versions.bin``) once shared, and the nesting of the write lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rbdata._core.files import inside
from rbdata.storages._target import WriteTarget
from rbdata.storages.memmap._header import HEADER_BYTES
from rbdata.storages.memmap._rawfile import open_fd, regular_size
from rbdata.storages.memmap._versions import VERSIONS_FILE, SlotVersions

__all__ = ["SHARED_FILE", "SharedState", "Sharing"]

SHARED_FILE = "shared.bin"

_SMAGIC = int.from_bytes(b"RBDSHR01", "little")


class SharedState:
    """``shared.bin``: the write lock and the total-writes counter shared by every process.

    64 bytes of native int64 (``magic, writes``, zeros), mapped shared. ``writes`` counts
    every item committed (it only grows); it is changed under the exclusive ``flock`` of this
    file when the storage is shared between processes (:meth:`lock`). The file is created
    when a storage is first shared, seeded with the count of the process that shares it
    (``seed``); until then (``path=None``) the count lives in this process's memory and
    :meth:`lock` does nothing. ``flock`` locks belong to an open file description, which a
    forked child shares with its parent: :meth:`lock` reopens the file in a new process first.
    """

    def __init__(self, path: Path | None, seed: int = 0) -> None:
        self.path = path
        self._fd = -1
        self._mmap: mmap.mmap | None = None
        self._pid = os.getpid()
        if path is None:
            self._local = bytearray(HEADER_BYTES)
            self._words = memoryview(self._local).cast("q")
            self._words[0], self._words[1] = _SMAGIC, seed
            return
        self._fd = open_fd(path, os.O_RDWR | os.O_CREAT, "shared.bin")
        try:
            size = regular_size(self._fd, path)
            if size < HEADER_BYTES:  # new (or a directory from before it): zeros, then magic
                os.ftruncate(self._fd, HEADER_BYTES)
            elif size != HEADER_BYTES:
                raise ValueError(f"{path}: expected a {HEADER_BYTES}-byte file; corrupt")
            self._mmap = mmap.mmap(self._fd, HEADER_BYTES)
        except BaseException:
            os.close(self._fd)
            raise
        self._words = memoryview(self._mmap).cast("q")
        if self._words[0] != _SMAGIC:
            if self._words[0] != 0 or self._words[1] < 0:
                self.close()
                raise ValueError(f"{path}: not a MemmapStorage shared state (bad magic)")
            self._words[1] = seed
            self._words[0] = _SMAGIC

    @property
    def writes(self) -> int:
        """Items committed so far, by every process (monotonic)."""
        return self._words[1]

    def local_counter(self) -> np.ndarray | None:
        """The words of a process-local state as an int64 array (``None`` once shared).

        ``[1]`` is the count; a writer that counts without :meth:`count` holds this array.
        """
        if self.path is not None:
            return None
        return np.frombuffer(self._local, dtype=np.int64)

    def count(self, n: int) -> int:
        """Count ``n`` committed items (under :meth:`lock` when shared); return the count before."""
        w = self._words
        before = w[1]
        w[1] = before + n
        return before

    def lock(self) -> None:
        """Take the exclusive write lock (blocks while another process holds it)."""
        if self._fd < 0:
            return
        if os.getpid() != self._pid:  # a forked child: its own open file description
            assert self.path is not None
            self._fd = open_fd(self.path, os.O_RDWR, "shared.bin")
            self._pid = os.getpid()
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def unlock(self) -> None:
        """Release the write lock."""
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Release the mapping and the file."""
        self._words.release()
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Sharing:
    """A storage's side of sharing its directory: the state, the slots' versions, the lock.

    Args:
        root: the storage directory (``shared.bin`` and ``versions.bin`` go there).
        capacity: the storage's capacity (one version word per slot).
        state: the :class:`SharedState` to start from: this process's (``path=None``) or,
            for a storage that joins sharers, the mapped ``shared.bin``.

    Until :meth:`share`, the count lives in this process and nothing is locked or marked.
    """

    def __init__(self, root: Path, capacity: int, state: SharedState) -> None:
        self.state = state
        self.versions: SlotVersions | None = None  # per-slot sequence words once shared
        self._root = root
        self._capacity = capacity
        self._depth = 0  # write-lock nesting in this process (the flock is taken once)

    def share(self) -> None:
        """Map ``shared.bin`` (seeded with this process's count) and the slots' version words."""
        if self.state.path is None:
            state = SharedState(inside(self._root, SHARED_FILE), seed=self.state.writes)
            self.state.close()
            self.state = state
        self.versions = SlotVersions(inside(self._root, VERSIONS_FILE), self._capacity)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the write lock of ``shared.bin``; nested holds in this process take it once."""
        state = self.state
        outer = self._depth == 0  # nested (a reader's fallback inside a locked read)
        if outer:
            state.lock()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if outer:
                state.unlock()

    def marks(self, target: WriteTarget) -> contextlib.AbstractContextManager[Any]:
        """The version marks of a write of ``target`` (once shared; else nothing)."""
        versions = self.versions
        return contextlib.nullcontext() if versions is None else versions.writing(target)

    def count(self, n: int) -> int:
        """Count ``n`` committed items; return the count before (see :meth:`SharedState.count`)."""
        return self.state.count(n)

    def close(self) -> None:
        """Release the version words and the state (a second call does nothing)."""
        if self.versions is not None:
            self.versions.close()
            self.versions = None
        self.state.close()
