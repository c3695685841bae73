"""MemmapStorage safety: no escape, every header and layout field checked at open,
atomic writes replayed after a crash, a full disk refused cleanly, nothing works after close."""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from _child import run_child
from _paths import TEST_PATHS
from tensordict import TensorDict

from rbdata import ReplayBuffer
from rbdata.storages import MemmapStorage

CAP = 8


def batch(n: int, start: int = 0) -> TensorDict:
    """``n`` items whose every leaf carries the item number ``start + i``."""
    ids = torch.arange(start, start + n)
    return TensorDict(
        {"id": ids, "obs": ids.float()[:, None].expand(n, 3).clone(), "next": {"r": -ids.float()}},
        [n],
    )


def ids_of(storage: MemmapStorage) -> list[int]:
    items = storage[torch.arange(len(storage))]
    obs, r = items["obs"], items["next", "r"]
    ids = items["id"]
    assert torch.equal(obs, ids.float()[:, None].expand(-1, 3))  # every leaf of an item agrees
    assert torch.equal(r, -ids.float())
    return ids.tolist()


def six_of_eight(root: Path) -> Path:
    """A closed storage directory with items 0..5 in capacity 8."""
    storage = MemmapStorage(CAP, path=root)
    storage.set(slice(0, 6), batch(6))
    storage.close()
    return root


def leaf_file(root: Path, key: str) -> Path:
    meta = json.loads((root / "layout.json").read_text())
    keys = [".".join(leaf["key"]) for leaf in meta["layout"]["leaves"]]
    return root / meta["files"][keys.index(key)]


def edit_meta(root: Path, change: Any) -> None:
    meta = json.loads((root / "layout.json").read_text())
    change(meta)
    (root / "layout.json").write_text(json.dumps(meta))


# --- 3: no escape ------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["/etc/passwd", "../outside.bin", "sub/x.bin", "", 5])
def test_file_names_outside_the_directory_are_refused(tmp_path: Path, bad: Any) -> None:
    root = six_of_eight(tmp_path / "st")
    (tmp_path / "outside.bin").write_bytes(b"\1" * 64)

    def change(meta: dict[str, Any]) -> None:
        meta["files"][0] = bad

    edit_meta(root, change)
    with pytest.raises(ValueError, match=r"name in .*plain name|field 'files'"):
        MemmapStorage.open(root)


def test_symlinked_data_file_is_neither_read_nor_written(tmp_path: Path) -> None:
    root = six_of_eight(tmp_path / "st")
    leaf = leaf_file(root, "obs")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(leaf.read_bytes())
    secret = b"\x42" * leaf.stat().st_size
    outside.write_bytes(secret)
    leaf.unlink()
    leaf.symlink_to(outside)
    with pytest.raises(ValueError, match="symlink"):
        MemmapStorage.open(root)
    assert outside.read_bytes() == secret


@pytest.mark.parametrize("name", ["header.bin", "layout.json"])
def test_symlinked_header_or_layout_is_refused(tmp_path: Path, name: str) -> None:
    root = six_of_eight(tmp_path / "st")
    moved = tmp_path / name
    (root / name).rename(moved)
    (root / name).symlink_to(moved)
    with pytest.raises(ValueError, match="symlink"):
        MemmapStorage.open(root)


def test_symlinked_storage_directory_is_refused(tmp_path: Path) -> None:
    real = six_of_eight(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ValueError, match="symlink"):
        MemmapStorage.open(link)
    assert len(MemmapStorage.open(real)) == 6


# --- 4: header fields range-checked ----------------------------------------------------------
@pytest.mark.parametrize(
    ("length", "nxt", "field"),
    [(6, 100, "next"), (6, -3, "next"), (9, 1, "length"), (-1, 0, "length"), (3, 5, "next")],
)
def test_header_fields_are_range_checked(tmp_path: Path, length: int, nxt: int, field: str) -> None:
    from rbdata.storages.memmap._header import encode_header

    root = six_of_eight(tmp_path / "st")
    ident = json.loads((root / "layout.json").read_text())["id"]
    (root / "header.bin").write_bytes(encode_header(length, nxt, ident))
    with pytest.raises(
        ValueError, match=rf"header\.bin: field '{field}' is {nxt if field == 'next' else length}"
    ):
        MemmapStorage.open(root)


