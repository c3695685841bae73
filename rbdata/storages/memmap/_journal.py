"""Crash-atomic writes of a :class:`~rbdata.storages.MemmapStorage`: header and redo journal.

The crash model is SIGKILL (or any death of the writing process), not power loss: the page
cache outlives the process, so every store that was executed before the kill is in the files,
in program order, and nothing here needs an fsync (``MemmapStorage.flush`` is for power loss).

``header.bin`` (64 bytes of native int64) is a double record: ``magic, active, (length, next,
check) x 2``. A publish writes the inactive record and then flips ``active`` with one aligned
8-byte store, so a kill leaves the old or the new record, never a mix; ``check`` (a hash of the
record) catches a hand-edited or corrupt header at open.

``journal.bin`` holds at most one transaction: a 64-byte head ``magic, commit, kind, count,
rows, length, next, payload bytes``, the new rows of every leaf (each segment 64-byte aligned),
then the slots (``kind`` 0: ``count`` runs ``start, stop``; 1: ``count`` slot indices). The
``commit`` word (a CRC-32 of everything after it, with bit 62 set so that it is never 0) is
stored last; 0 means empty.

The formats of the unreleased rbdata 0.1.0 (a header ``length, next`` with no magic, a journal
of magic ``RBDJRN01`` whose commit word is a sum of the words) are not read: opening a storage
that has one is a ``ValueError`` that says so, and changes nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from rbdata._layout import Layout

__all__ = [
    "COMMITTED",
    "HEADER_BYTES",
    "HEADER_TERMS",
    "JOURNAL_HEAD",
    "Header",
    "Journal",
    "Plan",
    "create_file",
    "encode_header",
    "map_file",
    "payload_offsets",
]

HEADER_BYTES = 64
_MAGIC = int.from_bytes(b"RBDHDR02", "little")
_JMAGIC = int.from_bytes(b"RBDJRN02", "little")  # commit word: a CRC-32
_JMAGIC_LEGACY = int.from_bytes(b"RBDJRN01", "little")  # 0.1.0: not read
_COMMITTED = 1 << 62
_MASK = (1 << 63) - 1
_HEAD = 64  # bytes of the journal's head
_ALIGN = 64
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


_K_LENGTH, _K_NEXT, _K_SLOT = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B1
_SLOT_TERMS = (_K_SLOT ^ _MAGIC, (2 * _K_SLOT) ^ _MAGIC)
COMMITTED = _COMMITTED
"""Bit 62: set in every commit word of a journal (so a committed one is never 0)."""
JOURNAL_HEAD = _HEAD
"""Bytes of the journal's head: the payload of a transaction starts there."""
HEADER_TERMS = (_K_LENGTH, _K_NEXT, *_SLOT_TERMS, _MASK)
"""``K_length, K_next, slot-0 term, slot-1 term, mask``: a header record's check is
``((length * K_length) ^ (next * K_next) ^ slot term) & mask``, or 1 where that is 0."""


def _check(length: int, nxt: int, slot: int) -> int:
    x = (length * _K_LENGTH) ^ (nxt * _K_NEXT) ^ ((slot + 1) * _K_SLOT)
    return ((x ^ _MAGIC) & _MASK) or 1


def encode_header(length: int, nxt: int) -> bytes:
    """The 64 bytes of a header holding ``length`` and ``next`` (record 0 active)."""
    return struct.pack("=8q", _MAGIC, 0, length, nxt, _check(length, nxt, 0), 0, 0, 0)


_LEGACY = (
    "which this version of rbdata does not read; open it with the rbdata that wrote it, or "
    "re-create the storage"
)


def _decode_header(words: Sequence[int], path: Path) -> tuple[int, int]:
    if words[0] != _MAGIC:
        if not any(words[2:]):  # length, next, zeros
            raise ValueError(
                f"{path}: no magic 'RBDHDR02': a header of the unreleased rbdata 0.1.0 "
                f"(length, next, zeros) or a corrupt one, {_LEGACY}"
            )
        raise ValueError(f"{path}: not a MemmapStorage header (bad magic); corrupt")
    active = words[1]
    if active not in (0, 1):
        raise ValueError(f"{path}: header field 'active' is {active}, expected 0 or 1; corrupt")
    length, nxt, check = words[2 + 3 * active : 5 + 3 * active]
    if check != _check(length, nxt, active):
        raise ValueError(f"{path}: header checksum mismatch; corrupt")
    return length, nxt


def _open_fd(path: Path, flags: int, what: str) -> int:
    try:
        return os.open(path, flags | _NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ValueError(f"{str(path)!r}: a symlink; {what} may not be a symlink") from err
        raise


def _regular_size(fd: int, path: Path) -> int:
    st = os.fstat(fd)
    if not (st.st_mode & 0o170000) == 0o100000:
        raise ValueError(f"{path}: not a regular file")
    return st.st_size


def create_file(path: Path, size: int) -> None:
    """Create ``path`` (no symlink followed) with ``size`` bytes reserved on disk.

    The space is reserved with ``posix_fallocate`` (a full disk is an ``OSError`` here, not a
    SIGBUS at the first write through a mapping); where that is unsupported the file is sized
    with ``ftruncate`` (sparse). On error the file is removed.
    """
    fd = _open_fd(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, "a storage file")
    try:
        if size:
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
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)


