"""``versions.bin`` of a shared :class:`~rbdata.storages.MemmapStorage`: one word per slot.

Readers of a shared storage take no lock, so a read can overlap a write of the same slot
(a full ring being overwritten by another process). Each slot has a version word, a
*sequence lock*: a writer (under the write lock) makes the words of the slots it writes odd
before touching their rows and the next even number after; a reader copies the words, the
rows, then the words again. A row whose two copies differ, or are odd, overlapped a write:
it is read again (a few times), then under the write lock. So a reader never returns a torn
row (some fields of the old item, some of the new).

A last word, the storage-wide *stamp*, is odd while any write is in progress and raised by
each: a read that sees it even before its gather and unchanged after overlapped no write, and
needs no per-slot check (two one-word reads: the common case, the cost of an unshared read).
Only a read that overlapped a write pays the per-slot check (two small gathers of words and a
second gather of its rows).

A writer killed between the two marks leaves its slots odd: readers then read them under
the lock until a later write of the slot makes the word even again.

The file is created when a storage is first shared (pickled, forked, ``share()``): the words
start at 0 (even, "no write in progress"). Unshared storages have one writer in this process
and no concurrent reader; they keep no versions.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numba
import numpy as np
import torch

from rbdata._core.native import fence
from rbdata.storages._target import WriteTarget
from rbdata.storages.memmap._rawfile import open_fd, regular_size

__all__ = ["VERSIONS_FILE", "SlotVersions", "barrier", "consistent_rows"]

TRIES = 16  #: lock-free re-reads of the rows that raced a write, before one under the lock

VERSIONS_FILE = "versions.bin"


@numba.njit(cache=True, nogil=True)
def _nb_barrier() -> None:  # pragma: no cover - compiled
    fence()


@numba.njit(cache=True, nogil=True)
def _nb_stamp(words: Any) -> int:  # pragma: no cover - compiled
    fence()
    stamp = words[0]
    fence()
    return stamp


@numba.njit(cache=True, nogil=True)
def _nb_read(words: Any, slots: Any, out: Any) -> None:  # pragma: no cover - compiled
    fence()
    for i in range(slots.shape[0]):
        out[i] = words[slots[i]]
    fence()


@numba.njit(cache=True, nogil=True)
def _nb_changed(words: Any, slots: Any, before: Any, bad: Any) -> int:  # pragma: no cover
    fence()
    n = 0
    for i in range(slots.shape[0]):
        b = before[i]
        if (b & 1) or words[slots[i]] != b:
            bad[n] = i
            n += 1
    return n


def barrier() -> None:
    """A full memory fence (loads and stores stay on their side of it, on any CPU)."""
    _nb_barrier()


def _read(words: np.ndarray[Any, Any], slots: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``words[slots]``, fenced from the reads around it (slots checked by the caller)."""
    out = np.empty(slots.shape[0], dtype=np.uint64)
    _nb_read(words, slots, out)
    return out


