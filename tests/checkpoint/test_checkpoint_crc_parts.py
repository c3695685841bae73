"""The checksums of a checkpoint computed in parts (crc32_combine) equal zlib's whole CRC."""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rbdata._core.checksum import crc32
from rbdata.checkpoint._checksum import crc32_combine, submit_tensor_crc, tensor_crc


@pytest.mark.parametrize(
    ("la", "lb"), [(0, 0), (0, 5), (5, 0), (1, 1), (100, 12345), (7, 1 << 16), (3, (1 << 16) + 17)]
)
def test_crc32_combine_matches_zlib(la: int, lb: int) -> None:
    a, b = os.urandom(la), os.urandom(lb)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), lb) == zlib.crc32(a + b)


@pytest.mark.parametrize("n", [0, 1, 5, 123, 1003])
@pytest.mark.parametrize("part", [7, 64, 1000, 1 << 23])
def test_submit_tensor_crc_in_parts(n: int, part: int) -> None:
    t = torch.randn(1003, 17)
    with ThreadPoolExecutor(max_workers=2) as pool:
        assert submit_tensor_crc(pool, t, n, part)() == tensor_crc(t, n)


def test_submit_tensor_crc_other_tensors() -> None:
    flags = torch.zeros(10, 3, dtype=torch.bool)
    flags[::3] = True
    strided = torch.arange(40.0).view(10, 4)[:, ::2]  # not contiguous: one job
    empty = torch.zeros(6, 0)
    with ThreadPoolExecutor(max_workers=2) as pool:
        assert submit_tensor_crc(pool, flags, 10, 4)() == tensor_crc(flags, 10)
        assert submit_tensor_crc(pool, strided, 10, 8)() == tensor_crc(strided, 10)
        assert submit_tensor_crc(pool, empty, 6, 8)() == tensor_crc(empty, 6) == 0


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 4095, 1 << 16, (1 << 20) + 3])
@pytest.mark.parametrize("seed", [0, 0xFFFFFFFF, 0x1234ABCD])
def test_crc32_is_zlibs(size: int, seed: int) -> None:
    """The accelerated CRC-32 (ISA-L when installed) gives zlib's value, continued or not."""
    data = os.urandom(size)
    assert crc32(data, seed) == zlib.crc32(data, seed)
    cut = size // 3
    assert crc32(data[cut:], crc32(data[:cut])) == zlib.crc32(data)
    t = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if size
        else torch.zeros(0, dtype=torch.uint8)
    )
    assert tensor_crc(t, size) == zlib.crc32(data)
