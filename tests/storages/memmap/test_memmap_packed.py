"""The packed per-step ``add`` of a MemmapStorage (``rbdata/storages/_packed.py``).

A small layout's item is packed into the journal's payload by one ``struct`` call and written
by one numba kernel (journal head, commit word, rows, header, count). Checked here against
independent references: ``zlib.crc32`` for the commit word, the header decoder and
``Journal.read`` for what a replay sees, a TensorStorage written through the general path for
the contents. ``tests/storages/memmap/test_memmap_kill.py`` SIGKILLs real writers of such items.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rbdata import ReplayBuffer, TensorStorage
from rbdata._core.layout import Layout
from rbdata.storages import MemmapStorage
from rbdata.storages.memmap._header import decode_header
from rbdata.storages.memmap._packed import crc32, packable

CAP = 8


def item(k: int, tensordict: bool = False) -> Any:
    """Item ``k``: every leaf carries ``k`` (a CartPole-like transition)."""
    obs = np.full(4, k, dtype=np.float32)
    out = {
        "id": np.int64(k),
        "obs": obs,
        "next": {"reward": float(-k), "done": k % 3 == 0, "obs": obs + 0.5},
    }
    if not tensordict:
        return out
    return TensorDict(
        {
            "id": torch.tensor(k),
            "obs": torch.from_numpy(obs),
            "next": {
                "reward": torch.tensor(float(-k)),
                "done": torch.tensor(k % 3 == 0),
                "obs": torch.from_numpy(obs + 0.5),
            },
        },
        [],
    )


def ids_of(storage: Any) -> list[int]:
    items = storage[torch.arange(len(storage))]
    ids = items["id"]
    assert torch.equal(items["obs"], ids.float()[:, None].expand(-1, 4))  # leaves agree
    assert torch.equal(items["next", "obs"], items["obs"] + 0.5)
    assert torch.equal(items["next", "reward"], -ids.float())
    assert torch.equal(items["next", "done"], ids % 3 == 0)
    return ids.tolist()


def header_words(root: Path) -> tuple[int, int]:
    data = (root / "header.bin").read_bytes()
    return decode_header(np.frombuffer(data, dtype=np.int64).tolist(), root / "header.bin")


def test_the_kernel_crc_is_zlib_crc32() -> None:
    rng = np.random.default_rng(0)
    for n in [*range(0, 70), 383, 384, 1000, 4099]:
        data = rng.integers(0, 256, n, dtype=np.uint8)
        assert crc32(data) == zlib.crc32(data.tobytes()), n


def test_only_small_layouts_of_the_owning_process_are_packed(tmp_path: Path) -> None:
    def row(first: Any, **kw: Any) -> Any:
        storage = MemmapStorage(CAP, path=tmp_path / f"m{len(list(tmp_path.iterdir()))}", **kw)
        ReplayBuffer(storage).add(first)
        return storage

    assert row(item(1))._writes.row is not None
    assert row({"obs": np.zeros(9, np.float32)})._writes.row is None  # > 8 elements: numpy rows
    assert row({"img": np.zeros((2, 2), np.uint8)})._writes.row is None  # 2-D
    assert row({"z": np.zeros(2, np.complex64)})._writes.row is None  # no struct code
    assert packable(Layout.from_data(item(1), batched=False)) and not packable(
        Layout.from_data({"z": torch.zeros(2).cfloat()}, batched=False)
    )
    private = MemmapStorage.open(row(item(1)).path, copy_on_write=True)
    assert private._writes.row is None  # copy-on-write: its own numpy rows
    shared = row(item(1))
    shared.share()
    before = ids_of(shared)
    rb = ReplayBuffer(shared)
    assert rb.add(item(2)) == 1  # shared: the locked general path, still correct
    assert ids_of(shared) == [*before, 2]


@pytest.mark.parametrize("tensordict", [False, True])
def test_packed_adds_ring_like_a_tensor_storage(tmp_path: Path, tensordict: bool) -> None:
    mm = MemmapStorage(CAP, path=tmp_path / "st")
    rb, ref = ReplayBuffer(mm), ReplayBuffer(TensorStorage(CAP))
    for k in range(1, 3 * CAP + 4):  # fills, then overwrites around the ring three times
        slot = rb.add(item(k, tensordict))
        assert slot == ref.writer.add(ref.storage, item(k)) == (k - 1) % CAP
        ref.storage.set(slot, item(k))  # the general path, once more at the same slot
        assert mm._writes.row is not None
        assert mm.last_write == (k - 1, k) and mm.write_count == k
        assert (len(mm), mm.next_slot) == (len(ref.storage), ref.storage.next_slot)
        assert ids_of(mm) == ids_of(ref.storage)
        assert header_words(tmp_path / "st") == (len(mm), mm.next_slot)
    assert not mm._writes.journal.committed  # type: ignore[union-attr]
    mm.close()
    reopened = MemmapStorage.open(tmp_path / "st")
    assert ids_of(reopened) == ids_of(ref.storage)
    assert reopened.next_slot == ref.storage.next_slot
    reopened.close()


def full_ring(root: Path, cap: int = CAP) -> tuple[ReplayBuffer, MemmapStorage, list[int]]:
    storage = MemmapStorage(cap, path=root)
    rb = ReplayBuffer(storage)
    for k in range(cap + 1):  # the last one overwrites slot 0 through the journal
        rb.add(item(k))
    return rb, storage, ids_of(storage)


@pytest.mark.parametrize("stop", [1, 2])
def test_a_writer_killed_after_the_commit_is_replayed(tmp_path: Path, stop: int) -> None:
    """``stop`` 1: killed after the commit word; 2: after the rows reached the files."""
    root = tmp_path / "st"
    _, storage, ids = full_ring(root)
    journal = storage._writes.journal
    assert storage._writes.row is not None and journal is not None
    flat = storage._writes.row.read(item(100))  # type: ignore[union-attr]
    assert storage._writes.row.write(flat, 5, stop=stop) == -1
    assert journal.committed
    assert header_words(root) == (CAP, 1)  # not published yet
    # the CRC and every field check out (no view of the journal kept: it would hold the lock)
    kind, target, *counts = journal.read()[:5]
    assert (kind, target.runs, target.indices, *counts) == (0, [slice(5, 6)], None, 1, CAP, 6)
    storage.close()  # the process dies: nothing else happens
    reopened = MemmapStorage.open(root)
    ids[5] = 100
    assert ids_of(reopened) == ids and reopened.next_slot == 6
    assert ReplayBuffer(reopened).add(item(101)) == 6  # goes on from there
    assert ids_of(reopened)[6] == 101
    reopened.close()


def test_a_corrupt_active_word_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "st"
    _, storage, ids = full_ring(root)
    words = storage._header._words
    active = words[1]
    words[1] = 7  # as if something scribbled over header.bin
    flat = storage._writes.row.read(item(100))  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"header\.bin.*active"):
        storage._writes.row.write(flat, 3)  # type: ignore[union-attr]
    assert not storage._writes.journal.committed  # type: ignore[union-attr]
    words[1] = active
    assert ids_of(storage) == ids and header_words(root) == (CAP, 1)
    storage.close()


def test_a_grown_journal_is_rebound(tmp_path: Path) -> None:
    """A big extend grows (remaps) the journal: the next packed add writes the new mapping."""
    root = tmp_path / "st"
    rb, storage, _ = full_ring(root, cap=256)
    mapping = storage._writes.journal._mmap  # type: ignore[union-attr]
    batch = torch.stack([item(k, tensordict=True) for k in range(1000, 1200)])
    rb.extend(batch)  # 200 rows over live slots: a bigger journal
    assert storage._writes.journal._mmap is not mapping  # type: ignore[union-attr]
    rb.add(item(300))
    assert storage._writes.row.mapping is storage._writes.journal._mmap  # type: ignore[union-attr]
    ids = ids_of(storage)
    assert ids[201] == 300 and ids[1:201] == list(range(1000, 1200))
    storage.close()
    assert ids_of(MemmapStorage.open(root)) == ids


def test_a_pending_transaction_is_finished_before_a_packed_add(tmp_path: Path) -> None:
    root = tmp_path / "st"
    rb, storage, ids = full_ring(root)
    journal = storage._writes.journal
    assert journal is not None
    plan = journal.begin(0, [4, 5], 1, CAP, 1)  # committed, not applied (a raise between)
    values = {
        ("id",): 44,
        ("obs",): [44] * 4,
        ("next", "reward"): -44,
        ("next", "done"): False,
        ("next", "obs"): [44.5] * 4,
    }
    for leaf, row in zip(storage.layout.leaves, plan.first, strict=True):  # type: ignore[union-attr]
        row[...] = values[leaf.key]
    journal.commit(plan, 2)
    assert rb.add(item(9)) == 1
    ids[4], ids[1] = 44, 9
    assert ids_of(storage) == ids
    storage.close()
    assert ids_of(MemmapStorage.open(root)) == ids
