"""CRC-32 checksums of files and tensors, computed while writing (checkpoints, dumps).

A checksum entry is ``{"size": bytes, "covered": leading bytes summed, "crc32": crc}``
(see :mod:`!rbdata.checkpoint._checksum` for how checkpoints record and verify them).
CRC-32 (zlib) runs at several GB/s and releases the GIL, so it can run in threads while the
files are written.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from rbdata._files import open_nofollow

__all__ = [
    "ALGORITHM",
    "copy_with_crc",
    "crc_blocks",
    "crc_of_open",
    "entry",
    "file_entry",
    "tensor_crc",
]

ALGORITHM = "crc32"
_BLOCK = 1 << 22


def crc_blocks(blocks: Iterable[Any], crc: int = 0) -> int:
    """The CRC-32 of the concatenated byte blocks (anything with the buffer protocol)."""
    for block in blocks:
        crc = zlib.crc32(block, crc)
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
        crc = zlib.crc32(flat.view(torch.uint8).numpy().data, crc)
    return crc


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
        crc = zlib.crc32(block, crc)
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
            crc = zlib.crc32(view[:got], crc)
            fout.write(view[:got])
            size += got
        if fsync:
            fout.flush()
            os.fsync(fout.fileno())
    return entry(size, size, crc)
