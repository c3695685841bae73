"""One item packed by one ``struct`` call and written by one numba kernel (``MemmapStorage.add``).

The per-step ``add`` of a :class:`~rbdata.storages.MemmapStorage` overwrites a live slot once
the ring is full, crash-atomically through the redo journal (``_journal.py``): the rows go to
the journal, the commit word is stored, the rows go to the files, the header is published,
the commit word is cleared. Done leaf by leaf from Python that is ~15 calls, ~3.2 us for a
CartPole transition. For a layout of small leaves (at most 8 elements, at most one dimension,
the common case of classic-control and low-dimensional tasks) this module does it in two
(~0.8 us):

1. ``struct.pack_into`` writes the item's values (Python numbers from the generated reader,
   ``ItemUnpacker.unpack_flat``) straight into the journal's one-row payload, in the
   journal's own format (each leaf's segment 64-byte aligned);
2. :func:`_nb_write_one` stores the head's length, next and slot words, the commit word (the
   same CRC-32 that ``zlib.crc32`` gives, which ``Journal.read`` checks at replay), copies the
   rows to the data files, publishes the header record, clears the commit word and counts
   the write, with a full fence between the phases so that neither the compiler nor the CPU
   reorders them (a SIGKILL may land on any instruction).

An append (a slot not yet live) goes through the journal's payload too, which is scratch
while no commit word is stored, and skips the commit. The kernel only ever sees addresses
taken from mappings that :class:`PackedRow` and the journal hold open, row sizes taken from
the layout, and a slot the caller checked against the capacity.
"""

from __future__ import annotations

import struct
from typing import Any

import numba
import numpy as np
import torch

from rbdata._core.layout import TENSOR, Layout
from rbdata._core.native import fence, voidptr
from rbdata.storages.memmap._header import HEADER_TERMS
from rbdata.storages.memmap._journal_format import (
    COMMITTED,
    JOURNAL_HEAD,
    Plan,
    payload_offsets,
)

__all__ = ["PackedRow", "crc32", "packable"]

# struct codes, standard sizes ("=") in native byte order, as numpy stores the files
_CODES = {
    torch.bool: "?",
    torch.uint8: "B",
    torch.int8: "b",
    torch.int16: "h",
    torch.uint16: "H",
    torch.int32: "i",
    torch.uint32: "I",
    torch.int64: "q",
    torch.uint64: "Q",
    torch.float16: "e",
    torch.float32: "f",
    torch.float64: "d",
}


def packable(layout: Layout) -> bool:
    """Whether every leaf of ``layout`` is at most 1-D, not empty, and has a ``struct`` code."""
    return bool(layout.leaves) and all(
        leaf.kind == TENSOR and len(leaf.shape) <= 1 and leaf.numel >= 1 and leaf.dtype in _CODES
        for leaf in layout.leaves
    )


def _format(layout: Layout) -> tuple[struct.Struct, list[int], int]:
    """The struct of a one-row journal payload, each leaf's offset in it, the payload's end."""
    sizes = [leaf.numel * leaf.dtype.itemsize for leaf in layout.leaves]
    offsets, end = payload_offsets(sizes, 1)
    parts, pos = ["="], JOURNAL_HEAD
    for leaf, start, nbytes in zip(layout.leaves, offsets, sizes, strict=True):
        if start > pos:
            parts.append(f"{start - pos}x")
        parts.append(f"{leaf.numel}{_CODES[leaf.dtype]}")
        pos = start + nbytes
    if end > pos:
        parts.append(f"{end - pos}x")
    fmt = struct.Struct("".join(parts))
    assert fmt.size == end - JOURNAL_HEAD, "the struct spans the payload exactly"
    return fmt, [start - JOURNAL_HEAD for start in offsets], end


def _crc_tables() -> np.ndarray:
    """Slicing-by-8 tables of the CRC-32 that zlib computes (reflected 0xEDB88320)."""
    tables = np.zeros((8, 256), dtype=np.int64)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        tables[0, i] = c
    for k in range(1, 8):
        prev = tables[k - 1]
        tables[k] = (prev >> 8) ^ tables[0][prev & 0xFF]
    return tables


_CRC = _crc_tables()
_K_LENGTH, _K_NEXT, _TERM0, _TERM1, _MASK = (np.uint64(v) for v in HEADER_TERMS)

