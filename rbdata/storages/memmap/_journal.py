"""``journal.bin`` of a :class:`~rbdata.storages.MemmapStorage`: the redo journal of a write.

The crash model is SIGKILL (or any death of the writing process), not power loss: the page
cache outlives the process, so every store that was executed before the kill is in the files,
in program order, and nothing here needs an fsync (``MemmapStorage.flush`` is for power loss).

The formats of the unreleased rbdata 0.1.0 (a header ``length, next`` with no magic, a journal
of magic ``RBDJRN01`` whose commit word is a sum of the words) are not read: opening a storage
that has one is a ``ValueError`` that says so, and changes nothing.

Its format (the head, the payload of a transaction, the commit word) is
``_journal_format.py``; the header (``header.bin``, published after a transaction was applied)
``_header.py``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rbdata._core.checksum import crc32
from rbdata._core.layout import Layout
from rbdata.storages._target import WriteTarget
from rbdata.storages.memmap._header import Header
from rbdata.storages.memmap._journal_format import (
    COMMITTED,
    JMAGIC,
    JOURNAL_HEAD,
    Plan,
    check_magic,
    checksum,
    payload_offsets,
)
from rbdata.storages.memmap._rawfile import as_tensor, open_fd, regular_size

__all__ = ["Journal", "read_orphan"]


class Journal:
    """The redo journal of one storage directory (see the module docstring).

    A process that writes through the journal holds a shared ``flock`` on it until it
    closes the storage; :meth:`replay_if_orphaned` (run by ``open``) replays a committed
    transaction only when it gets the lock exclusively, i.e. when no live process writes.
    """

    def __init__(self, path: Path, layout: Layout, capacity: int) -> None:
        self.path = path
        self.capacity = capacity
        self.leaves = [
            (leaf.dtype, leaf.shape, leaf.numel * leaf.dtype.itemsize) for leaf in layout.leaves
        ]
        self.item_bytes = sum(b for _, _, b in self.leaves)
        self._fd = open_fd(path, os.O_RDWR | os.O_CREAT, "journal.bin")
        self._mmap: mmap.mmap | None = None
        self._q = memoryview(b"")
        self._locked = False
        try:
            size = regular_size(self._fd, path)
            if size < JOURNAL_HEAD:
                self._grow(JOURNAL_HEAD)
                os.pwrite(self._fd, struct.pack("=q", JMAGIC), 0)
            else:
                self._map(size)
                check_magic(self._words, path)
                if not self._q[0]:  # created, then killed before the magic was written
                    self._q[0] = JMAGIC
        except BaseException:
            if self._mmap is not None:
                self.close()
            else:
                os.close(self._fd)
            raise

    # --- mapping -------------------------------------------------------------------------
    def _map(self, size: int) -> None:
        self._plans: dict[int, Plan] = {}
        self._run_head: Plan | None = None  # the plan whose one-run head words are in place
        self._run_crc = memoryview(b"")  # the bytes its commit word covers
        self._mmap = mmap.mmap(self._fd, size)
        self._words = np.frombuffer(self._mmap, dtype=np.uint64)
        self._b = memoryview(self._mmap)
        self._q = self._b.cast("q")
        self._size = size

    def _grow(self, need: int) -> None:
        size = max(need, 2 * getattr(self, "_size", 0), 4096)
        size = -(-size // 4096) * 4096
        current = regular_size(self._fd, self.path)
        if current < size:
            try:
                os.posix_fallocate(self._fd, 0, size)
            except AttributeError:  # pragma: no cover - no posix_fallocate (macOS)
                os.ftruncate(self._fd, size)
            except OSError as err:
                if err.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise OSError(
                        err.errno,
                        f"{self.path}: cannot grow the journal to {size} bytes "
                        f"({err.strerror}); nothing was written",
                    ) from err
                os.ftruncate(self._fd, size)
        else:
            size = current
        self._q.release()
        self._map(size)

    def end(self, rows: int) -> int:
        """The end of the payload of a transaction of ``rows`` rows."""
        return payload_offsets([nbytes for _, _, nbytes in self.leaves], rows)[1]

    def plan(self, rows: int) -> Plan:
        """The payload views (torch, and numpy where the dtype has one) for ``rows`` rows."""
        plan = self._plans.get(rows)
        if plan is None:
            offsets, off = payload_offsets([nbytes for _, _, nbytes in self.leaves], rows)
            tviews, nviews = [], []
            for (dtype, shape, nbytes), start in zip(self.leaves, offsets, strict=True):
                t = as_tensor(self._mmap, start, rows * nbytes, dtype, (rows, *shape))
                tviews.append(t)
                nviews.append(None if dtype is torch.bfloat16 or not nbytes else t.numpy())
            numpy = all(v is not None for v in nviews)
            first = [v[0:1].reshape(v.shape[1:]) for v in nviews if v is not None] if numpy else []
            plan = Plan(off, rows, tviews, nviews, numpy, first)
            if len(self._plans) > 8:
                self._plans.clear()
            self._plans[rows] = plan
        return plan

    def _plan_with_room(self, rows: int, tail: int) -> Plan:
        """The plan of ``rows`` rows in a journal grown to hold it and ``tail`` bytes after it.

        A grow maps the file anew, so the plan is taken after it (never one of the old map).
        """
        plan = self._plans.get(rows)
        end = self.end(rows) if plan is None else plan.end
        if end + tail > self._size:
            self._grow(end + tail)
        return self.plan(rows)

    # --- writing -------------------------------------------------------------------------
    def lock_shared(self) -> None:
        """Take the writers' shared lock (once; held until :meth:`close`)."""
        if not self._locked:
            fcntl.flock(self._fd, fcntl.LOCK_SH)
            self._locked = True

    @property
    def committed(self) -> bool:
        """Whether a committed transaction is in the journal."""
        return bool(self._q[1])

    def begin(
        self, kind: int, slots: Sequence[int] | torch.Tensor, rows: int, length: int, nxt: int
    ) -> Plan:
        """Write a transaction's head and slots; return the payload views to fill."""
        nslots = len(slots)
        plan = self._plan_with_room(rows, 8 * nslots)
        end = plan.end
        q = self._q
        self._run_head = None
        q[2] = kind
        q[3] = nslots // 2 if kind == 0 else nslots
        q[4] = rows
        q[5] = length
        q[6] = nxt
        q[7] = end - JOURNAL_HEAD
        first = end // 8
        if isinstance(slots, torch.Tensor):
            self._words[first : first + nslots] = slots.numpy().view(np.uint64)
        else:
            for i, v in enumerate(slots, first):
                q[i] = v
        return plan

    def begin_run(
        self, start: int, stop: int, length: int, nxt: int, own: bool = False
    ) -> Plan | None:
        """:meth:`begin` for the slots ``[start, stop)``, once their plan exists (else ``None``).

        ``own``: no other process writes this journal, so the head words that this one's
        last one-run transaction of as many rows stored are still in place and only the
        varying ones are written. Commit with :meth:`commit_run`.
        """
        plan = self._plans.get(stop - start)
        if plan is None or not plan.numpy or plan.end + 16 > self._size:
            return None
        q = self._q
        if not own or self._run_head is not plan:  # kind, runs, rows, payload: still there?
            self._set_run_head(plan)
        q[5] = length
        q[6] = nxt
        i = plan.end >> 3
        q[i] = start
        q[i + 1] = stop
        return plan

    def commit_run(self) -> None:
        """:meth:`commit` of the transaction :meth:`begin_run` began."""
        self._q[1] = crc32(self._run_crc) | COMMITTED

    def _set_run_head(self, plan: Plan) -> None:
        """Store the head words of a one-run transaction (kind, runs, rows, payload)."""
        q = self._q
        q[2], q[3], q[4], q[7] = 0, 1, plan.rows, plan.end - JOURNAL_HEAD
        self._run_head = plan
        self._run_crc = self._b[16 : plan.end + 16]  # head words to the end of the two slots

    def write_one(
        self,
        arrays: list[Any],
        values: list[Any],
        slot: int,
        length: int,
        nxt: int,
        header: Header,
        own: bool = True,
    ) -> bool:
        """Write one item at ``slot`` of ``arrays`` as a whole transaction; ``False``: not now.

        The crash-atomic one-item write: the rows go to the journal, the commit word is
        stored, the rows go to ``arrays``, ``header`` is published (``length, nxt``), the
        journal is cleared. ``values`` are checked already: each assigns exactly to a row of
        its array. ``own`` as in :meth:`begin_run`. ``False`` (nothing written) until the
        one-item plan exists (:meth:`begin` lays it out) or while a transaction is committed.
        """
        plan = self._run_head
        q = self._q
        if not own or plan is None or plan.rows != 1 or q[1]:
            plan = self._plans.get(1)
            if plan is None or not plan.numpy or plan.end + 16 > self._size or q[1]:
                return False
            self._set_run_head(plan)
        q[5] = length
        q[6] = nxt
        i = plan.end >> 3
        q[i] = slot
        q[i + 1] = slot + 1
        for row, value in zip(plan.first, values, strict=True):
            row[...] = value
        q[1] = crc32(self._run_crc) | COMMITTED  # committed: replayed from here on
        for arr, value in zip(arrays, values, strict=True):
            arr[slot] = value
        header.publish(length, nxt)
        q[1] = 0
        return True

    def write_packed(self, row: Any, flat: Any, slot: int) -> int:
        """:meth:`write_one` of a packed item (``_packed.PackedRow.write``); the count before.

        Only for a journal that no other process writes. ``-1`` (nothing written) while a
        transaction is committed.
        """
        if self._q[1]:
            return -1
        plan = self._run_head
        if plan is None or plan.rows != 1 or row.mapping is not self._mmap:
            plan = self._plan_with_room(1, 16)  # one run: two slot words
            self._set_run_head(plan)
            row.bind(self._mmap, plan)
        return row.write(flat, slot)

    def commit(self, plan: Plan, nslots: int) -> None:
        """Store the commit word (the checksum): from now on the transaction is replayed."""
        self._q[1] = checksum(self._b, plan.end // 8 + nslots)

    def clear(self) -> None:
        """Mark the journal empty (the transaction is applied and published)."""
        self._q[1] = 0

    # --- reading -------------------------------------------------------------------------
    def read(self) -> tuple[int, WriteTarget, int, int, int, Plan]:
        """Validate the committed transaction; return ``kind, target, rows, length, next, views``.

        Raises:
            ValueError: naming the journal and the field that is out of range.
        """
        if self._fd >= 0:
            size = regular_size(self._fd, self.path)
            if size > self._size:  # another process grew it
                self._map(size)
        words = self._words
        kind, count, rows, length, nxt, payload = (int(w) for w in words[2:8].view(np.int64))
        cap, where = self.capacity, self.path

        def bad(field: str, value: int, expected: str) -> ValueError:
            return ValueError(f"{where}: journal field {field!r} is {value}, expected {expected}")

        check_magic(words, where)
        if kind not in (0, 1):
            raise bad("kind", kind, "0 or 1")
        if not 1 <= rows <= cap:
            raise bad("rows", rows, f"in [1, {cap}]")
        if not 0 <= length <= cap:
            raise bad("length", length, f"in [0, {cap}]")
        if not 0 <= nxt < cap:
            raise bad("next", nxt, f"in [0, {cap})")
        end = self.end(rows)
        if payload != end - JOURNAL_HEAD:
            raise bad("payload", payload, str(end - JOURNAL_HEAD))
        nslots = 2 * count if kind == 0 else count
        if not 0 <= count <= rows or end + 8 * nslots > self._size:
            raise bad("count", count, f"at most {rows} within the file")
        stop = end // 8 + nslots
        if self._q[1] != checksum(self._b, stop):
            raise ValueError(f"{where}: committed journal checksum mismatch; corrupt")
        slots = words[end // 8 : end // 8 + nslots].view(np.int64)
        if kind == 0:
            runs = slots.reshape(-1, 2).tolist()
            if any(not 0 <= a <= b <= cap for a, b in runs) or sum(b - a for a, b in runs) != rows:
                raise ValueError(f"{where}: journal runs out of range or not {rows} rows")
            out = WriteTarget.of_runs([slice(a, b) for a, b in runs])
        else:
            if count != rows or (count and (slots.min() < 0 or slots.max() >= cap)):
                raise ValueError(f"{where}: journal slots out of range [0, {cap})")
            out = WriteTarget.of_slots(torch.from_numpy(slots.copy()))
        return kind, out, rows, length, nxt, self.plan(rows)

    def replay_if_orphaned(self, apply: Any) -> bool:
        """Replay a committed transaction if no live process writes (exclusive lock)."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live writer finishes (or replays) its own transaction
        try:
            if not self.committed:
                return False
            apply(*self.read())
            self.clear()
            return True
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def flush(self) -> None:
        """``msync`` the journal."""
        if self._mmap is not None:
            self._mmap.flush()

    def close(self) -> None:
        """Drop the mapping and the lock (now, unless views of the journal are still held)."""
        self._plans = {}
        self._run_head, self._run_crc = None, memoryview(b"")
        self._words = np.zeros(0, dtype=np.uint64)
        self._q.release()
        self._b.release()
        mapping, self._mmap = self._mmap, None
        if mapping is not None:
            # the mapping holds a duplicate of the descriptor, and with it the lock
            with contextlib.suppress(BufferError):  # views held elsewhere: when collected
                mapping.close()
        os.close(self._fd)


def read_orphan(path: Path, layout: Layout, capacity: int) -> tuple[Any, ...] | None:
    """The committed transaction of a journal read without writing it (copy-on-write opens)."""
    fd = open_fd(path, os.O_RDONLY, "journal.bin")
    try:
        size = regular_size(fd, path)
        if size < JOURNAL_HEAD:
            return None
        data = bytearray(os.pread(fd, size, 0))
    finally:
        os.close(fd)
    journal = Journal.__new__(Journal)
    journal.path, journal.capacity = path, capacity
    journal.leaves = [(lf.dtype, lf.shape, lf.numel * lf.dtype.itemsize) for lf in layout.leaves]
    journal._fd, journal._size, journal._plans = -1, size, {}
    journal._mmap = data  # type: ignore[assignment]
    journal._words = np.frombuffer(data, dtype=np.uint64)
    journal._b = memoryview(data)
    journal._q = journal._b.cast("q")
    check_magic(journal._words, path)
    if not journal.committed:
        return None
    return journal.read()
