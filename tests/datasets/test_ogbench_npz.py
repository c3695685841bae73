"""The streaming ``.npz`` reader: chunks equal numpy's whole-array read, malformed and corrupt
archives fail with a ``ValueError`` naming the file, and memory is bounded by a block."""

from __future__ import annotations

import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from rbdata.datasets import OGBench
from rbdata.datasets._build import NpzArchive
from rbdata.datasets.ogbench import convert_ogbench
from rbdata.storages import MemmapStorage
from tests._ogbench_files import reference_rows, write_ogbench_file


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunks_equal_numpys_whole_read(tmp_path: Path, save, chunk: int) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "f": rng.standard_normal((100, 3, 2)).astype(np.float32),
        "b": rng.random(100) < 0.5,
        "u": rng.integers(0, 256, (100, 4), dtype=np.uint8),
        "be": rng.standard_normal(100).astype(">f8"),
        "fortran1d": np.asfortranarray(rng.standard_normal(100)),
        "empty_rows": np.zeros((100, 0), np.int32),
    }
    save(tmp_path / "a.npz", **arrays)
    with NpzArchive(tmp_path / "a.npz") as npz, np.load(tmp_path / "a.npz") as ref:
        assert set(npz.members) == set(ref.files)
        for name in ref.files:
            stream = npz.open(name)
            parts = []
            while stream.remaining:
                parts.append(stream.read(chunk))
            stream.finish()
            stream.close()
            got = np.concatenate(parts)
            assert got.dtype == ref[name].dtype.newbyteorder("=") and got.dtype.isnative
            assert np.array_equal(got, ref[name]) and got.flags.writeable


def test_unread_rows_come_back_first(tmp_path: Path) -> None:
    np.savez_compressed(tmp_path / "a.npz", x=np.arange(10))
    with NpzArchive(tmp_path / "a.npz") as npz:
        stream = npz.open("x")
        head = stream.read(4)
        stream.unread(head[2:])
        assert stream.remaining == 8
        assert stream.read(1).tolist() == [2]  # fewer than pushed back
        assert stream.read(4).tolist() == [3, 4, 5, 6]
        with pytest.raises(ValueError, match="3 rows were not read"):
            stream.finish()
        assert stream.read(100).tolist() == [7, 8, 9] and stream.read(5).size == 0
        stream.finish()
        stream.close()


@pytest.mark.parametrize(
    ("write", "match"),
    [
        (lambda p: np.savez(p, x=np.array([{"a": 1}], dtype=object)), "never used"),
        (lambda p: np.savez(p, x=np.asfortranarray(np.zeros((3, 2)))), "Fortran-order"),
        (lambda p: np.savez(p, x=np.zeros(3, dtype=[("a", "i4")])), "not supported"),
        (lambda p: p.write_bytes(b"not a zip at all"), "not an .npz"),
        (lambda p: zipfile.ZipFile(p, "w").writestr("notes.txt", "hi"), "not an .npy"),
        (lambda p: zipfile.ZipFile(p, "w").writestr("x.npy", "garbage"), "not a .npy"),
    ],
    ids=["object", "fortran", "structured", "not-zip", "not-npy-name", "not-npy-data"],
)
def test_malformed_archives_are_refused(tmp_path: Path, write, match: str) -> None:
    file = tmp_path / "bad.npz"
    write(file)
    with pytest.raises(ValueError, match=match) as err, NpzArchive(file) as npz:
        for name in npz.members:
            npz.open(name).read(10)
    assert str(file) in str(err.value)


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        NpzArchive(tmp_path / "nope.npz")


def _positions(size: int, count: int) -> list[int]:
    return sorted({int(x) for x in np.linspace(0, size - 1, count)})


@pytest.mark.parametrize("compressed", [True, False], ids=["deflate", "stored"])
def test_truncated_and_corrupt_files_never_crash(tmp_path: Path, compressed: bool) -> None:
    """Every truncation and byte flip fails with a ValueError, or converts the exact rows."""
    good = tmp_path / "good.npz"
    arrays = write_ogbench_file(good, n=300, compressed=compressed)
    data = good.read_bytes()
    expected = reference_rows(arrays)
    outcomes = {"refused": 0, "exact": 0}
    cases = [data[:cut] for cut in _positions(len(data), 25)]
    for at in _positions(len(data), 60):
        flipped = bytearray(data)
        flipped[at] ^= 0xFF
        cases.append(bytes(flipped))
    for i, content in enumerate(cases):
        file = tmp_path / f"case{i}.npz"
        file.write_bytes(content)
        try:
            convert_ogbench(file, tmp_path / f"out{i}", progress=False)
        except ValueError as err:
            assert str(file) in str(err) or "rows" in str(err), err
            outcomes["refused"] += 1
            continue
        storage = MemmapStorage.open(tmp_path / f"out{i}")
        got = storage[torch.arange(len(storage))]
        assert len(storage) == len(expected)
        column = np.stack([row["observation",] for row in expected])
        assert np.array_equal(got["observation"].numpy(), column)  # a harmless byte only
        storage.close()
        outcomes["exact"] += 1
    assert outcomes["refused"] >= 70, outcomes


def test_a_corrupt_file_caches_nothing(tmp_path: Path) -> None:
    file = tmp_path / "x.npz"
    write_ogbench_file(file, n=300)
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the deflated observations
    file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"corrupt|truncated|CRC"):
        OGBench("scene-play-v0", tmp_path / "home", file=file, progress=False)
    assert not (tmp_path / "home" / "ogbench").exists()


def test_memory_is_bounded_by_a_block(tmp_path: Path) -> None:
    """Converting a 40 MB (uncompressed) file holds about one block, not the file."""
    file = tmp_path / "big.npz"
    n = 200_000
    rng = np.random.default_rng(0)
    terminals = np.zeros(n, bool)
    terminals[999::1000] = True
    np.savez_compressed(
        file,
        observations=rng.standard_normal((n, 40)).astype(np.float32),
        actions=np.zeros((n, 8), np.float32),
        terminals=terminals,
        qpos=np.zeros((n, 2), np.float32),
    )
    tracemalloc.start()
    try:
        info = convert_ogbench(file, tmp_path / "out", rows=2048, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info["transitions"] == n and info["episodes"] == 200
    block = 2048 * (40 * 4 * 2 + 8 * 4 + 1 + 2 * 4 + 8 + 2)  # the rows of one block
    assert peak < 6 * block + (4 << 20), (peak, block)  # vs ~40 MB for the whole file