def _as_tensor(buf: Any, offset: int, nbytes: int, dtype: torch.dtype, shape: Any) -> torch.Tensor:
    flat = torch.from_numpy(np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=offset))
    return flat.view(dtype).view(shape)


def map_file(
    path: Path, dtype: torch.dtype, shape: tuple[int, ...], expected: int, private: bool, key: str
) -> tuple[torch.Tensor, np.ndarray | None]:
    """Map an existing data file of exactly ``expected`` bytes (symlinks refused).

    Returns the tensor and the ``uint8`` numpy array over the mapping that owns its memory
    (``None`` for an empty file): the storage holds it, see ``rbdata/storages/_memory.py``.
    """
    fd = _open_fd(path, os.O_RDONLY if private else os.O_RDWR, "a storage file")
    try:
        size = _regular_size(fd, path)
        if size != expected:
            raise ValueError(
                f"{path}: {size} bytes on disk, expected {expected} for key {key} "
                f"({shape[0]} x {list(shape[1:])} {dtype}); truncated or corrupt"
            )
        if expected == 0:
            return torch.zeros(shape, dtype=dtype), None
        access = mmap.ACCESS_COPY if private else mmap.ACCESS_WRITE
        mm = mmap.mmap(fd, expected, access=access)
    finally:
        os.close(fd)
    raw = np.frombuffer(mm, dtype=np.uint8, count=expected)
    return torch.from_numpy(raw).view(dtype).view(shape), raw


class Header:
    """The shared (or private, for copy-on-write) double-record header of a storage."""

    def __init__(self, path: Path, create: bool, private: bool = False) -> None:
        self._mmap: mmap.mmap | None = None
        self._length_term = (-1, 0)
        self.path = path
        if create:
            _replace(path, encode_header(0, 0))
        fd = _open_fd(path, os.O_RDONLY if private else os.O_RDWR, "header.bin")
        try:
            if _regular_size(fd, path) != HEADER_BYTES:
                raise ValueError(f"{path}: expected a {HEADER_BYTES}-byte header, file is corrupt")
            words = struct.unpack("=8q", os.pread(fd, HEADER_BYTES, 0))
            self.first = _decode_header(words, path)
            if private:
                self._words = memoryview(bytearray(encode_header(*self.first))).cast("q")
                return
            self._mmap = mmap.mmap(fd, HEADER_BYTES)
        finally:
            os.close(fd)
        self._words = memoryview(self._mmap).cast("q")

    @classmethod
    def private_copy(cls, length: int, nxt: int, path: Path) -> Header:
        """A header in this process's memory only."""
        self = cls.__new__(cls)
        self._mmap, self.path, self.first = None, path, (length, nxt)
        self._length_term = (-1, 0)
        self._words = memoryview(bytearray(encode_header(length, nxt))).cast("q")
        return self

    @property
    def length(self) -> int:
        """The filled length."""
        w = self._words
        return w[2 + 3 * w[1]]

    @property
    def next(self) -> int:
        """The slot after the last write."""
        w = self._words
        return w[3 + 3 * w[1]]

    def address(self) -> int:
        """Where the header's eight int64 words are in memory (valid until :meth:`close`)."""
        return int(np.frombuffer(self._words, dtype=np.int64).ctypes.data)

    def publish(self, length: int, nxt: int) -> None:
        """Write the inactive record, then make it the active one (one 8-byte store)."""
        w = self._words
        slot = 1 - w[1]
        base = 2 + 3 * slot
        w[base] = length
        w[base + 1] = nxt
        # _check(length, nxt, slot), with the length's term kept from the last publish
        term = self._length_term
        if term[0] != length:
            term = self._length_term = (length, length * _K_LENGTH)
        w[base + 2] = ((term[1] ^ (nxt * _K_NEXT) ^ _SLOT_TERMS[slot]) & _MASK) or 1
        w[1] = slot

    def flush(self) -> None:
        """``msync`` the header (for power loss; a SIGKILL needs nothing)."""
        if self._mmap is not None:
            self._mmap.flush()

    def close(self) -> None:
        """Release the mapping."""
        self._words.release()
        if self._mmap is not None:
            self._mmap.close()


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = _open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "header.bin")
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class Plan(NamedTuple):
    """Where a transaction of some number of rows lies in the journal."""

    end: int  # end of the payload: the slots follow
    rows: int  # rows of every leaf
    tviews: list[torch.Tensor]  # one [rows, *shape] tensor per leaf
    nviews: list[np.ndarray | None]  # the same as numpy arrays (None: no numpy dtype)
    numpy: bool  # whether every leaf has a numpy view
    first: list[np.ndarray]  # numpy views of row 0 (when ``numpy``): the one-item path


