"""Every way two processes reach one storage directory (issue 34, items 1 and 6).

``rbdata._core.holders``: a storage held by one process writes unshared; a second process that
opens its path joins the holders shared (they shared it: pickled, forked, ``share()``) or is
refused with a message that says how to share, and an ArrowStorage has one writer. The
two-process cases run real processes: a fresh interpreter that opens the path (a writer), and
``DataLoader`` workers forked from the test process (readers).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from _paths import TEST_PATHS, TESTS_DIR
from tensordict import TensorDict
from torch.utils.data import DataLoader

sys.path.insert(0, str(TESTS_DIR))
from _child import run_child

from rbdata import ArrowStorage, MemmapStorage, ReplayBuffer
from rbdata.errors import StorageInUseError

WIDE = 512  # floats per row: a row copy is long enough for a concurrent write to tear it


def rows(start: int, n: int) -> TensorDict:
    """``n`` rows whose every field is the row's stamp (``start``, ``start + 1``, ...)."""
    stamp = torch.arange(start, start + n)
    return TensorDict(
        {"a": stamp[:, None].float().expand(n, WIDE).clone(), "b": stamp}, batch_size=[n]
    )


def torn(batch: Any) -> int:
    """Rows of ``batch`` whose fields disagree (half one write, half another)."""
    a, b = batch["a"], batch["b"].float()
    return int(((a != b[:, None]).any(dim=1)).sum())


def readers(storage: Any, seed: int, n: int) -> Any:
    """An iterator of ``n`` random batches of 64 rows read by 2 ``DataLoader`` workers.

    The workers are forked: the fork shares the storage (parent and workers).
    """
    gen = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, 256, (64,), generator=gen).tolist() for _ in range(n)]
    loader = DataLoader(
        storage,
        batch_sampler=batches,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=lambda batch: batch,
    )
    return iter(loader)


def read_while(it: Any, thread: threading.Thread) -> tuple[int, int]:
    """Read batches from ``it`` while ``thread`` runs: (torn rows, rows read)."""
    bad = count = 0
    while thread.is_alive():
        try:
            batch = next(it)
        except StopIteration:
            break
        bad += torn(batch)
        count += batch["b"].numel()
    thread.join()
    return bad, count


def ids(storage: Any, slots: list[int]) -> list[int]:
    return storage[slots]["b"].tolist()


OPEN_ADD_CLOSE = """
import sys
from rbdata import MemmapStorage, ReplayBuffer
from rbdata.errors import StorageInUseError
sys.path[:0] = {tests!r}
from test_holders import rows
try:
    storage = MemmapStorage.open({path!r})
except StorageInUseError as err:
    print("REFUSED", err)
    raise SystemExit(0)
rb = ReplayBuffer(storage)
print("SLOTS", rb.extend(rows(100, 5)).tolist())
storage.close()
"""


def open_add_close(path: Path) -> str:
    tests = TEST_PATHS
    result = run_child(OPEN_ADD_CLOSE.format(tests=tests, path=str(path)))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


# --- MemmapStorage: one cursor rule, whoever holds it ------------------------------------
def test_a_second_process_cannot_open_a_storage_held_unshared(tmp_path: Path) -> None:
    storage = MemmapStorage(32, path=tmp_path / "rb")
    rb = ReplayBuffer(storage)
    rb.extend(rows(0, 10))
    out = open_add_close(tmp_path / "rb")
    assert out.startswith("REFUSED"), out
    assert f"process {os.getpid()}" in out and "storage.share()" in out
    assert len(storage) == 10 and storage.next_slot == 10  # nothing changed
    assert rb.extend(rows(10, 1)).tolist() == [10]
    storage.close()


def test_after_share_the_opener_joins_and_the_ring_goes_on_after_its_items(
    tmp_path: Path,
) -> None:
    storage = MemmapStorage(32, path=tmp_path / "rb")
    rb = ReplayBuffer(storage)
    rb.extend(rows(0, 10))
    storage.share()
    out = open_add_close(tmp_path / "rb")
    assert "SLOTS [10, 11, 12, 13, 14]" in out, out  # at the shared cursor
    assert rb.extend(rows(10, 1)).tolist() == [15]  # after them: nothing overwritten
    assert ids(storage, list(range(16))) == [*range(10), *range(100, 105), 10]
    assert len(rb) == 16
    storage.close()


