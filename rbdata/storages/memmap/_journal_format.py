"""``journal.bin`` of a :class:`~rbdata.storages.MemmapStorage`: its format.

``journal.bin`` holds at most one transaction: a 64-byte head ``magic, commit, kind, count,
rows, length, next, payload bytes``, the new rows of every leaf (each segment 64-byte aligned),
then the slots (``kind`` 0: ``count`` runs ``start, stop``; 1: ``count`` slot indices). The
``commit`` word (a CRC-32 of everything after it, with bit 62 set so that it is never 0) is
stored last; 0 means empty.

A journal of the unreleased rbdata 0.1.0 (magic ``RBDJRN01``, whose commit word is a sum of
the words) is not read: :func:`check_magic` refuses it with a ``ValueError`` that says so.
The journal itself (writing, committing, replaying a transaction) is ``_journal.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from rbdata._core.checksum import crc32
from rbdata.storages.memmap._header import LEGACY

__all__ = [
    "ALIGN",
    "COMMITTED",
    "JMAGIC",
    "JOURNAL_HEAD",
    "Plan",
    "aligned",
    "check_magic",
    "checksum",
    "payload_offsets",
]

JMAGIC = int.from_bytes(b"RBDJRN02", "little")  # commit word: a CRC-32
"""The magic word of a journal (its first 64-bit word)."""
_JMAGIC_LEGACY = int.from_bytes(b"RBDJRN01", "little")  # 0.1.0: not read
ALIGN = 64
"""Each leaf's segment of a payload starts at a multiple of this many bytes."""
COMMITTED = 1 << 62
"""Bit 62: set in every commit word of a journal (so a committed one is never 0)."""
JOURNAL_HEAD = 64
"""Bytes of the journal's head: the payload of a transaction starts there."""


class Plan(NamedTuple):
    """Where a transaction of some number of rows lies in the journal."""

    end: int  # end of the payload: the slots follow
    rows: int  # rows of every leaf
    tviews: list[torch.Tensor]  # one [rows, *shape] tensor per leaf
    nviews: list[np.ndarray | None]  # the same as numpy arrays (None: no numpy dtype)
    numpy: bool  # whether every leaf has a numpy view
    first: list[np.ndarray]  # numpy views of row 0 (when ``numpy``): the one-item path


def checksum(data: memoryview, stop: int) -> int:
    """The commit word: the CRC-32 of the 64-bit words ``[2, stop)``, with bit 62 set.

    zlib's CRC-32, computed by ISA-L (``crc32`` of ``rbdata._core.checksum``): about 3 us for
    the 164 kB of a 1000-row extend, where ``zlib.crc32`` takes about 39 us.
    """
    return crc32(data[16 : 8 * stop]) | COMMITTED


def check_magic(words: np.ndarray, path: Path) -> None:
    """Refuse a journal of another format (one created but killed before its magic is empty)."""
    magic = int(words[0])
    if magic == JMAGIC or (magic == 0 and not words[1]):
        return
    if magic == _JMAGIC_LEGACY:
        raise ValueError(
            f"{path}: a journal of the unreleased rbdata 0.1.0 (magic 'RBDJRN01'), {LEGACY}"
        )
    raise ValueError(f"{path}: not a MemmapStorage journal (bad magic); corrupt")


def aligned(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-n // ALIGN) * ALIGN


def payload_offsets(row_bytes: Sequence[int], rows: int) -> tuple[list[int], int]:
    """Where each leaf's ``rows`` rows start in a journal, and where the payload ends.

    Leaf segments follow the head in layout order, each 64-byte aligned.
    """
    offsets, end = [], JOURNAL_HEAD
    for nbytes in row_bytes:
        offsets.append(end)
        end = aligned(end + rows * nbytes)
    return offsets, end