def test_corrupt_header_checksum_is_refused(tmp_path: Path) -> None:
    root = six_of_eight(tmp_path / "st")
    data = bytearray((root / "header.bin").read_bytes())
    active = struct.unpack_from("=q", data, 8)[0]
    struct.pack_into("=q", data, 8 * (3 + 3 * active), 7)  # next: 6 -> 7, check unchanged
    (root / "header.bin").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"header\.bin: header checksum mismatch"):
        MemmapStorage.open(root)


@pytest.mark.parametrize("copy_on_write", [False, True])
def test_header_of_the_unreleased_format_is_refused(tmp_path: Path, copy_on_write: bool) -> None:
    from rbdata.storages.memmap._header import HEADER_LEAF
    from rbdata.storages.memmap._rawfile import trailer

    root = six_of_eight(tmp_path / "st")
    ident = json.loads((root / "layout.json").read_text())["id"]
    legacy = struct.pack("=8q", 6, 6, 0, 0, 0, 0, 0, 0)  # 0.1.0: length, next, zeros
    legacy += trailer(ident, HEADER_LEAF)  # (the id of this directory: the records are old)
    (root / "header.bin").write_bytes(legacy)
    with pytest.raises(ValueError, match=r"header\.bin: no magic 'RBDHDR02'.*0\.1\.0"):
        MemmapStorage.open(root, copy_on_write=copy_on_write)
    assert (root / "header.bin").read_bytes() == legacy  # left as it was


# --- 15: layout.json validated up front --------------------------------------------------------
def _leaf0(change: Any) -> Any:
    def edit(meta: dict[str, Any]) -> None:
        change(meta["layout"]["leaves"][0])

    return edit


LAYOUT_EDITS: dict[str, tuple[Any, str]] = {
    "capacity negative": (lambda m: m.update(capacity=-4), "capacity"),
    "capacity zero": (lambda m: m.update(capacity=0), "capacity"),
    "capacity string": (lambda m: m.update(capacity="8"), "capacity"),
    "capacity bool": (lambda m: m.update(capacity=True), "capacity"),
    "capacity overflow": (lambda m: m.update(capacity=2**70), "capacity"),
    "capacity float": (lambda m: m.update(capacity=8.0), "capacity"),
    "layout not a dict": (lambda m: m.update(layout=[1]), "layout.kind"),
    "kind unknown": (lambda m: m["layout"].update(kind="zip"), "layout.kind"),
    "leaves missing": (lambda m: m["layout"].pop("leaves"), "layout.leaves"),
    "leaves empty": (lambda m: m["layout"].update(leaves=[]), "layout.leaves"),
    "leaf not a dict": (lambda m: m["layout"]["leaves"].__setitem__(0, 5), "layout.leaves[0]"),
    "shape missing": (_leaf0(lambda leaf: leaf.pop("shape")), "layout.leaves[0].shape"),
    "shape negative": (_leaf0(lambda leaf: leaf.update(shape=[-1])), "layout.leaves[0].shape"),
    "shape not ints": (_leaf0(lambda leaf: leaf.update(shape=5)), "layout.leaves[0].shape"),
    "shape overflow": (_leaf0(lambda leaf: leaf.update(shape=[2**62])), "layout.leaves[0].shape"),
    "dtype unknown": (_leaf0(lambda leaf: leaf.update(dtype="float99")), "layout.leaves[0].dtype"),
    "dtype not a dtype": (
        _leaf0(lambda leaf: leaf.update(dtype="Tensor")),
        "layout.leaves[0].dtype",
    ),
    "dtype int": (_leaf0(lambda leaf: leaf.update(dtype=5)), "layout.leaves[0].dtype"),
    "key missing": (_leaf0(lambda leaf: leaf.pop("key")), "layout.leaves[0].key"),
    "key not strings": (_leaf0(lambda leaf: leaf.update(key=[1])), "layout.leaves[0].key"),
    "key duplicate": (_leaf0(lambda leaf: leaf.update(key=["obs"])), "layout.leaves[1].key"),
    "ragged kind": (_leaf0(lambda leaf: leaf.update(kind="ragged")), "layout.leaves[0].kind"),
    "files missing": (lambda m: m.pop("files"), "files"),
    "files too few": (lambda m: m["files"].pop(), "files"),
    "files too many": (lambda m: m["files"].append("x.bin"), "files"),
    "files duplicate": (lambda m: m["files"].__setitem__(1, m["files"][0]), "files"),
    "files name the header": (lambda m: m["files"].__setitem__(0, "header.bin"), "files"),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_EDITS))
