"""Per-slot versions: a read of a shared MemmapStorage never returns a row torn by a write."""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rbdata import MemmapStorage, ReplayBuffer
from rbdata.storages import WriteTarget
from rbdata.storages.memmap import _versions
from rbdata.storages.memmap._versions import SlotVersions, consistent_rows


def _codes(n: int, start: int, width: int = 9) -> TensorDict:
    """Rows whose every field holds the row's code: a torn row mixes two codes."""
    code = torch.arange(start, start + n, dtype=torch.float32).unsqueeze(1)
    return TensorDict(
        {"a": code.expand(n, width).clone(), "next": {"b": code.expand(n, width).clone()}}, [n]
    )


def _torn(batch: TensorDict) -> int:
    a, b = batch["a"], batch["next", "b"]
    whole = (a == a[:, :1]).all(1) & (b == a[:, :1]).all(1)
    return int((~whole).sum())


def test_marks_are_odd_during_a_write_and_even_after(tmp_path: Path) -> None:
    v = SlotVersions(tmp_path / "versions.bin", 10)
    assert v.words.tolist() == [0] * 10
    marked = v.begin(WriteTarget.of_runs([slice(2, 4)]))
    assert [int(w) & 1 for w in v.words] == [0, 0, 1, 1, 0, 0, 0, 0, 0, 0]
    v.end(marked)
    assert v.words.tolist() == [0, 0, 2, 2, 0, 0, 0, 0, 0, 0]
    marked = v.begin(WriteTarget.of_slots(torch.tensor([3, 3, 9])))  # duplicates: one mark each
    v.end(marked)
    assert v.words.tolist() == [0, 0, 2, 4, 0, 0, 0, 0, 0, 2]
    v.begin(WriteTarget.one(5))  # a writer killed between its marks leaves the slot odd...
    assert int(v.words[5]) == 1
    v.end(v.begin(WriteTarget.one(5)))  # ...and the next write of the slot makes it even again
    assert int(v.words[5]) == 2
    before = v.read(np.array([2, 5], dtype=np.int64))
    assert v.changed(np.array([2, 5], dtype=np.int64), before).tolist() == []
    v.end(v.begin(WriteTarget.one(2)))
    assert v.changed(np.array([2, 5], dtype=np.int64), before).tolist() == [0]
    stamp = v.stamp()  # even; raised by 2 per write, odd during one
    assert stamp % 2 == 0
    marked = v.begin(WriteTarget.one(4))
    assert v.stamp() == stamp + 1
    v.end(marked)
    assert v.stamp() == stamp + 2
    v.close()
    with pytest.raises(ValueError, match="expected 96"):  # another capacity: corrupt
        SlotVersions(tmp_path / "versions.bin", 11)


class _Racer:
    """A gather that a 'writer' overlaps: the first ``races`` gathers see torn rows."""

    def __init__(self, v: SlotVersions, table: torch.Tensor, races: int, odd: bool = False):
        self.v, self.table, self.races, self.odd, self.calls = v, table, races, odd, 0

    def __call__(self, idx: torch.Tensor) -> list[torch.Tensor]:
        self.calls += 1
        rows = [self.table[idx].clone(), self.table[idx].clone()]
        if self.races:
            self.races -= 1
            rows[1][idx == idx[0]] = -1  # the written slot's rows: half old, half new
            # the overlapping write of the first slot
            marked = self.v.begin(WriteTarget.of_slots(idx[:1]))
            if not self.odd:
                self.v.end(marked)
        return rows


def test_a_raced_row_is_read_again(tmp_path: Path) -> None:
    v = SlotVersions(tmp_path / "versions.bin", 8)
    table = torch.arange(8.0)
    racer = _Racer(v, table, races=3)
    idx = torch.tensor([5, 1, 5, 7])
    rows = consistent_rows(v, idx, racer, contextlib.nullcontext)
    # only slot 5 was marked: its two rows were re-read until no write overlapped
    assert rows[0].tolist() == rows[1].tolist() == [5.0, 1.0, 5.0, 7.0]
    assert racer.calls == 4  # the whole batch, then slot 5's rows until no write overlapped


