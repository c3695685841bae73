"""Files swapped between checkpoints or storages are refused by default (issue 34, item 5).

Two checkpoints "of the same shape" (same classes, capacity and keys, other data) are written;
one file, the whole ``storage/`` folder, or the whole ``ckpt-*`` directory of one is moved into
the other. Every swap is caught by a default ``loads`` (the ids, O(1)), and by ``verify=True``.
The data leaves are larger than the 64 KiB up to which a default load also checksums a file,
so it is the id trailer, not a checksum, that refuses a swapped leaf.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rbdata import ArrowStorage, MemmapStorage, PrioritizedSampler, ReplayBuffer
from rbdata.errors import CheckpointError

CAP = 100
WIDTH = 200  # 800 bytes a row: an 80 KB leaf, past the 64 KiB checked by default


def _batch(n: int, seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {"obs": torch.randn(n, WIDTH, generator=g), "id": torch.arange(n) + 1000 * seed},
        batch_size=[n],
    )


def _dump(path: Path, n: int, seed: int) -> Path:
    rb = ReplayBuffer(MemmapStorage(CAP), PrioritizedSampler(CAP, 0.7, 0.5), batch_size=8)
    rb.extend(_batch(n, seed))
    g = torch.Generator().manual_seed(seed)
    rb.update_priority(torch.arange(n), torch.rand(n, generator=g) + 0.1)
    rb.dumps(path)
    rb.storage.close()
    return path


def _live(path: Path) -> Path:
    return path / (path / "CURRENT").read_text().strip()


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return _dump(tmp_path / "a", 60, 1), _dump(tmp_path / "b", 70, 2)


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name(a.name + ".swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def _leaf(path: Path) -> Path:
    return next((_live(path) / "storage").glob("*-obs.bin"))


SWAPS = {
    # verify=True's checksum pass finds the leaf before open reads its trailer
    "000-obs.bin": (_leaf, "000-obs.bin: (belongs to another storage|checksum mismatch)"),
    "header.bin": (lambda p: _live(p) / "storage" / "header.bin", "header.bin: checksum"),
    "tensors.bin": (lambda p: _live(p) / "tensors.bin", "tensors.bin"),
    "checkpoint.json": (lambda p: _live(p) / "checkpoint.json", "another checkpoint's"),
    "storage/": (lambda p: _live(p) / "storage", "another checkpoint"),
}


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("name", list(SWAPS))
def test_a_file_swapped_between_checkpoints_is_refused(
    pair: tuple[Path, Path], name: str, verify: bool
) -> None:
    a, b = pair
    which, message = SWAPS[name]
    assert len(ReplayBuffer.loads(a)) == 60 and len(ReplayBuffer.loads(b)) == 70
    _swap(which(a), which(b))
    for path in (a, b):
        with pytest.raises(CheckpointError, match=message):
            ReplayBuffer.loads(path, verify=verify)


@pytest.mark.parametrize("verify", [False, True])
def test_a_ckpt_directory_replaced_by_another_checkpoints_is_refused(
    pair: tuple[Path, Path], verify: bool
) -> None:
    a, b = pair
    name = _live(a).name
    shutil.rmtree(_live(a))
    shutil.copytree(_live(b), a / name)  # b's checkpoint under a's live name
    assert len(ReplayBuffer.loads(b)) == 70
    with pytest.raises(CheckpointError, match="replaced by another checkpoint"):
        ReplayBuffer.loads(a, verify=verify)


def test_an_untouched_checkpoint_loads_and_ids_name_its_directory(pair: tuple[Path, Path]) -> None:
    a, _ = pair
    meta = json.loads((_live(a) / "checkpoint.json").read_text())
    assert _live(a).name == f"ckpt-{meta['id']}" and len(meta["id"]) == 32
    layout = json.loads((_live(a) / "storage" / "layout.json").read_text())
    assert meta["storage"]["state"]["id"] == layout["id"] != meta["id"]
    rb = ReplayBuffer.loads(a, verify=True)
    assert torch.equal(rb.storage[:]["id"], torch.arange(60) + 1000)


def test_a_damaged_small_file_is_refused_by_default(pair: tuple[Path, Path]) -> None:
    """header.bin and layout.json (at most 64 KiB) are checksummed at every load."""
    a, _ = pair
    layout = _live(a) / "storage" / "layout.json"
    text = layout.read_text()
    layout.write_text(text.replace('"capacity": 100', '"capacity": 100 '))  # one more byte
    with pytest.raises(CheckpointError, match=r"layout\.json: .*bytes"):
        ReplayBuffer.loads(a)
    layout.write_text(text.replace('"obs"', '"obt"'))  # same size, still valid JSON
    with pytest.raises(CheckpointError, match=r"layout\.json: checksum"):
        ReplayBuffer.loads(a)


def test_a_flipped_row_byte_in_a_large_leaf_needs_verify(pair: tuple[Path, Path]) -> None:
    """The documented limit: a byte inside row data is caught only by the checksum pass."""
    a, _ = pair
    leaf = _leaf(a)
    data = bytearray(leaf.read_bytes())
    data[3] ^= 0x40
    leaf.write_bytes(bytes(data))
    assert len(ReplayBuffer.loads(a)) == 60  # O(1) load: not read
    with pytest.raises(CheckpointError, match=rf"{leaf.name}: checksum"):
        ReplayBuffer.loads(a, verify=True)


# --- MemmapStorage directories on their own ---------------------------------------------------
def _storage(path: Path, seed: int) -> Path:
    storage = MemmapStorage(CAP, path=path)
    storage.set(slice(0, 10), _batch(10, seed))
    storage.close()
    return path


def test_a_data_file_swapped_between_storage_directories_is_refused(tmp_path: Path) -> None:
    a, b = _storage(tmp_path / "a", 1), _storage(tmp_path / "b", 2)
    _swap(next(a.glob("*-obs.bin")), next(b.glob("*-obs.bin")))
    for path in (a, b):
        with pytest.raises(ValueError, match=r"-obs\.bin: belongs to another storage"):
            MemmapStorage.open(path)
        with pytest.raises(ValueError, match="belongs to another storage"):
            MemmapStorage.open(path, copy_on_write=True)


@pytest.mark.parametrize("read_only", [False, True])
def test_a_header_swapped_between_storage_directories_is_refused(
    tmp_path: Path, read_only: bool
) -> None:
    a, b = _storage(tmp_path / "a", 1), _storage(tmp_path / "b", 2)
    _swap(a / "header.bin", b / "header.bin")  # same length and next: only the id differs
    for path in (a, b):
        with pytest.raises(ValueError, match=r"header\.bin: belongs to another storage"):
            MemmapStorage.open(path, read_only=read_only)
    _swap(a / "header.bin", b / "header.bin")  # back: both open again
    assert (
        MemmapStorage.open(a, read_only=True)[9]["id"].item()
        != MemmapStorage.open(b, read_only=True)[9]["id"].item()
    )


def test_leaf_files_renamed_within_a_storage_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    storage = MemmapStorage(CAP, path=path)
    storage.set(slice(0, 10), TensorDict({"x": torch.ones(10), "y": torch.zeros(10)}, [10]))
    storage.close()
    _swap(next(path.glob("*-x.bin")), next(path.glob("*-y.bin")))  # same size
    with pytest.raises(ValueError, match="holds leaf 1 of this storage"):
        MemmapStorage.open(path)


def test_a_version_1_directory_without_ids_still_opens(tmp_path: Path) -> None:
    path = _storage(tmp_path / "old", 3)
    meta = json.loads((path / "layout.json").read_text())
    del meta["id"]
    meta["version"] = 1
    (path / "layout.json").write_text(json.dumps(meta))
    for leaf in [*path.glob("*-*.bin"), path / "header.bin"]:
        with open(leaf, "r+b") as f:
            f.truncate(leaf.stat().st_size - 32)  # the format before trailers
    storage = MemmapStorage.open(path)
    assert torch.equal(storage[:]["id"], torch.arange(10) + 3000)
    storage.set(slice(10, 12), _batch(2, 4))  # and writes without adding trailers
    storage.close()
    assert MemmapStorage.open(path, copy_on_write=True)[11]["id"].item() == 4001


# --- ArrowStorage checkpoints: large chunks, bound by the tail checksum ---------------------
def _dump_arrow(path: Path, seed: int) -> Path:
    rb = ReplayBuffer(ArrowStorage(CAP, chunk_size=32))
    g = torch.Generator().manual_seed(seed)
    rb.extend(TensorDict({"obs": torch.randn(60, 2000, generator=g)}, [60]))  # 256 KB chunks
    rb.dumps(path)
    return path


@pytest.mark.parametrize("name", ["storage", "storage/chunk-000000.arrow"])
def test_arrow_storage_or_chunk_swapped_between_checkpoints_is_refused(
    tmp_path: Path, name: str
) -> None:
    a, b = _dump_arrow(tmp_path / "a", 1), _dump_arrow(tmp_path / "b", 2)
    assert (_live(a) / "storage" / "chunk-000000.arrow").stat().st_size > 1 << 16
    _swap(_live(a) / name, _live(b) / name)
    for path in (a, b):
        with pytest.raises(CheckpointError, match=r"chunk-000000\.arrow: the checksum of its last"):
            ReplayBuffer.loads(path)