def test_the_one_holder_is_unshared_again_once_the_others_are_gone(tmp_path: Path) -> None:
    storage = MemmapStorage(32, path=tmp_path / "rb")
    storage.share()
    storage.close()
    reopened = MemmapStorage.open(tmp_path / "rb")  # alone: its fastest path again
    assert not reopened.shared
    reopened.close()


def test_a_second_open_in_the_holding_process_shares_the_first(tmp_path: Path) -> None:
    first = MemmapStorage(32, path=tmp_path / "rb")
    rb1 = ReplayBuffer(first)
    rb1.extend(rows(0, 4))
    second = MemmapStorage.open(tmp_path / "rb")
    assert first.shared and second.shared
    rb2 = ReplayBuffer(second)
    assert rb2.extend(rows(4, 2)).tolist() == [4, 5]
    assert rb1.extend(rows(6, 1)).tolist() == [6]  # one ring: nothing overwritten
    assert ids(second, list(range(7))) == list(range(7))
    second.close()
    first.close()


WRITER = """
import sys, time
from rbdata import MemmapStorage, ReplayBuffer
sys.path[:0] = {tests!r}
from test_holders import rows
storage = MemmapStorage.open({path!r})
assert storage.shared, "joined a storage its holder shared"
rb = ReplayBuffer(storage)
stop, k = time.monotonic() + {seconds}, 1000
while time.monotonic() < stop:
    rb.extend(rows(k, 16))
    k += 16
print("WROTE", k - 1000)
storage.close()
"""


def test_dataloader_workers_read_no_torn_row_while_a_process_that_opened_the_path_writes(
    tmp_path: Path,
) -> None:
    """Item 1: the writer is another process that opened the path, not the shared object."""
    storage = MemmapStorage(256, path=tmp_path / "rb")
    ReplayBuffer(storage).extend(rows(0, 256))
    it = readers(storage, 0, 4000)
    first = next(it)
    assert storage.shared
    result: dict[str, Any] = {}
    tests = TEST_PATHS
    code = WRITER.format(tests=tests, path=str(tmp_path / "rb"), seconds=4.0)
    child = threading.Thread(target=lambda: result.update(run=run_child(code)))
    child.start()
    bad, count = read_while(it, child)
    bad += torn(first)
    run = result["run"]
    assert run.returncode == 0, run.stderr[-3000:]
    assert "WROTE" in run.stdout
    assert count > 0
    assert bad == 0, f"{bad} torn rows of {count}"
    del it
    storage.close()


# --- ArrowStorage: one writer process ----------------------------------------------------
OPEN_ARROW = """
from rbdata import ArrowStorage
from rbdata.errors import StorageInUseError
try:
    storage = ArrowStorage.open({path!r})
except StorageInUseError as err:
    print("REFUSED", err)
else:
    print("OPENED", len(storage))
    storage.close()
copy = ArrowStorage.open({path!r}, recover=False)  # a reading copy is always allowed
print("COPY", len(copy))
copy.close()
"""


def test_a_second_arrow_writer_is_refused_in_any_process(tmp_path: Path) -> None:
    storage = ArrowStorage(32, path=tmp_path / "rb", chunk_size=8)
    ReplayBuffer(storage).extend(rows(0, 10))
    storage.flush()
    result = run_child(OPEN_ARROW.format(path=str(tmp_path / "rb")))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "REFUSED" in result.stdout and "one writer process" in result.stdout
    assert "COPY 10" in result.stdout
    with pytest.raises(StorageInUseError, match="held by this process"):
        ArrowStorage.open(tmp_path / "rb")  # a second writer object here, too
    assert len(storage) == 10
    storage.close()
    result = run_child(OPEN_ARROW.format(path=str(tmp_path / "rb")))
    assert "OPENED 10" in result.stdout, result.stdout + result.stderr[-3000:]


def test_forked_readers_see_no_torn_row_while_the_arrow_owner_overwrites(
    tmp_path: Path,
) -> None:
    """Full chunks are written in place; once copies map them, they are rewritten instead."""
    storage = ArrowStorage(256, path=tmp_path / "rb", chunk_size=64)
    rb = ReplayBuffer(storage)
    rb.extend(rows(0, 256))
    storage.flush()
    it = readers(storage, 1, 3000)
    first = torn(next(it))

    def write() -> None:
        k = 1000
        stop = time.monotonic() + 3.0
        while time.monotonic() < stop:
            rb.extend(rows(k, 16))
            k += 16

    writer = threading.Thread(target=write)
    writer.start()
    bad, count = read_while(it, writer)
    bad += first
    assert count > 0
    assert bad == 0, f"{bad} torn rows of {count}"
    del it
    storage.close()