def test_every_layout_field_is_validated_at_open(tmp_path: Path, case: str) -> None:
    root = six_of_eight(tmp_path / "st")
    change, field = LAYOUT_EDITS[case]
    edit_meta(root, change)
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    with pytest.raises(ValueError, match=re.escape(f"layout.json: field '{field}'")):
        MemmapStorage.open(root)
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before


def test_deeply_nested_layout_is_a_clear_error(tmp_path: Path) -> None:
    root = six_of_eight(tmp_path / "st")
    text = (root / "layout.json").read_text()
    (root / "layout.json").write_text(text[:-1] + ', "x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(ValueError, match=r"layout\.json: corrupt metadata file"):
        MemmapStorage.open(root)


def test_open_reads_every_item_it_accepts(tmp_path: Path) -> None:
    root = six_of_eight(tmp_path / "st")
    storage = MemmapStorage.open(root)
    assert ids_of(storage) == [0, 1, 2, 3, 4, 5]
    storage.close()


# --- 6: the redo journal, deterministically --------------------------------------------------
KILL_IN = """
import os, signal, sys, torch
sys.path[:0] = {tests!r}
from test_memmap_safety import batch
from rbdata import ReplayBuffer
from rbdata.storages import MemmapStorage
from rbdata.storages.memmap import _journal
from rbdata.storages.memmap import storage as memmap
rb = ReplayBuffer(MemmapStorage.open({root!r}))
{patch}
rb.extend(batch(5, 100))  # slots 6, 7 (free), then 0, 1, 2 (live items)
print("returned")
"""


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        # killed after the journal was written, before its commit word: the batch is absent
        ("journal-before-commit", [0, 1, 2, 3, 4, 5]),
        # killed after the commit, with the first leaf half copied: open replays, present
        ("apply-half-done", [102, 103, 104, 3, 4, 5, 100, 101]),
        # killed after the header was published, before the journal was cleared
        ("before-clear", [102, 103, 104, 3, 4, 5, 100, 101]),
    ],
)
def test_kill_inside_an_overwrite_leaves_the_batch_whole(
    tmp_path: Path, where: str, expected: list[int]
) -> None:
    root = six_of_eight(tmp_path / "st")
    kill = "os.kill(os.getpid(), signal.SIGKILL)"
    patch = {
        "journal-before-commit": f"_journal.Journal.commit = lambda *a: {kill}",
        "apply-half-done": (  # the general path applies with _apply, the per-step one _put_rows
            "def apply(self, kind, index, rows, length, nxt, plan):\n"
            "    buf, view = self._buffers[0], plan.tviews[0]\n"
            "    buf[6:8].copy_(view[0:2])\n"
            f"    {kill}\n"
            "def put_rows(self, start, n, values):\n"
            "    self._np_buffers[0][6:8] = values[0][0:2]\n"
            f"    {kill}\n"
            "memmap.MemmapStorage._apply = apply\n"
            "memmap.MemmapStorage._put_rows = put_rows"
        ),
        "before-clear": f"_journal.Journal.clear = lambda self: {kill}",
    }[where]
    code = KILL_IN.format(tests=TEST_PATHS, root=str(root), patch=patch)
    result = run_child(code)
    assert result.returncode == -9, result.stderr
    assert "returned" not in result.stdout
    reopened = MemmapStorage.open(root)
    assert ids_of(reopened) == expected
    present = expected[0] == 102
    assert reopened.next_slot == (3 if present else 6)
    assert not reopened._writes.journal  # nothing left to replay
    ReplayBuffer(reopened).extend(batch(2, 200))  # goes on from there
    reopened.close()
    again = MemmapStorage.open(root)
    assert len(again) == CAP and again.next_slot == (5 if present else 0)
    again.close()


