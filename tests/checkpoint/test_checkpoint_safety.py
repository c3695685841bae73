"""Checkpoint safety: no escape, every field checked, no big allocation, checksums.

Each test tampers with a checkpoint the way a user or an adversary could (symlinks, ``..``,
hand-edited JSON, junk files, flipped bytes) and checks the observable result: a
``CheckpointError`` naming the file and the field, no file outside the checkpoint read or
written, no component constructed (hence nothing allocated) before the refusal, nothing left
behind. Expectations come from the files themselves (``zlib.crc32`` of their bytes), never from
the checkpoint code.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

import rbdata.samplers._trees.sumtree as sumtree
from rbdata import (
    ArrowStorage,
    ListStorage,
    MaxValueWriter,
    MemmapStorage,
    PrioritizedSampler,
    ReplayBuffer,
    TensorStorage,
    UniformSampler,
)
from rbdata.errors import CheckpointError

CAP = 128


def batch(n: int, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(
        {"id": ids, "obs": torch.stack([ids * 1.0, ids * 2.0, -ids * 1.0], 1)}, batch_size=[n]
    )


def make(kind: str, n: int = 100, sampler: Any = None) -> ReplayBuffer:
    storage = {
        "tensor": lambda: TensorStorage(CAP),
        "memmap": lambda: MemmapStorage(CAP),
        "arrow": lambda: ArrowStorage(CAP, chunk_size=32),
        "list": lambda: ListStorage(CAP),
    }[kind]()
    if sampler is None:
        sampler = UniformSampler(generator=torch.Generator().manual_seed(0))
    rb = ReplayBuffer(storage, sampler)
    if n:
        rb.extend(batch(n))
    return rb


def live(path: Path) -> Path:
    return path / (path / "CURRENT").read_text().strip()


def meta_of(path: Path, name: str = "checkpoint.json") -> dict[str, Any]:
    return json.loads((live(path) / name).read_text())


def edit(
    path: Path, change: Callable[[dict[str, Any]], None], name: str = "checkpoint.json"
) -> None:
    meta = meta_of(path, name)
    change(meta)
    (live(path) / name).write_text(json.dumps(meta))


def dumped(tmp_path: Path, kind: str, n: int = 100, sampler: Any = None) -> Path:
    path = tmp_path / "ckpt"
    rb = make(kind, n, sampler)
    rb.dumps(path)
    return path


def digest(root: Path) -> dict[str, int]:
    """CRC of every file under ``root`` (symlinks not followed)."""
    return {
        str(p.relative_to(root)): zlib.crc32(p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private temporary directory for the copies a load makes (Arrow): leftovers show."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


# --- 3. escapes: symlinks and names that leave the directory --------------------------------
def _outside(tmp_path: Path, size: int) -> Path:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(bytes([0x5A]) * size)
    return outside


def _leaf(path: Path) -> Path:
    return next(p for p in sorted((live(path) / "storage").glob("0*.bin")))


@pytest.mark.parametrize("kind", ["memmap", "tensor"])
def test_symlinked_leaf_file_is_refused(tmp_path: Path, kind: str) -> None:
    path = dumped(tmp_path, kind)
    leaf = _leaf(path)
    outside = _outside(tmp_path, leaf.stat().st_size)  # same size: only the link is wrong
    leaf.unlink()
    leaf.symlink_to(outside)
    before = outside.read_bytes()
    with pytest.raises(CheckpointError, match=rf"{leaf.name}.*symlink"):
        ReplayBuffer.loads(path)
    assert outside.read_bytes() == before


@pytest.mark.parametrize("name", ["../../outside.bin", "ABSOLUTE", "sub/000-id.bin", ".."])
def test_layout_file_names_outside_the_directory_are_refused(tmp_path: Path, name: str) -> None:
    path = dumped(tmp_path, "memmap")
    leaf = _leaf(path)
    outside = _outside(tmp_path, leaf.stat().st_size)
    target = str(outside) if name == "ABSOLUTE" else name
    edit(path, lambda m: m["files"].__setitem__(0, target), "storage/layout.json")
    with pytest.raises(CheckpointError, match=r"layout\.json"):
        ReplayBuffer.loads(path)


def test_symlinked_storage_directory_is_refused(tmp_path: Path) -> None:
    path = dumped(tmp_path, "memmap")
    storage = live(path) / "storage"
    elsewhere = tmp_path / "elsewhere"
    shutil.move(storage, elsewhere)  # a complete, valid storage directory, outside
    storage.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(CheckpointError, match=r"storage.*symlink"):
        ReplayBuffer.loads(path)


@pytest.mark.parametrize("what", ["CURRENT", "live", "checkpoint.json", "tensors.bin"])
def test_symlinked_checkpoint_files_are_refused(tmp_path: Path, what: str) -> None:
    path = dumped(tmp_path, "list")
    elsewhere = tmp_path / "elsewhere"
    if what == "live":
        target = live(path)
        shutil.move(target, elsewhere)
        target.symlink_to(elsewhere, target_is_directory=True)
    else:
        target = path / what if what == "CURRENT" else live(path) / what
        shutil.move(target, elsewhere)
        target.symlink_to(elsewhere)
    with pytest.raises(CheckpointError, match="symlink"):
        ReplayBuffer.loads(path)


def test_symlinked_arrow_chunk_is_neither_followed_nor_copied(
    tmp_path: Path, private_tmp: Path
) -> None:
    path = dumped(tmp_path, "arrow")
    chunk = live(path) / "storage" / "chunk-000001.arrow"
    outside = tmp_path / "outside.arrow"
    shutil.move(chunk, outside)  # a genuine chunk: only the symlink is wrong
    chunk.symlink_to(outside)
    before = outside.read_bytes()
    made = set(private_tmp.iterdir())
    with pytest.raises(CheckpointError, match=r"chunk-000001\.arrow.*symlink"):
        ReplayBuffer.loads(path)
    assert outside.read_bytes() == before
    assert set(private_tmp.iterdir()) == made  # no private copy left behind


# --- 4. counts read from the storage are range-checked -------------------------------------
@pytest.mark.parametrize("kind", ["memmap", "tensor"])
def test_header_next_slot_past_the_capacity_is_refused(tmp_path: Path, kind: str) -> None:
    rb = make(kind)
    rb.storage._set_next(300)  # the header written by dumps says next = 300 (capacity 128)
    path = tmp_path / "ckpt"
    rb.dumps(path)
    edit(path, lambda m: m["writer"]["state"].__setitem__("cursor", None))
    with pytest.raises(CheckpointError, match=r"header\.bin.*300"):
        ReplayBuffer.loads(path)


@pytest.mark.parametrize(
    ("field", "value"),
    [("length", True), ("next", 1.5), ("next", None)],
)
def test_arrow_counts_out_of_range_are_refused(tmp_path: Path, field: str, value: Any) -> None:
    path = dumped(tmp_path, "arrow")
    edit(path, lambda m: m.__setitem__(field, value), "storage/_rbdata.json")
    with pytest.raises(CheckpointError, match=rf"_rbdata\.json.*{field}"):
        ReplayBuffer.loads(path)


# --- 1 and 14: component sizes checked before anything is constructed ----------------------
def _tree_sizes(capacity: int) -> tuple[int, int]:
    sampler = PrioritizedSampler(capacity, 0.7, 0.5)
    state = sampler.state_dict()
    return state["sum_tree"].numel(), state["min_tree"].numel()


@pytest.fixture
def constructions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Capacities of every PrioritizedSampler built, and every tree allocated, from now on."""
    calls: list[int] = []
    init = PrioritizedSampler.__init__
    new_tree = sumtree.new_tree

    def spy_init(self: Any, capacity: int, *args: Any, **kwargs: Any) -> None:
        calls.append(capacity)
        init(self, capacity, *args, **kwargs)

    def spy_tree(capacity: int, *args: Any, **kwargs: Any) -> Any:
        calls.append(capacity)
        return new_tree(capacity, *args, **kwargs)

    monkeypatch.setattr(PrioritizedSampler, "__init__", spy_init)
    monkeypatch.setattr(sumtree, "new_tree", spy_tree)
    return calls