# the table a kernel call reads: [journal base, payload end, header words, leaves, counter
# words, capacity, then per leaf (offset in the payload, file base address, bytes per row)]
_FIXED = 6
BAD_HEADER = -2
"""What the kernel returns when the header's ``active`` word is neither 0 nor 1."""


@numba.njit(cache=True)
def _nb_crc32(address: int, n: int) -> int:  # pragma: no cover
    p = numba.carray(voidptr(address), (n,), np.uint8)
    t = _CRC
    crc = 0xFFFFFFFF
    i = 0
    while i + 8 <= n:
        lo = crc ^ (
            np.int64(p[i])
            | (np.int64(p[i + 1]) << 8)
            | (np.int64(p[i + 2]) << 16)
            | (np.int64(p[i + 3]) << 24)
        )
        hi = (
            np.int64(p[i + 4])
            | (np.int64(p[i + 5]) << 8)
            | (np.int64(p[i + 6]) << 16)
            | (np.int64(p[i + 7]) << 24)
        )
        crc = (
            t[7, lo & 0xFF]
            ^ t[6, (lo >> 8) & 0xFF]
            ^ t[5, (lo >> 16) & 0xFF]
            ^ t[4, lo >> 24]
            ^ t[3, hi & 0xFF]
            ^ t[2, (hi >> 8) & 0xFF]
            ^ t[1, (hi >> 16) & 0xFF]
            ^ t[0, hi >> 24]
        )
        i += 8
    while i < n:
        crc = t[0, (crc ^ np.int64(p[i])) & 0xFF] ^ (crc >> 8)
        i += 1
    return crc ^ 0xFFFFFFFF


