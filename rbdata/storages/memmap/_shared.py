"""``shared.bin`` of a :class:`~rbdata.storages.MemmapStorage`: the write lock and counter.

Created when a storage is first shared between processes (pickled, forked, ``share()``); see
``docs/distributed.md`` for how writers and the learner use it.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from pathlib import Path

import numpy as np

from rbdata.storages.memmap._header import HEADER_BYTES
from rbdata.storages.memmap._rawfile import open_fd, regular_size

__all__ = ["SharedState"]

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