def _changed(
    words: np.ndarray[Any, Any], slots: np.ndarray[Any, Any], before: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """Positions ``i`` whose word is odd in ``before`` or differs now (a write overlapped)."""
    bad = np.empty(slots.shape[0], dtype=np.int64)
    return bad[: _nb_changed(words, slots, before, bad)]


class SlotVersions:
    """The version words of ``capacity`` slots, mapped shared from ``path``.

    Args:
        path: ``versions.bin`` in the storage directory (created, zeroed, if absent).
        capacity: slots of the storage.

    Raises:
        ValueError: the file exists with another size (corrupt).
    """

    def __init__(self, path: Path, capacity: int) -> None:
        nbytes = (capacity + 1) * 8  # a word per slot, then the storage-wide stamp
        fd = open_fd(path, os.O_RDWR | os.O_CREAT, VERSIONS_FILE)
        try:
            size = regular_size(fd, path)
            if size == 0:  # new: every slot even (no write in progress)
                os.ftruncate(fd, nbytes)
            elif size != nbytes:
                raise ValueError(
                    f"{path}: {size} bytes, expected {nbytes} (8 per slot of {capacity}, and 8); "
                    "corrupt"
                )
            self._mmap: mmap.mmap | None = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        #: one uint64 per slot: odd while a writer changes the slot's rows
        every = np.frombuffer(self._mmap, dtype=np.uint64)
        self.words: np.ndarray[Any, Any] = every[:capacity]
        #: odd while any write is in progress; a read that sees it even and unchanged around
        #: its gather overlapped no write (the common case: no per-slot check needed)
        self.stamp_word: np.ndarray[Any, Any] = every[capacity:]

    def begin(self, target: WriteTarget) -> list[Any]:
        """Mark the slots of ``target`` as being written (odd); returns them for :meth:`end`."""
        marks = target.selectors()  # runs as slices, or one array of slots
        self.stamp_word |= 1
        barrier()
        w = self.words
        for where in marks:
            w[where] |= 1
        barrier()  # the marks are visible before any row changes
        return marks

    def end(self, marks: list[Any]) -> None:
        """Mark the slots :meth:`begin` returned as written: the next even version."""
        barrier()  # every row is written before the marks change
        w = self.words
        for where in marks:
            w[where] = (w[where] | 1) + 1
        barrier()
        self.stamp_word[:] = (self.stamp_word | 1) + 1

    @contextlib.contextmanager
    def writing(self, target: WriteTarget) -> Iterator[None]:
        """:meth:`begin` on entry, :meth:`end` on exit (an error included): a write's marks."""
        marks = self.begin(target)
        try:
            yield
        finally:
            self.end(marks)

    def stamp(self) -> int:
        """The storage-wide stamp: odd while a write is in progress, raised by each write."""
        return int(_nb_stamp(self.stamp_word))

    def read(self, slots: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """A copy of the version words of ``slots`` (int64, in range; fenced both sides)."""
        return _read(self.words, slots)

    def changed(
        self, slots: np.ndarray[Any, Any], before: np.ndarray[Any, Any]
    ) -> np.ndarray[Any, Any]:
        """The positions of ``slots`` that a write overlapped since :meth:`read` gave ``before``."""
        return _changed(self.words, slots, before)

    def close(self) -> None:
        """Unmap the file."""
        self.words = self.stamp_word = np.zeros(0, dtype=np.uint64)
        if self._mmap is not None:
            with contextlib.suppress(BufferError):  # a view of the words lives: unmapped with it
                self._mmap.close()
            self._mmap = None


def consistent_rows(
    versions: SlotVersions,
    idx: torch.Tensor,
    gather: Callable[[torch.Tensor], list[torch.Tensor]],
    lock: Callable[[], contextlib.AbstractContextManager[None]],
) -> list[torch.Tensor]:
    """``gather(idx)`` (one tensor of rows per leaf) with no row torn by a concurrent write.

    The rows whose version words changed or were odd around the gather are read again, up to
    :data:`TRIES` times, then under ``lock()`` (the storage's write lock: no writer runs).
    """
    stamp = versions.stamp()
    if not stamp & 1:  # no write in progress: unchanged after the gather, none overlapped it
        rows = gather(idx)
        if versions.stamp() == stamp:
            return rows
    slots = idx.numpy()
    if slots.dtype != np.int64 or not slots.flags.c_contiguous:
        slots = np.ascontiguousarray(slots, dtype=np.int64)
    before = versions.read(slots)
    rows = gather(idx)
    bad = versions.changed(slots, before)
    tries = 0
    while bad.size:
        pos = torch.from_numpy(bad)
        sub = idx[pos]
        if tries == TRIES:  # a long write, or a writer that died between its marks
            with lock():
                fixed = gather(sub)
            ok = np.ones(bad.size, dtype=bool)
        else:
            if tries:
                os.sched_yield()  # let the writer finish its copy
            again = slots[bad]
            b = versions.read(again)
            fixed = gather(sub)
            ok = np.ones(bad.size, dtype=bool)
            ok[versions.changed(again, b)] = False
        tries += 1
        if ok.any():
            good = torch.from_numpy(np.flatnonzero(ok))
            for out, new in zip(rows, fixed, strict=True):
                out[pos[good]] = new[good]
        bad = bad[~ok]
    return rows