def _prioritized(tmp_path: Path) -> Path:
    return dumped(tmp_path, "tensor", sampler=PrioritizedSampler(CAP, 0.7, 0.5))


def test_sampler_capacity_edited_down_is_refused_before_construction(
    tmp_path: Path, constructions: list[int]
) -> None:
    """Config, state and both tree shapes consistently edited to capacity 8 (storage: 128)."""
    path = _prioritized(tmp_path)
    small_sum, small_min = _tree_sizes(8)
    constructions.clear()

    def shrink(m: dict[str, Any]) -> None:
        m["sampler"]["config"]["capacity"] = 8
        m["sampler"]["state"]["capacity"] = 8
        for name, size in (("sum_tree", small_sum), ("min_tree", small_min)):
            m["tensors"][m["sampler"]["state"][name]["i"]]["shape"] = [size]

    edit(path, shrink)
    with pytest.raises(
        CheckpointError,
        match=r"checkpoint\.json.*sampler\.config\.capacity.*8.*storage capacity 128",
    ):
        ReplayBuffer.loads(path)
    assert constructions == []  # no sampler built, no tree allocated, no kernel run


def test_huge_sampler_capacity_is_refused_before_allocating(
    tmp_path: Path, constructions: list[int]
) -> None:
    path = _prioritized(tmp_path)
    constructions.clear()

    def grow(m: dict[str, Any]) -> None:
        m["sampler"]["config"]["capacity"] = 10**8
        m["sampler"]["state"]["capacity"] = 10**8

    edit(path, grow)
    with pytest.raises(CheckpointError, match=r"checkpoint\.json.*capacity.*sum_tree"):
        ReplayBuffer.loads(path)
    assert constructions == []


