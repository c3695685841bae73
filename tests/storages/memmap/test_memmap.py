"""MemmapStorage: lifecycle, reopen after restart or crash, corruption, cross-process writes."""

from __future__ import annotations

import gc
import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from _child import run_child
from _paths import TEST_PATHS
from storage_contract import assert_rows_are, ring_model, transitions
from torch.utils.data import DataLoader

from rbdata import ReplayBuffer
from rbdata.storages import MemmapStorage


def test_temporary_directory_removed_on_close_and_gc() -> None:
    storage = MemmapStorage(8)
    storage.set(slice(0, 2), transitions(2))
    path = storage.path
    assert path.is_dir()
    storage.close()
    assert not path.exists()
    other = MemmapStorage(8)
    other.set(slice(0, 2), transitions(2))
    path = other.path
    del other
    gc.collect()
    assert not path.exists()


def test_explicit_path_is_kept_and_reopened(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    storage = MemmapStorage(16, path=path)
    rb = ReplayBuffer(storage)
    rb.extend(transitions(5))
    rb.extend(transitions(4, 5))
    storage.close()
    assert (path / "layout.json").is_file()
    reopened = MemmapStorage.open(path)
    assert len(reopened) == 9 and reopened.capacity == 16
    assert_rows_are(reopened[list(range(9))], list(range(9)))
    reopened.set(slice(9, 11), transitions(2, 9))  # read/write
    assert len(MemmapStorage.open(path)) == 11


def test_buffer_over_reopened_storage_continues_the_ring(tmp_path: Path) -> None:
    rb = ReplayBuffer(MemmapStorage(10, path=tmp_path / "rb"))
    rb.extend(transitions(8))
    rb.extend(transitions(5, 8))  # wraps: the next slot is 3
    rb.storage.close()  # type: ignore[attr-defined]
    again = ReplayBuffer(MemmapStorage.open(tmp_path / "rb"))
    assert again.extend(transitions(2, 13)).tolist() == [3, 4]
    slots, _ = ring_model(10, [8, 5, 2])
    assert_rows_are(again.storage[list(range(10))], slots)  # type: ignore[arg-type]


def test_explicit_path_with_data_is_refused(tmp_path: Path) -> None:
    MemmapStorage(4, path=tmp_path / "rb").set(0, torch.zeros(2))
    with pytest.raises(
        FileExistsError, match=r"already holds data; reopen it with MemmapStorage\.open"
    ):
        MemmapStorage(4, path=tmp_path / "rb")


def test_open_refuses_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a MemmapStorage"):
        MemmapStorage.open(tmp_path / "nothing")
    storage = MemmapStorage(100, path=tmp_path / "rb")
    storage.set(slice(0, 3), transitions(3))
    storage.close()
    leaf = next(p for p in (tmp_path / "rb").iterdir() if "observation" in p.name)
    size = leaf.stat().st_size
    with open(leaf, "r+b") as f:
        f.truncate(size - 4)
    with pytest.raises(ValueError, match=rf"{size - 4} bytes on disk, expected {size} .*truncated"):
        MemmapStorage.open(tmp_path / "rb")
    (tmp_path / "rb" / "layout.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt metadata file"):
        MemmapStorage.open(tmp_path / "rb")
    (tmp_path / "rb" / "layout.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match=r"not an rbdata\.memmap directory"):
        MemmapStorage.open(tmp_path / "rb")


def test_pickle_sends_the_path_not_the_data() -> None:
    storage = MemmapStorage(100_000)
    storage.set(slice(0, 100_000), transitions(100_000))
    payload = pickle.dumps(storage)
    assert len(payload) < 1_000  # the data is ~4 MB
    clone = pickle.loads(payload)
    assert_rows_are(clone[[99_999, 0]], [99_999, 0])
    storage.close()


def test_writes_in_child_process_visible_in_parent(tmp_path: Path) -> None:
    storage = MemmapStorage(50)
    storage.set(slice(0, 10), transitions(10))
    blob = tmp_path / "storage.pkl"
    blob.write_bytes(pickle.dumps(storage))
    result = run_child(
        f"""
        import pickle, sys
        sys.path[:0] = {TEST_PATHS!r}
        from storage_contract import transitions
        storage = pickle.loads(open({str(blob)!r}, "rb").read())
        storage.set(slice(10, 30), transitions(20, 10))
        """
    )
    assert result.returncode == 0, result.stderr
    assert len(storage) == 30
    assert_rows_are(storage[list(range(30))], list(range(30)))
    assert storage.path.exists()  # the child did not remove the parent's temporary directory
    storage.close()


def test_extends_that_returned_survive_a_killed_writer(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    result = run_child(
        f"""
        import os, signal, sys
        sys.path[:0] = {TEST_PATHS!r}
        from storage_contract import transitions
        from rbdata import ReplayBuffer
        from rbdata.storages import MemmapStorage
        rb = ReplayBuffer(MemmapStorage(1000, path={str(path)!r}))
        start = 0
        for size in (10, 200, 33, 1, 150):
            rb.extend(transitions(size, start))
            start += size
        rb.add(transitions(1, start)[0])
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert result.returncode == -9, result.stderr
    reopened = MemmapStorage.open(path)
    assert len(reopened) == 395
    assert_rows_are(reopened[list(range(395))], list(range(395)))


def test_dataloader_workers_with_spawn() -> None:
    storage = MemmapStorage(64)
    storage.set(slice(0, 64), transitions(64))
    loader = DataLoader(
        storage, batch_size=16, shuffle=True, num_workers=1, multiprocessing_context="spawn"
    )
    seen = sorted(i for batch in loader for i in batch["id"].tolist())
    assert seen == list(range(64))
    storage.close()


def test_first_write_in_child_is_seen_by_parent(tmp_path: Path) -> None:
    storage = MemmapStorage(20, path=tmp_path / "rb")
    blob = tmp_path / "storage.pkl"
    blob.write_bytes(pickle.dumps(storage))
    result = run_child(
        f"""
        import pickle, torch
        storage = pickle.loads(open({str(blob)!r}, "rb").read())
        storage.set(slice(0, 3), torch.arange(6.0).view(3, 2))
        """
    )
    assert result.returncode == 0, result.stderr
    assert len(storage) == 3
    torch.testing.assert_close(storage[2], torch.tensor([4.0, 5.0]))
    assert os.path.exists(tmp_path / "rb")


def test_read_only_open_refuses_every_write_and_pickles_its_path(tmp_path: Path) -> None:
    """What a dataset entry opens (issue 34, item 8): no write, and workers map the files."""
    from multiprocessing.reduction import ForkingPickler

    from rbdata.errors import ReadOnlyError

    storage = MemmapStorage(4096, path=tmp_path / "rb")
    data = torch.arange(4096 * 64, dtype=torch.float32).view(4096, 64)
    storage.set(slice(0, 4096), data)  # 1 MiB
    storage.close()
    files = {p.name: p.read_bytes() for p in (tmp_path / "rb").iterdir()}
    ro = MemmapStorage.open(tmp_path / "rb", read_only=True)
    assert torch.equal(ro[torch.arange(4096)], data)
    rb = ReplayBuffer(ro)
    for write in (
        lambda: ro.set(0, torch.zeros(64)),
        lambda: ro.set([1, 2], torch.zeros(2, 64)),
        lambda: rb.add(torch.zeros(64)),
        lambda: rb.extend(torch.zeros(3, 64)),
        ro.clear,
        lambda: ro.copy_from(ro),
    ):
        with pytest.raises(ReadOnlyError, match="read_only=True"):
            write()
    assert torch.equal(ro[torch.arange(4096)], data) and len(ro) == 4096
    for dumps in (pickle.dumps, ForkingPickler.dumps):
        wire = dumps(ro)
        assert len(wire) < 4096  # the path, not the 1 MiB of rows
        copy = pickle.loads(wire)
        assert torch.equal(copy[torch.arange(4096)], data)
        with pytest.raises(ReadOnlyError):
            copy.set(0, torch.zeros(64))
        copy.close()
    ro.close()
    assert {p.name: p.read_bytes() for p in (tmp_path / "rb").iterdir()} == files