def test_a_read_no_write_overlapped_is_one_gather(tmp_path: Path) -> None:
    v = SlotVersions(tmp_path / "versions.bin", 8)
    # earlier writes: nothing in progress now
    v.end(v.begin(WriteTarget.of_slots(torch.tensor([1, 2]))))
    table = torch.arange(8.0)
    calls = []

    def gather(idx: torch.Tensor) -> list[torch.Tensor]:
        calls.append(idx.tolist())
        return [table[idx].clone()]

    rows = consistent_rows(v, torch.tensor([2, 1, 7]), gather, contextlib.nullcontext)
    assert rows[0].tolist() == [2.0, 1.0, 7.0] and calls == [[2, 1, 7]]

    def gather_while_another_slot_is_written(idx: torch.Tensor) -> list[torch.Tensor]:
        if not calls[1:]:
            v.end(v.begin(WriteTarget.one(5)))  # a write of a slot this read does not touch
        return gather(idx)

    calls.clear()
    rows = consistent_rows(v, torch.tensor([2, 1]), gather_while_another_slot_is_written, None)  # type: ignore[arg-type]
    # the stamp moved: the per-slot check runs once, finds no overlapped row, no lock taken
    assert rows[0].tolist() == [2.0, 1.0] and calls == [[2, 1], [2, 1]]


def test_a_slot_left_odd_is_read_under_the_lock(tmp_path: Path) -> None:
    v = SlotVersions(tmp_path / "versions.bin", 8)
    table = torch.arange(8.0)
    v.begin(WriteTarget.one(3))  # a writer died between its marks: slot 3 stays odd
    taken = []

    @contextlib.contextmanager
    def lock() -> Iterator[None]:
        taken.append(True)
        yield

    calls = []

    def gather(idx: torch.Tensor) -> list[torch.Tensor]:
        calls.append(idx.tolist())
        return [table[idx].clone()]

    rows = consistent_rows(v, torch.tensor([0, 3, 6]), gather, lock)
    assert rows[0].tolist() == [0.0, 3.0, 6.0]
    assert taken == [True]  # once, after the lock-free tries
    assert calls[0] == [0, 3, 6] and all(c == [3] for c in calls[1:])
    assert len(calls) == 1 + _versions.TRIES + 1


def _overwrite(path: str, stop: Any, cap: int) -> None:
    torch.set_num_threads(1)
    storage = MemmapStorage.open(path)
    storage.share()
    rb = ReplayBuffer(storage=storage)
    start = cap + 1
    while not stop.is_set():
        rb.extend(_codes(500, start))
        start += 500
        rb.add(_codes(1, start)[0])  # the one-item path too
        start += 1


def test_no_torn_row_while_another_process_overwrites(tmp_path: Path) -> None:
    """A writer process overwrites a full ring; this process reads it, lock-free."""
    cap = 4000
    storage = MemmapStorage(cap, path=tmp_path / "ring")
    ReplayBuffer(storage=storage).extend(_codes(cap, 1))
    storage.share()
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    writer = ctx.Process(target=_overwrite, args=(str(storage.path), stop, cap))
    writer.start()
    try:
        first = storage.write_count
        deadline = time.monotonic() + 60
        while storage.write_count == first and time.monotonic() < deadline:
            time.sleep(0.01)  # the writer is writing
        gen = torch.Generator().manual_seed(0)
        rows = torn = 0
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            batch = storage[torch.randint(cap, (256,), generator=gen)]
            rows += 256
            torn += _torn(batch)
            item = storage[int(torch.randint(cap, (1,), generator=gen))]
            torn += _torn(item.unsqueeze(0))
        assert storage.write_count > first + 1000  # the reads raced many writes
    finally:
        stop.set()
        writer.join(60)
    assert writer.exitcode == 0
    assert torn == 0, f"{torn} torn rows of {rows}"
    storage.close()


def test_write_lock_nests_in_one_process(tmp_path: Path) -> None:
    storage = MemmapStorage(4, path=tmp_path / "s")
    storage.share()
    fd = os.open(tmp_path / "s" / "shared.bin", os.O_RDWR)  # another open file description

    def free() -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True

    try:
        with storage.write_lock():
            with storage.write_lock():
                assert not free()
            assert not free()  # the inner exit keeps the outer lock
        assert free()
    finally:
        os.close(fd)
        storage.close()
