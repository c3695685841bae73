"""``header.bin`` of a :class:`~rbdata.storages.MemmapStorage`: its format and its mapping.

The crash model is SIGKILL (or any death of the writing process), not power loss: the page
cache outlives the process, so every store that was executed before the kill is in the files,
in program order, and nothing here needs an fsync (``MemmapStorage.flush`` is for power loss).

``header.bin`` (64 bytes of native int64) is a double record: ``magic, active, (length, next,
check) x 2``. A publish writes the inactive record and then flips ``active`` with one aligned
8-byte store, so a kill leaves the old or the new record, never a mix; ``check`` (a hash of the
record) catches a hand-edited or corrupt header at open.

The format of the unreleased rbdata 0.1.0 (a header ``length, next`` with no magic) is not
read: opening a storage that has one is a ``ValueError`` that says so, and changes nothing.

In a directory with an id (``layout.json``'s ``"id"``, format version 2) the 64 bytes are
followed by the id's trailer (:data:`HEADER_LEAF` as its index; see
:func:`~rbdata.storages.memmap._rawfile.trailer`), checked when the header is opened: a
``header.bin`` swapped in from another storage or checkpoint is refused (one 32-byte read).
"""

from __future__ import annotations

import mmap
import os
import reprlib
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rbdata._core.ids import TRAILER_BYTES
from rbdata.storages.memmap._plain import check_trailer, open_fd, regular_size, trailer

__all__ = [
    "HEADER_BYTES",
    "HEADER_LEAF",
    "HEADER_TERMS",
    "LEGACY",
    "Header",
    "bad_field",
    "decode_header",
    "encode_header",
]

HEADER_BYTES = 64
#: the index in the header's id trailer (the data files' trailers hold their leaf's index)
HEADER_LEAF = (1 << 63) - 1
_MAGIC = int.from_bytes(b"RBDHDR02", "little")
_MASK = (1 << 63) - 1


_K_LENGTH, _K_NEXT, _K_SLOT = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B1
_SLOT_TERMS = (_K_SLOT ^ _MAGIC, (2 * _K_SLOT) ^ _MAGIC)
HEADER_TERMS = (_K_LENGTH, _K_NEXT, *_SLOT_TERMS, _MASK)
"""``K_length, K_next, slot-0 term, slot-1 term, mask``: a header record's check is
``((length * K_length) ^ (next * K_next) ^ slot term) & mask``, or 1 where that is 0."""


def bad_field(file: Path, field: str, value: Any, expected: str) -> ValueError:
    """The error of a metadata field out of range, naming the file and the field."""
    shown = reprlib.repr(value)
    return ValueError(f"{file}: field {field!r} is {shown}, expected {expected}")


def _check(length: int, nxt: int, slot: int) -> int:
    x = (length * _K_LENGTH) ^ (nxt * _K_NEXT) ^ ((slot + 1) * _K_SLOT)
    return ((x ^ _MAGIC) & _MASK) or 1


def encode_header(length: int, nxt: int, ident: str | None = None) -> bytes:
    """A header holding ``length`` and ``next`` (record 0 active), then ``ident``'s trailer.

    64 bytes, then :data:`~rbdata._core.ids.TRAILER_BYTES` more when the
    directory has an id (``None``: a version-1 directory, which has none).
    """
    record = struct.pack("=8q", _MAGIC, 0, length, nxt, _check(length, nxt, 0), 0, 0, 0)
    return record + trailer(ident, HEADER_LEAF)


LEGACY = (
    "which this version of rbdata does not read; open it with the rbdata that wrote it, or "
    "re-create the storage"
)


def decode_header(words: Sequence[int], path: Path) -> tuple[int, int]:
    if words[0] != _MAGIC:
        if not any(words[2:]):  # length, next, zeros
            raise ValueError(
                f"{path}: no magic 'RBDHDR02': a header of the unreleased rbdata 0.1.0 "
                f"(length, next, zeros) or a corrupt one, {LEGACY}"
            )
        raise ValueError(f"{path}: not a MemmapStorage header (bad magic); corrupt")
    active = words[1]
    if active not in (0, 1):
        raise ValueError(f"{path}: header field 'active' is {active}, expected 0 or 1; corrupt")
    length, nxt, check = words[2 + 3 * active : 5 + 3 * active]
    if check != _check(length, nxt, active):
        raise ValueError(f"{path}: header checksum mismatch; corrupt")
    return length, nxt


class Header:
    """The shared (or private, for copy-on-write) double-record header of a storage."""

    def __init__(
        self, path: Path, create: bool, private: bool = False, ident: str | None = None
    ) -> None:
        self._mmap: mmap.mmap | None = None
        self._length_term = (-1, 0)
        self.path = path
        if create:
            _replace(path, encode_header(0, 0, ident))
        fd = open_fd(path, os.O_RDONLY if private else os.O_RDWR, "header.bin")
        try:
            size = HEADER_BYTES + (0 if ident is None else TRAILER_BYTES)
            if regular_size(fd, path) != size:
                raise ValueError(f"{path}: expected a {size}-byte header, file is corrupt")
            if ident is not None:  # this directory's header, not another storage's
                check_trailer(os.pread(fd, TRAILER_BYTES, HEADER_BYTES), ident, HEADER_LEAF, path)
            words = struct.unpack("=8q", os.pread(fd, HEADER_BYTES, 0))
            self.first = decode_header(words, path)
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

    def check(self, capacity: int, has_layout: bool) -> None:
        """The length and next slot read at open, checked against the capacity and the layout.

        Raises:
            ValueError: naming the file and the field out of range.
        """
        (length, nxt), file, cap = self.first, self.path, capacity
        if not 0 <= length <= cap:
            raise bad_field(file, "length", length, f"in [0, {cap}] (the capacity)")
        if not 0 <= nxt < cap:
            raise bad_field(file, "next", nxt, f"in [0, {cap})")
        if nxt > length:
            raise bad_field(file, "next", nxt, f"at most the length {length}")
        if not has_layout and length:
            raise bad_field(file, "length", length, "0: layout.json has no layout")

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
    fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "header.bin")
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