@numba.njit(cache=True)
def _nb_write_one(table_address: int, slot: int, stop: int) -> int:  # pragma: no cover
    # the caller guarantees: the table's addresses are mapped, 0 <= slot < capacity, the
    # journal holds no committed transaction and its payload holds the packed item
    head = numba.carray(voidptr(table_address), (_FIXED,), np.int64)
    table = numba.carray(voidptr(table_address), (_FIXED + 3 * head[3],), np.int64)
    words = numba.carray(voidptr(table[2]), (8,), np.int64)
    active = words[1]
    if active != 0 and active != 1:
        return BAD_HEADER
    length = words[2 + 3 * active]
    top = slot + 1
    new_length = top if top > length else length
    nxt = top if top < table[5] else 0
    end = table[1]
    q = numba.carray(voidptr(table[0]), (end // 8 + 2,), np.int64)
    journaled = slot < length  # an overwrite of a live slot: through the journal
    if journaled:
        q[5] = new_length
        q[6] = nxt
        q[end // 8] = slot
        q[end // 8 + 1] = top
        word = _nb_crc32(table[0] + 16, end) | COMMITTED
        fence()
        q[1] = word  # committed: replayed from here on
        fence()
        if stop == 1:
            return -1
    source = table[0] + JOURNAL_HEAD
    for k in range(head[3]):
        at = _FIXED + 3 * k
        nbytes = table[at + 2]
        src = numba.carray(voidptr(source + table[at]), (nbytes,), np.uint8)
        dst = numba.carray(voidptr(table[at + 1] + slot * nbytes), (nbytes,), np.uint8)
        for j in range(nbytes):
            dst[j] = src[j]
    fence()
    if stop == 2:
        return -1
    record = 1 - active
    base = 2 + 3 * record
    words[base] = new_length
    words[base + 1] = nxt
    term = _TERM0 if record == 0 else _TERM1
    check = ((np.uint64(new_length) * _K_LENGTH) ^ (np.uint64(nxt) * _K_NEXT) ^ term) & _MASK
    words[base + 2] = np.int64(check) if check else 1
    fence()
    words[1] = record  # published: one aligned 8-byte store
    if journaled:
        fence()
        q[1] = 0
    counter = numba.carray(voidptr(table[4]), (2,), np.int64)
    before = counter[1]
    counter[1] = before + 1
    return before


def crc32(data: np.ndarray) -> int:
    """The kernel's CRC-32 of a contiguous uint8 array (equal to ``zlib.crc32``; for tests)."""
    assert data.dtype == np.uint8 and data.flags.c_contiguous
    return int(_nb_crc32(data.ctypes.data, data.size))


class PackedRow:
    """The packed one-item write of a storage's layout, bound to its files and header.

    Build it with :meth:`for_storage` (``None`` where the layout is not :func:`packable` or
    numba is missing). It holds the data files' arrays, the counter and the bound journal
    mapping, so that every address in its table stays mapped while it lives; the header's
    stays mapped until the storage closes, which drops the row first.

    Args:
        layout: the storage's layout (:func:`packable`).
        read: the layout's flat item reader (``ItemUnpacker.unpack_flat``), kept as
            :attr:`read`: an item's values in one tuple for :meth:`write`, or ``None``.
        arrays: the numpy views of the data files, ``[capacity, *shape]`` per leaf.
        header_address: :meth:`Header.address` of the storage's header.
        counter: :meth:`SharedState.local_counter` of the storage.
    """

    def __init__(
        self,
        layout: Layout,
        read: Any,
        arrays: list[np.ndarray],
        header_address: int,
        counter: np.ndarray,
    ) -> None:
        self.read = read
        self.struct, offsets, self.end = _format(layout)
        self.arrays = arrays  # keeps the files mapped
        self.counter = counter  # keeps the count's memory alive
        self.capacity = arrays[0].shape[0]
        self.table = np.zeros(_FIXED + 3 * len(arrays), dtype=np.int64)
        self.table[1:_FIXED] = (
            self.end,
            header_address,
            len(arrays),
            counter.ctypes.data,
            self.capacity,
        )
        for k, (arr, leaf, offset) in enumerate(zip(arrays, layout.leaves, offsets, strict=True)):
            nbytes = leaf.numel * leaf.dtype.itemsize
            if (
                not arr.flags.c_contiguous
                or not arr.flags.writeable
                or arr.shape != (self.capacity, *leaf.shape)
                or arr.itemsize * leaf.numel != nbytes
            ):
                raise ValueError(f"leaf {leaf.name}: its file view is not a writable row array")
            self.table[_FIXED + 3 * k : _FIXED + 3 * k + 3] = offset, arr.ctypes.data, nbytes
        if counter.dtype != np.int64 or counter.size < 2 or not counter.flags.writeable:
            raise ValueError("counter: not the int64 words of a process-local state")
        self.address = int(self.table.ctypes.data)
        self.mapping: Any = None  # the journal mapping bound (see bind)
        self._payload: np.ndarray | None = None

    @classmethod
    def for_storage(
        cls,
        layout: Layout,
        read: Any,
        arrays: list[np.ndarray] | None,
        header_address: int,
        counter: np.ndarray | None,
    ) -> PackedRow | None:
        """A packed row for a storage's layout, or ``None`` where it cannot pack.

        ``None``: no flat reader, a layout that is not :func:`packable`, no numpy views of
        the files, or a counter that is not process-local (a shared storage).
        """
        if read is None or arrays is None or counter is None or not packable(layout):
            return None
        return cls(layout, read, arrays, header_address, counter)

    def bind(self, mapping: Any, plan: Plan) -> None:
        """Write through ``mapping`` (the journal's), whose one-row transaction is ``plan``."""
        view = np.frombuffer(mapping, dtype=np.uint8)
        base = int(view.ctypes.data)
        starts = [int(v.ctypes.data) for v in plan.first]
        if (
            plan.rows != 1
            or plan.end != self.end
            or view.size < self.end + 16
            or starts != [base + JOURNAL_HEAD + int(o) for o in self.table[_FIXED::3]]
        ):
            raise AssertionError("the journal's one-row plan differs from the packed layout")
        self._payload = view
        self.table[0] = base
        self.mapping = mapping

    def write(self, flat: Any, slot: int, stop: int = 0) -> int:
        """Write one item at ``slot`` (``bind`` first; journal empty); the count before it.

        The item's values go to the journal's payload (scratch until a commit word is
        stored); the kernel journals them if ``slot`` is live, then writes the files, the
        header and the count. ``stop`` (tests): 1 returns once committed, 2 once the rows
        are in the files (as a kill there would leave them), both returning -1.

        Raises:
            ValueError: the header's ``active`` word is corrupt (nothing was written).
        """
        self.struct.pack_into(self._payload, JOURNAL_HEAD, *flat)  # type: ignore[arg-type]
        before: int = _nb_write_one(self.address, slot, stop)
        if before == BAD_HEADER:
            raise ValueError("header.bin: field 'active' is neither 0 nor 1; corrupt")
        return before