def _checksum(data: memoryview, stop: int) -> int:
    """The commit word: the CRC-32 of the 64-bit words ``[2, stop)``, with bit 62 set."""
    return zlib.crc32(data[16 : 8 * stop]) | _COMMITTED


def _check_magic(words: np.ndarray, path: Path) -> None:
    """Refuse a journal of another format (one created but killed before its magic is empty)."""
    magic = int(words[0])
    if magic == _JMAGIC or (magic == 0 and not words[1]):
        return
    if magic == _JMAGIC_LEGACY:
        raise ValueError(
            f"{path}: a journal of the unreleased rbdata 0.1.0 (magic 'RBDJRN01'), {_LEGACY}"
        )
    raise ValueError(f"{path}: not a MemmapStorage journal (bad magic); corrupt")


def _up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def payload_offsets(row_bytes: Sequence[int], rows: int) -> tuple[list[int], int]:
    """Where each leaf's ``rows`` rows start in a journal, and where the payload ends.

    Leaf segments follow the head in layout order, each 64-byte aligned.
    """
    offsets, end = [], _HEAD
    for nbytes in row_bytes:
        offsets.append(end)
        end = _up(end + rows * nbytes)
    return offsets, end


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
        self._fd = _open_fd(path, os.O_RDWR | os.O_CREAT, "journal.bin")
        self._mmap: mmap.mmap | None = None
        self._q = memoryview(b"")
        self._locked = False
        try:
            size = _regular_size(self._fd, path)
            if size < _HEAD:
                self._grow(_HEAD)
                os.pwrite(self._fd, struct.pack("=q", _JMAGIC), 0)
            else:
                self._map(size)
                _check_magic(self._words, path)
                if not self._q[0]:  # created, then killed before the magic was written
                    self._q[0] = _JMAGIC
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
        current = _regular_size(self._fd, self.path)
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
                t = _as_tensor(self._mmap, start, rows * nbytes, dtype, (rows, *shape))
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
        q[7] = end - _HEAD
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
        self._q[1] = zlib.crc32(self._run_crc) | _COMMITTED

    def _set_run_head(self, plan: Plan) -> None:
        """Store the head words of a one-run transaction (kind, runs, rows, payload)."""
        q = self._q
        q[2], q[3], q[4], q[7] = 0, 1, plan.rows, plan.end - _HEAD
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
        q[1] = zlib.crc32(self._run_crc) | _COMMITTED  # committed: replayed from here on
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
        self._q[1] = _checksum(self._b, plan.end // 8 + nslots)

    def clear(self) -> None:
        """Mark the journal empty (the transaction is applied and published)."""
        self._q[1] = 0

    # --- reading -------------------------------------------------------------------------
    def read(self) -> tuple[int, Any, int, int, int, Plan]:
        """Validate the committed transaction; return ``kind, slots, rows, length, next, views``.

        Raises:
            ValueError: naming the journal and the field that is out of range.
        """
        if self._fd >= 0:
            size = _regular_size(self._fd, self.path)
            if size > self._size:  # another process grew it
                self._map(size)
        words = self._words
        kind, count, rows, length, nxt, payload = (int(w) for w in words[2:8].view(np.int64))
        cap, where = self.capacity, self.path

        def bad(field: str, value: int, expected: str) -> ValueError:
            return ValueError(f"{where}: journal field {field!r} is {value}, expected {expected}")

        _check_magic(words, where)
        if kind not in (0, 1):
            raise bad("kind", kind, "0 or 1")
        if not 1 <= rows <= cap:
            raise bad("rows", rows, f"in [1, {cap}]")
        if not 0 <= length <= cap:
            raise bad("length", length, f"in [0, {cap}]")
        if not 0 <= nxt < cap:
            raise bad("next", nxt, f"in [0, {cap})")
        end = self.end(rows)
        if payload != end - _HEAD:
            raise bad("payload", payload, str(end - _HEAD))
        nslots = 2 * count if kind == 0 else count
        if not 0 <= count <= rows or end + 8 * nslots > self._size:
            raise bad("count", count, f"at most {rows} within the file")
        stop = end // 8 + nslots
        if self._q[1] != _checksum(self._b, stop):
            raise ValueError(f"{where}: committed journal checksum mismatch; corrupt")
        slots = words[end // 8 : end // 8 + nslots].view(np.int64)
        if kind == 0:
            runs = slots.reshape(-1, 2).tolist()
            if any(not 0 <= a <= b <= cap for a, b in runs) or sum(b - a for a, b in runs) != rows:
                raise ValueError(f"{where}: journal runs out of range or not {rows} rows")
            out: Any = [slice(a, b) for a, b in runs]
        else:
            if count != rows or (count and (slots.min() < 0 or slots.max() >= cap)):
                raise ValueError(f"{where}: journal slots out of range [0, {cap})")
            out = torch.from_numpy(slots.copy())
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
    fd = _open_fd(path, os.O_RDONLY, "journal.bin")
    try:
        size = _regular_size(fd, path)
        if size < _HEAD:
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
    _check_magic(journal._words, path)
    if not journal.committed:
        return None
    return journal.read()
