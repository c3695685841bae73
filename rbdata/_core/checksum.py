"""CRC-32 checksums of files and tensors, computed while writing (checkpoints, dumps).

A checksum entry is ``{"size": bytes, "covered": leading bytes summed, "crc32": crc}``
(see :mod:`!rbdata.checkpoint._checksum` for how checkpoints record and verify them).
The CRC-32 is zlib's (the same value as :func:`zlib.crc32`), computed by ISA-L
(``isal``, at about 20 GB/s on one core) when it is installed and by zlib (about 4 GB/s)
otherwise. Both release the GIL, so the sums run in threads while the files are written.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import torch

from rbdata._core.files import open_nofollow

try:  # ISA-L's CRC-32: the same value as zlib's, about five times faster (a dependency)
    from isal.isal_zlib import crc32 as _fast_crc32
except ImportError:  # pragma: no cover - a platform without an isal wheel
    _fast_crc32 = zlib.crc32

__all__ = [
    "ALGORITHM",
    "copy_with_crc",
    "crc32",
    "crc32_combine",
    "crc_blocks",
    "crc_of_open",
    "entry",
    "file_entry",
    "submit_tensor_crc",
    "tensor_crc",
]

ALGORITHM = "crc32"
_BLOCK = 1 << 22
_PART = 1 << 23  # bytes per CRC job of a CPU leaf: the jobs of a pool end together
_POLY = 0xEDB88320  # CRC-32 (zlib), reflected


def _multmodp(a: int, b: int) -> int:
    """``a * b`` modulo the CRC-32 polynomial (reflected bit order, as zlib's ``multmodp``)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


_X2N = [1 << 30]  # x^(2^k) modulo the polynomial, k = 0..31 (zlib's x2n_table)
for _ in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``a + b`` from ``crc1 = crc32(a)``, ``crc2 = crc32(b)``, ``len(b)``.

    As zlib's ``crc32_combine`` (which Python's ``zlib`` does not expose).

    Examples:
        >>> a, b = b"hello ", b"world"
        >>> crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
        True
    """
    p, k, n = 1 << 31, 3, len2  # x^(8 * len2): the bits of len2, shifted by 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


def crc32(data: Any, crc: int = 0) -> int:
    """The CRC-32 of ``data`` (anything with the buffer protocol), continuing from ``crc``.

    The value of :func:`zlib.crc32`, computed by ISA-L when it is installed.

    Examples:
        >>> crc32(b"hello world") == zlib.crc32(b"hello world")
        True
        >>> crc32(b"world", crc32(b"hello ")) == zlib.crc32(b"hello world")
        True
    """
    return int(_fast_crc32(data, crc))


def crc_blocks(blocks: Iterable[Any], crc: int = 0) -> int:
    """The CRC-32 of the concatenated byte blocks (anything with the buffer protocol)."""
    for block in blocks:
        crc = crc32(block, crc)
    return crc


def entry(size: int, covered: int, crc: int) -> dict[str, int]:
    """One file's checksum entry."""
    return {"size": size, "covered": covered, ALGORITHM: crc}


def tensor_crc(buf: torch.Tensor, n: int) -> int:
    """The CRC-32 of the raw bytes of ``buf[:n]`` (what a storage leaf file starts with)."""
    rows = buf[:n].detach()
    step = n
    if rows.device.type != "cpu" and n:  # copied to the CPU a block at a time
        step = max(1, _BLOCK // max(1, rows[0].numel() * rows.element_size()))
    crc = 0
    for start in range(0, n, max(step, 1)):
        flat = rows[start : start + step].cpu().contiguous().reshape(-1)
        crc = crc32(flat.view(torch.uint8).numpy().data, crc)
    return crc


def submit_tensor_crc(
    pool: Executor, buf: torch.Tensor, n: int, part: int = _PART
) -> Callable[[], int]:
    """Submit :func:`tensor_crc` of ``buf[:n]`` to ``pool``; return a call that waits for it.

    The bytes of a contiguous CPU tensor are summed in parts of ``part`` bytes (jobs of
    about the same size, run in parallel and combined), anything else in one job.
    """
    rows = buf[:n].detach()
    if rows.device.type != "cpu" or not rows.is_contiguous() or not n:
        future = pool.submit(tensor_crc, buf, n)
        return future.result
    raw = rows.reshape(-1).view(torch.uint8).numpy()
    size = raw.nbytes
    jobs = [pool.submit(crc32, raw[at : at + part].data) for at in range(0, size, part)]

    def result() -> int:
        crc = 0
        for k, job in enumerate(jobs):
            crc = crc32_combine(crc, job.result(), min(part, size - k * part))
        return crc

    return result


def file_entry(path: Path, covered: int | None = None) -> dict[str, int]:
    """The checksum entry of a file already written (read back; for small files)."""
    with open_nofollow(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        covered = size if covered is None else covered
        return entry(size, covered, crc_of_open(f, covered))


def crc_of_open(f: Any, covered: int) -> int:
    crc, left = 0, covered
    while left > 0:
        block = f.read(min(_BLOCK, left))
        if not block:
            break
        crc = crc32(block, crc)
        left -= len(block)
    return crc


def copy_with_crc(src: Path, dst: Path, fsync: bool) -> dict[str, int]:
    """Copy ``src`` to the new file ``dst`` (no symlink followed); return ``dst``'s entry."""
    crc = size = 0
    buffer = bytearray(_BLOCK)
    view = memoryview(buffer)
    with open_nofollow(src, "rb") as fin, open_nofollow(dst, "xb") as fout:
        while True:
            got = fin.readinto(buffer)
            if not got:
                break
            crc = crc32(view[:got], crc)
            fout.write(view[:got])
            size += got
        if fsync:
            fout.flush()
            os.fsync(fout.fileno())
    return entry(size, size, crc)
