"""The redo journal of a MemmapStorage (``journal.bin``): a committed transaction left by a
writer that died is replayed at open (its commit word a CRC-32), a corrupt one or one of the
unreleased 0.1.0 format is a ``ValueError`` naming the journal, and the per-step paths
(``add``, small ``extend``) finish such a transaction before writing their own.

The transactions are laid out here through the journal's own API, as a writer killed between
its commit and its clear leaves them; ``tests/storages/memmap/test_memmap_kill.py`` kills real
writers.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rbdata import ReplayBuffer
from rbdata.storages import MemmapStorage
from rbdata.storages.memmap._journal import Journal

CAP = 8
JOURNAL = "journal.bin"


def item(k: int) -> dict[str, object]:
    """Item ``k``: every leaf carries ``k``."""
    return {"id": np.int64(k), "obs": np.full(3, k, np.float32), "next": {"r": float(-k)}}


def ids_of(storage: MemmapStorage) -> list[int]:
    items = storage[torch.arange(len(storage))]
    ids = items["id"]
    assert torch.equal(items["obs"], ids.float()[:, None].expand(-1, 3))  # leaves agree
    assert torch.equal(items["next", "r"], -ids.float())
    return ids.tolist()


def full_ring(root: Path) -> list[int]:
    """A closed storage directory: a full ring of items 0..7, then 8 added over slot 0."""
    rb = ReplayBuffer(MemmapStorage(CAP, path=root))
    for k in range(CAP + 1):
        rb.add(item(k))
    ids = ids_of(rb.storage)
    rb.storage.close()
    return ids


def leave_committed(root: Path, slot: int, k: int, legacy: bool = False) -> None:
    """Commit a one-item transaction (item ``k`` at ``slot``) and leave it, as a killed writer.

    ``legacy``: the format of the unreleased 0.1.0 (magic ``RBDJRN01``, the commit word the
    sum of the words mod 2**62, bit 62 set), which is refused.
    """
    storage = MemmapStorage.open(root)
    layout, length = storage.layout, len(storage)
    storage.close()
    assert layout is not None
    journal = Journal(root / JOURNAL, layout, CAP)
    plan = journal.begin(0, [slot, slot + 1], 1, length, (slot + 1) % CAP)
    values = {("id",): k, ("obs",): [k] * 3, ("next", "r"): -k}
    for leaf, row in zip(layout.leaves, plan.first, strict=True):
        row[...] = values[leaf.key]
    journal.commit(plan, 2)
    if legacy:
        stop = plan.end // 8 + 2
        with open(root / JOURNAL, "r+b") as f:
            words = struct.unpack(f"={stop}Q", f.read(8 * stop))
            f.seek(0)
            f.write(b"RBDJRN01")
            f.write(struct.pack("=Q", (sum(words[2:]) % 2**62) | 2**62))
    journal.close()


def magic(root: Path) -> bytes:
    return (root / JOURNAL).read_bytes()[:8]


def test_a_committed_transaction_is_replayed_at_open(tmp_path: Path) -> None:
    root = tmp_path / "st"
    before = full_ring(root)
    leave_committed(root, 3, 100)
    storage = MemmapStorage.open(root)
    expected = before.copy()
    expected[3] = 100
    assert ids_of(storage) == expected
    assert storage.next_slot == 4
    # the journal is empty again; the next overwrite goes through it
    ReplayBuffer(storage).add(item(200))
    storage.close()
    assert magic(root) == b"RBDJRN02"
    assert ids_of(MemmapStorage.open(root))[4] == 200


def test_the_commit_word_is_a_crc_of_the_transaction(tmp_path: Path) -> None:
    root = tmp_path / "st"
    full_ring(root)
    leave_committed(root, 5, 55)
    data = (root / JOURNAL).read_bytes()
    rows, payload = struct.unpack("=qq", data[32:40] + data[56:64])
    assert rows == 1
    stop = 64 + payload + 16  # the head, the payload, one run (start, stop)
    (commit,) = struct.unpack("=Q", data[8:16])
    assert commit == zlib.crc32(data[16:stop]) | 2**62


@pytest.mark.parametrize("where", ["payload", "slot", "length"])
def test_a_corrupt_committed_journal_is_refused(tmp_path: Path, where: str) -> None:
    root = tmp_path / "st"
    before = full_ring(root)
    leave_committed(root, 3, 100)
    data = bytearray((root / JOURNAL).read_bytes())
    payload = struct.unpack("=q", data[56:64])[0]
    offset = {"payload": 64 + 1, "slot": 64 + payload, "length": 40}[where]
    data[offset] ^= 0x01  # one bit: the slot 3 -> 2, the length 8 -> 9 (a range error first)
    (root / JOURNAL).write_bytes(bytes(data))
    message = "journal field 'length'" if where == "length" else "checksum mismatch"
    with pytest.raises(ValueError, match=rf"journal\.bin.*{message}"):
        MemmapStorage.open(root)
    # nothing was applied: the files still hold the items as they were
    (root / JOURNAL).unlink()
    assert ids_of(MemmapStorage.open(root)) == before


@pytest.mark.parametrize("committed", [True, False])
@pytest.mark.parametrize("copy_on_write", [False, True])
def test_a_journal_of_the_unreleased_format_is_refused(
    tmp_path: Path, committed: bool, copy_on_write: bool
) -> None:
    root = tmp_path / "st"
    before = full_ring(root)
    leave_committed(root, 3, 100, legacy=True)
    if not committed:
        data = bytearray((root / JOURNAL).read_bytes())
        data[8:16] = bytes(8)
        (root / JOURNAL).write_bytes(bytes(data))
    files = {p.name: p.read_bytes() for p in root.iterdir()}
    with pytest.raises(
        ValueError, match=r"journal\.bin: a journal of the unreleased rbdata 0\.1\.0"
    ):
        MemmapStorage.open(root, copy_on_write=copy_on_write)
    assert {p.name: p.read_bytes() for p in root.iterdir()} == files  # nothing changed
    (root / JOURNAL).unlink()
    assert ids_of(MemmapStorage.open(root)) == before


def test_a_journal_created_but_killed_before_its_magic_is_empty(tmp_path: Path) -> None:
    root = tmp_path / "st"
    before = full_ring(root)
    data = bytearray((root / JOURNAL).read_bytes())
    data[:16] = bytes(16)  # no magic, no commit word: the file was sized, then the writer died
    (root / JOURNAL).write_bytes(bytes(data))
    assert ids_of(MemmapStorage.open(root, copy_on_write=True)) == before
    storage = MemmapStorage.open(root)
    assert ids_of(storage) == before
    ReplayBuffer(storage).add(item(200))
    storage.close()
    assert magic(root) == b"RBDJRN02"
    assert ids_of(MemmapStorage.open(root))[1] == 200


@pytest.mark.parametrize("form", ["add", "extend"])
def test_per_step_writes_finish_a_pending_transaction_first(tmp_path: Path, form: str) -> None:
    """A transaction committed but not cleared in this process (its writer raised between the
    commit and the clear) is applied before the next per-step write lays out its own."""
    root = tmp_path / "st"
    rb = ReplayBuffer(MemmapStorage(CAP, path=root))
    for k in range(CAP + 1):
        rb.add(item(k))
    storage = rb.storage
    journal = storage._writes.journal
    assert journal is not None
    plan = journal.begin_run(6, 7, CAP, 7, own=True)  # as a one-item write lays it out
    assert plan is not None
    values = {("id",): 66, ("obs",): [66] * 3, ("next", "r"): -66}
    for leaf, row in zip(storage.layout.leaves, plan.first, strict=True):  # type: ignore[union-attr]
        row[...] = values[leaf.key]
    journal.commit_run()
    assert journal.committed
    if form == "add":
        assert rb.add(item(9)) == 1
    else:
        batch = TensorDict(
            {
                "id": torch.tensor([9]),
                "obs": torch.full((1, 3), 9.0),
                "next": {"r": torch.tensor([-9.0])},
            },
            [1],
        )
        assert rb.extend(batch).tolist() == [1]
    assert not journal.committed
    assert ids_of(storage) == [8, 9, 2, 3, 4, 5, 66, 7]
    storage.close()
    assert ids_of(MemmapStorage.open(root)) == [8, 9, 2, 3, 4, 5, 66, 7]