def test_overwrites_match_a_plain_tensor_ring(tmp_path: Path) -> None:
    """Journaled writes (runs, wrapping runs, index tensors, single items) = TensorStorage."""
    from rbdata import TensorStorage

    mm = MemmapStorage(CAP, path=tmp_path / "st")
    ref = TensorStorage(CAP)
    start = 0
    for op, arg in [("runs", 5), ("runs", 6), ("idx", [7, 0, 3]), ("one", 2), ("runs", 8)]:
        for storage in (mm, ref):
            if op == "runs":
                ReplayBuffer(storage).writer.extend(storage, batch(arg, start))
            elif op == "idx":
                storage.set(torch.tensor(arg), batch(len(arg), start))
            else:
                storage.set(arg, batch(1, start)[0])
        start += 100
        got, want = mm[torch.arange(len(mm))], ref[torch.arange(len(ref))]
        assert (len(mm), mm.next_slot) == (len(ref), ref.next_slot)
        assert (got == want).all()
    mm.close()
    again = MemmapStorage.open(tmp_path / "st")
    assert (again[torch.arange(CAP)] == ref[torch.arange(CAP)]).all()
    assert not any(p.name.startswith(".") for p in (tmp_path / "st").iterdir())


# --- 12: a full disk is an OSError at creation -----------------------------------------------
def test_full_disk_is_an_oserror_and_the_storage_stays_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "st"
    storage = MemmapStorage(1000, path=root)
    calls = []

    def full(fd: int, offset: int, length: int) -> None:
        calls.append(length)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match="cannot reserve") as info:
        storage.set(slice(0, 3), batch(3))
    assert info.value.errno == errno.ENOSPC
    assert calls  # the space was asked for
    assert len(storage) == 0 and storage.layout is None
    assert sorted(p.name for p in root.iterdir()) == ["header.bin", "holders.bin", "layout.json"]
    monkeypatch.undo()
    storage.set(slice(0, 3), batch(3))
    assert ids_of(storage) == [0, 1, 2]
    storage.close()
    assert ids_of(MemmapStorage.open(root)) == [0, 1, 2]


def test_file_size_limit_is_an_oserror_not_a_crash(tmp_path: Path) -> None:
    root = tmp_path / "st"
    result = run_child(
        f"""
        import errno, resource, signal, sys
        sys.path[:0] = {TEST_PATHS!r}
        from test_memmap_safety import batch
        from rbdata.storages import MemmapStorage
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        storage = MemmapStorage(200_000, path={str(root)!r})  # 4.8 MB for "obs"
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            storage.set(slice(0, 3), batch(3))
        except OSError as err:
            print("errno", errno.errorcode[err.errno], len(storage), storage.layout)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["errno", "EFBIG", "0", "None"]
    assert sorted(p.name for p in root.iterdir()) == ["header.bin", "holders.bin", "layout.json"]
    storage = MemmapStorage.open(root)
    storage.set(slice(0, 2), batch(2))
    assert ids_of(storage) == [0, 1]
    storage.close()


# --- 13: nothing after close -----------------------------------------------------------------
def test_every_method_of_a_closed_storage_raises(tmp_path: Path) -> None:
    root = six_of_eight(tmp_path / "st")
    storage = MemmapStorage.open(root)
    rb = ReplayBuffer(storage)
    storage.close()
    calls = {
        "extend": lambda: rb.extend(batch(2, 10)),
        "set": lambda: storage.set(slice(6, 8), batch(2, 10)),
        "len": lambda: len(storage),
        "getitem": lambda: storage[0],
        "getitems": lambda: storage[[0, 1]],
        "clear": storage.clear,
        "path": lambda: storage.path,
        "buffers": lambda: storage.buffers,
        "next_slot": lambda: storage.next_slot,
        "flush": storage.flush,
        "config": storage.config,
        "pickle": lambda: pickle.dumps(storage),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="closed"):
            call()
        assert name
    storage.close()  # closing twice is fine
    reopened = MemmapStorage.open(root)
    assert (len(reopened), reopened.next_slot) == (6, 6)
    assert ids_of(reopened) == [0, 1, 2, 3, 4, 5]
    assert reopened.buffers[0][6:].eq(0).all()  # nothing written into slots 6, 7
    reopened.close()


def test_flush_writes_back_and_keeps_the_data(tmp_path: Path) -> None:
    storage = MemmapStorage(CAP, path=tmp_path / "st")
    rb = ReplayBuffer(storage)
    rb.extend(batch(6))
    rb.extend(batch(4, 6))
    storage.flush()
    assert ids_of(MemmapStorage.open(tmp_path / "st")) == [8, 9, 2, 3, 4, 5, 6, 7]
    storage.close()