def test_max_value_writer_larger_than_its_storage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    rb = ReplayBuffer(TensorStorage(CAP), writer=MaxValueWriter("id", capacity=64))
    rb.extend(batch(100))
    rb.dumps(path)
    edit(path, lambda m: m["writer"]["config"].__setitem__("capacity", 10**9))
    with pytest.raises(CheckpointError, match=r"checkpoint\.json.*writer\.config\.capacity"):
        ReplayBuffer.loads(path)


def test_list_storage_capacity_is_not_allocated_on_load(tmp_path: Path) -> None:
    """A ListStorage's capacity has no file to be checked against: loading must not pay it."""
    path = tmp_path / "ckpt"
    rb = ReplayBuffer(ListStorage(CAP))
    for i in range(5):
        rb.add({"text": f"step {i}"})
    rb.dumps(path)
    edit(path, lambda m: m["storage"]["config"].__setitem__("max_size", 10**7))
    tracemalloc.start()
    try:
        loaded = ReplayBuffer.loads(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # a list padded to the capacity would take 80 MB
    assert loaded.storage.capacity == 10**7 and len(loaded) == 5
    assert loaded.storage[4] == {"text": "step 4"}
    loaded.add({"text": "step 5"})  # writes still work (the list grows)
    assert loaded.storage[5] == {"text": "step 5"}


def test_arrow_restore_copies_only_the_files_the_metadata_names(
    tmp_path: Path, private_tmp: Path
) -> None:
    path = dumped(tmp_path, "arrow", n=40)  # chunks 0 and 1 hold rows
    storage_dir = live(path) / "storage"
    with open(storage_dir / "junk.bin", "wb") as f:
        f.truncate(64 << 20)  # a sparse junk file
    shutil.copy(storage_dir / "chunk-000000.arrow", storage_dir / "chunk-000003.arrow")
    rb = ReplayBuffer.loads(path)
    copied = sorted(p.name for p in rb.storage.path.iterdir() if p.name != "_holders.bin")
    assert copied == ["_rbdata.json", "chunk-000000.arrow", "chunk-000001.arrow"]
    assert rb.storage[torch.arange(40)]["id"].tolist() == list(range(40))
    rb.storage.close()


def test_arrow_chunk_file_padded_with_junk_is_refused_before_copying(
    tmp_path: Path, private_tmp: Path
) -> None:
    path = dumped(tmp_path, "arrow", n=40)
    with open(live(path) / "storage" / "chunk-000000.arrow", "r+b") as f:
        f.truncate(64 << 20)  # sparse: costs nothing here, 64 MiB to copy
    made = set(private_tmp.iterdir())
    with pytest.raises(CheckpointError, match=r"chunk-000000\.arrow: 67108864 bytes.*at most"):
        ReplayBuffer.loads(path)
    assert set(private_tmp.iterdir()) == made


# --- 15: hand-edited metadata: a CheckpointError naming the file and the field --------------
def _deep_text(depth: int) -> str:
    return "[" * depth + "]" * depth


EDITS: dict[str, tuple[str, Callable[[dict[str, Any]], None], str]] = {
    "missing storage state": (
        "checkpoint.json",
        lambda m: m["storage"].pop("state"),
        r"checkpoint\.json.*storage\.state",
    ),
    "infinite batch size": (
        "checkpoint.json",
        lambda m: m.__setitem__("batch_size", float("inf")),
        r"checkpoint\.json.*batch_size",
    ),
    "bool batch size": (
        "checkpoint.json",
        lambda m: m.__setitem__("batch_size", True),
        r"checkpoint\.json.*batch_size",
    ),
    "tensor offset a string": (
        "checkpoint.json",
        lambda m: m["tensors"][0].__setitem__("offset", "64"),
        r"tensors\.bin.*tensors\[0\]\.offset",
    ),
    "missing leaf shape": (
        "storage/layout.json",
        lambda m: m["layout"]["leaves"][0].pop("shape"),
        r"layout\.json.*shape",
    ),
    "fractional leaf shape": (
        "storage/layout.json",
        lambda m: m["layout"]["leaves"][1].__setitem__("shape", [2.5]),
        r"layout\.json.*shape",
    ),
    "capacity a string": (
        "storage/layout.json",
        lambda m: m.__setitem__("capacity", "128"),
        r"layout\.json.*capacity",
    ),
    "capacity differs from the config": (
        "storage/layout.json",
        lambda m: m.__setitem__("capacity", 64),
        r"layout\.json.*capacity",
    ),
    "fewer files than leaves": (
        "storage/layout.json",
        lambda m: m["files"].pop(),
        r"layout\.json.*files",
    ),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_hand_edited_metadata_names_the_file_and_field(tmp_path: Path, case: str) -> None:
    name, change, message = EDITS[case]
    path = dumped(tmp_path, "memmap")
    before = digest(tmp_path)
    edit(path, change, name)
    edited = digest(tmp_path)
    with pytest.raises(CheckpointError, match=message):
        ReplayBuffer.loads(path)
    assert digest(tmp_path) == edited != before  # nothing written by the failed load


@pytest.mark.parametrize("name", ["checkpoint.json", "storage/layout.json"])
def test_deeply_nested_json_is_a_checkpoint_error(tmp_path: Path, name: str) -> None:
    path = dumped(tmp_path, "memmap")
    file = live(path) / name
    text = file.read_text()
    file.write_text(text[:-1] + ', "junk": ' + _deep_text(100_000) + "}")
    with pytest.raises(CheckpointError, match=rf"{Path(name).name}.*(nested|deep)"):
        ReplayBuffer.loads(path)


def test_moderately_nested_sampler_config_is_a_checkpoint_error(tmp_path: Path) -> None:
    """Deep enough to pass the JSON parser, too deep for a recursive decoder."""
    path = dumped(tmp_path, "list")
    file = live(path) / "checkpoint.json"
    text = file.read_text()
    file.write_text(text[:-1] + ', "extra": ' + _deep_text(500) + "}")
    with pytest.raises(CheckpointError, match=r"checkpoint\.json.*deep"):
        ReplayBuffer.loads(path)


@pytest.mark.parametrize(
    ("field", "value"),
    [("chunk_size", 0), ("chunk_size", -4), ("chunk_size", "32"), ("capacity", 10**30)],
)
def test_arrow_metadata_fields_are_checked(
    tmp_path: Path, private_tmp: Path, field: str, value: Any
) -> None:
    path = dumped(tmp_path, "arrow")
    edit(path, lambda m: m.__setitem__(field, value), "storage/_rbdata.json")
    made = set(private_tmp.iterdir())
    with pytest.raises(CheckpointError, match=rf"_rbdata\.json.*{field}"):
        ReplayBuffer.loads(path)
    assert set(private_tmp.iterdir()) == made


# --- 17: checksums ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["tensor", "memmap", "arrow", "list"])
@pytest.mark.parametrize("n", [CAP, 50])
def test_checksums_match_the_bytes_on_disk(tmp_path: Path, kind: str, n: int) -> None:
    path = dumped(tmp_path, kind, n=n)
    meta = meta_of(path)
    table = meta["checksums"]
    assert table["algorithm"] == "crc32"
    on_disk = {
        str(p.relative_to(live(path)))
        for p in live(path).rglob("*")
        if p.is_file() and p.name != "checkpoint.json"
    }
    assert set(table["files"]) == on_disk  # every file, nothing else
    for name, rec in table["files"].items():
        data = (live(path) / name).read_bytes()
        assert rec["size"] == len(data), name
        if rec["covered"] < rec["size"]:  # a leaf of a tensor storage: the rows held
            assert kind in ("tensor", "memmap"), name
            # then the zero rows past the length, then the 32-byte id trailer (checked by
            # open against layout.json, which is covered)
            assert data[rec["covered"] : -32] == bytes(len(data) - rec["covered"] - 32), name
            assert data[-32:-24] == b"RBDLEAF2", name
        assert rec["crc32"] == zlib.crc32(data[: rec["covered"]]), name
    rb = ReplayBuffer.loads(path, verify=True)
    assert len(rb) == n
    if kind != "list":
        assert rb.storage[torch.arange(n)]["id"].tolist() == list(range(n))


def _flip(file: Path, at: int) -> None:
    data = bytearray(file.read_bytes())
    data[at] ^= 0x01
    file.write_bytes(bytes(data))


FLIPS: dict[str, tuple[str, Callable[[Path], Path]]] = {
    "memmap leaf": ("memmap", lambda p: _leaf(p)),
    "tensors.bin": ("memmap", lambda p: live(p) / "tensors.bin"),
    "arrow chunk": ("arrow", lambda p: live(p) / "storage" / "chunk-000002.arrow"),
}


@pytest.mark.parametrize("case", list(FLIPS))
def test_verify_finds_a_flipped_byte_and_names_the_file(
    tmp_path: Path, private_tmp: Path, case: str
) -> None:
    kind, which = FLIPS[case]
    sampler = PrioritizedSampler(CAP, 0.7, 0.5) if case == "tensors.bin" else None
    path = dumped(tmp_path, kind, sampler=sampler)
    file = which(path)
    if case == "arrow chunk":
        at = file.stat().st_size // 2
    elif case == "tensors.bin":  # inside the first tree's values (a same-size change)
        entry = meta_of(path)["tensors"][meta_of(path)["sampler"]["state"]["sum_tree"]["i"]]
        at = entry["offset"] + 8 * 4 + 1  # the root: a float32 byte
    else:
        at = 5 * 8 + 3  # item 5's id
    _flip(file, at)
    before = set(private_tmp.iterdir())  # the original buffer's own directories
    with pytest.raises(CheckpointError, match=rf"{file.name}.*checksum"):
        ReplayBuffer.loads(path, verify=True)
    assert set(private_tmp.iterdir()) == before
    if case == "memmap leaf":  # a file of at most 64 KiB is checked by default too
        with pytest.raises(CheckpointError, match=rf"{file.name}.*checksum"):
            ReplayBuffer.loads(path)


def test_verify_finds_a_resized_file(tmp_path: Path) -> None:
    path = dumped(tmp_path, "list")
    with open(live(path) / "tensors.bin", "ab") as f:
        f.write(b"\0" * 64)
    # the table still fits, but every file's size is compared by default (and the id
    # trailer is no longer at the end)
    for verify in (False, True):
        with pytest.raises(CheckpointError, match=r"tensors\.bin.*bytes"):
            ReplayBuffer.loads(path, verify=verify)


def test_checkpoint_without_checksums_loads_but_cannot_be_verified(tmp_path: Path) -> None:
    """A checkpoint written before checksums existed: loadable; verify=True says why not."""
    path = dumped(tmp_path, "memmap")
    edit(path, lambda m: m.pop("checksums"))
    assert len(ReplayBuffer.loads(path)) == 100
    with pytest.raises(CheckpointError, match="no checksums"):
        ReplayBuffer.loads(path, verify=True)


def test_verify_refuses_checksum_names_outside_the_checkpoint(tmp_path: Path) -> None:
    path = dumped(tmp_path, "list")
    outside = _outside(tmp_path, 16)
    entry = {"size": 16, "covered": 16, "crc32": zlib.crc32(outside.read_bytes())}
    edit(path, lambda m: m["checksums"]["files"].__setitem__("../../outside.bin", entry))
    with pytest.raises(CheckpointError, match=r"outside\.bin"):
        ReplayBuffer.loads(path, verify=True)


def test_verify_reads_nothing_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = dumped(tmp_path, "memmap")
    calls: list[Any] = []
    monkeypatch.setattr(zlib, "crc32", lambda *a: calls.append(a) or 0)
    ReplayBuffer.loads(path, verify=False)
    assert calls == []


def test_loaded_buffer_continues_like_the_original(tmp_path: Path) -> None:
    """The hardened path changes nothing for a valid checkpoint (prioritized, memmap)."""
    gen = torch.Generator().manual_seed(3)
    rb = make("memmap", sampler=PrioritizedSampler(CAP, 0.7, 0.5, generator=gen))
    rb.update_priority(torch.arange(0, 100, 7), torch.rand(15, generator=torch.Generator()))
    path = tmp_path / "ckpt"
    rb.dumps(path)
    other = ReplayBuffer.loads(path, verify=True)
    for _ in range(3):
        a, b = rb.sample(16), other.sample(16)
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["weight"], b["weight"])
    assert torch.equal(rb.extend(batch(50, 500)), other.extend(batch(50, 500)))
    assert torch.equal(rb.storage[torch.arange(CAP)]["id"], other.storage[torch.arange(CAP)]["id"])
    assert not os.path.samefile(rb.storage.path, other.storage.path)
