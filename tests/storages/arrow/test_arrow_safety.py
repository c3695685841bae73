"""ArrowStorage safety: no crash on bad files, no escape, nothing lost, clear errors.

Risky reads run in a child interpreter and the test asserts on its exit code: a signal (a
negative return code) is a crash, whatever the child printed.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc
import pytest
import torch
from _child import run_child
from _paths import ROOT_DIR

from rbdata import ReplayBuffer
from rbdata.storages import ArrowStorage

META = "_rbdata.json"
ROOT = ROOT_DIR


def batch(ids: range) -> dict[str, Any]:
    """Rows whose every field is a function of the id (a ragged leaf and a string too)."""
    return {
        "id": torch.tensor(list(ids), dtype=torch.int64),
        "obs": torch.tensor([[i, i + 0.5] for i in ids], dtype=torch.float32).view(-1, 2),
        "boxes": [torch.full((i % 3, 2), float(i)) for i in ids],
        "text": [f"t{i}" for i in ids],
    }


def fixed_batch(ids: range) -> dict[str, Any]:
    return {
        "id": torch.tensor(list(ids), dtype=torch.int64),
        "obs": torch.tensor([[i, -i] for i in ids], dtype=torch.float32).view(-1, 2),
    }


def make(path: Path, n: int = 10, ragged: bool = True, chunk_size: int = 4) -> None:
    storage = ArrowStorage(16, path=path, chunk_size=chunk_size)
    storage.set(slice(0, n), batch(range(n)) if ragged else fixed_batch(range(n)))
    storage.close()


def edit_meta(path: Path, **fields: Any) -> None:
    meta = json.loads((path / META).read_text())
    for key, value in fields.items():
        if value is ...:
            meta.pop(key)
        else:
            meta[key] = value
    (path / META).write_text(json.dumps(meta))


# --- 2. corrupt files: a ValueError, never a signal ------------------------------------------
#: reads each directory in turn in one child; a line per directory, before and after its read
#: (a child killed by a signal names the directory it died on: the last "start" line)
READ_EACH = """
import json, torch
from rbdata.storages import ArrowStorage
for i, path in enumerate(json.loads({paths!r})):
    print(i, "start", flush=True)
    try:
        s = ArrowStorage.open(path)
        s[torch.arange(len(s))]
        for k in range(len(s)):
            s[k]
    except ValueError as err:
        print(i, "ValueError", err, flush=True)
    else:
        print(i, "read OK", flush=True)
"""


def read_each(paths: list[Path]) -> list[str]:
    """What reading each of ``paths`` in one child printed (``"ValueError ..."``, ``"read OK"``)."""
    result = run_child(READ_EACH.format(paths=json.dumps([str(p) for p in paths])))
    lines = result.stdout.splitlines()
    started = [line for line in lines if line.endswith(" start")]
    assert result.returncode == 0, (
        f"crashed ({result.returncode}) reading {started[-1:]}: {result.stderr[-2000:]}"
    )
    found = {}
    for line in lines:
        i, _, rest = line.partition(" ")
        if rest != "start":
            found[int(i)] = rest
    return [found.get(i, "no result") for i in range(len(paths))]


BAD_CHUNK_SIZES = [-4, 0, "4", 4.0, None, True]


def test_bad_chunk_size_is_a_clear_error_not_a_crash(tmp_path: Path) -> None:
    paths = []
    for k, chunk_size in enumerate(BAD_CHUNK_SIZES):
        path = tmp_path / f"rb{k}"
        make(path)
        edit_meta(path, chunk_size=chunk_size)
        paths.append(path)
    for chunk_size, out in zip(BAD_CHUNK_SIZES, read_each(paths), strict=True):
        assert out.startswith("ValueError") and "'chunk_size'" in out, (chunk_size, out)
        assert META in out, (chunk_size, out)


def _patch_last_offset(file: Path, column: str, value: int) -> None:
    """Overwrite the last int32 list offset of ``column`` in place (same file size)."""
    with pa.memory_map(str(file)) as source:
        batch = pa.ipc.open_file(source).get_batch(0)
        offsets = batch.column(batch.schema.names.index(column)).buffers()[1]
        base = source.read_buffer(1).address
        source.seek(0)
        where = offsets.address - base + 4 * batch.num_rows
    with open(file, "r+b") as f:
        f.seek(where)
        f.write(struct.pack("<i", value))


def test_ragged_offset_out_of_range_is_refused_at_open(tmp_path: Path) -> None:
    values = [2**30, -1, 2**31 - 1]
    paths = []
    for k, value in enumerate(values):
        path = tmp_path / f"rb{k}"
        make(path)
        _patch_last_offset(path / "chunk-000001.arrow", "boxes", value)
        paths.append(path)
    for value, out in zip(values, read_each(paths), strict=True):
        assert out.startswith("ValueError") and "chunk-000001.arrow" in out, (value, out)


def test_a_chunk_with_more_rows_than_a_chunk_holds_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    make(path, ragged=False)
    file = path / "chunk-000000.arrow"
    table = pa.ipc.open_file(pa.py_buffer(file.read_bytes())).read_all()  # a copy
    table = pa.concat_tables([table, table])  # 8 rows in a chunk of 4
    with pa.OSFile(str(file), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks())
    with pytest.raises(ValueError, match=r"chunk-000000\.arrow: 8 rows, a chunk holds at most 4"):
        ArrowStorage.open(path)


def test_a_chunk_with_nulls_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    make(path, ragged=False)
    file = path / "chunk-000001.arrow"
    table = pa.ipc.open_file(pa.py_buffer(file.read_bytes())).read_all()  # a copy
    ids = pa.array([None, 5, 6, 7], pa.int64())
    table = table.set_column(0, table.schema.field(0), ids)
    with pa.OSFile(str(file), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(ValueError, match=r"chunk-000001\.arrow: column 'id' holds nulls"):
        ArrowStorage.open(path)


# --- 15. metadata validated up front, constructor arguments checked -----------------------------
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ragged": 5}, r"field 'ragged'"),
        ({"ragged": [3]}, r"field 'ragged'"),
        ({"capacity": ...}, r"field 'capacity' is missing"),
        ({"length": ...}, r"field 'length' is missing"),
        ({"next": ...}, r"field 'next' is missing"),
        ({"chunk_size": ...}, r"field 'chunk_size' is missing"),
        ({"capacity": "16"}, r"field 'capacity' must be an integer"),
        ({"capacity": 10**30}, r"field 'capacity' must be an integer"),
        ({"length": -1}, r"field 'length' must be an integer"),
        ({"length": 1.5}, r"field 'length' must be an integer"),
        ({"next": 16}, r"next slot 16 out of range"),
        ({"chunk_size": 17}, r"field 'chunk_size' must be an integer in \[1, 16\]"),
        ({"layout": ...}, r"10 rows but no field 'layout'"),
        ({"layout": 5}, r"field 'layout' must be an object"),
        ({"layout": {"kind": "tensordict", "leaves": [{"key": ["id"]}]}}, r"'shape'"),
        ({"layout": {"kind": "tensordict", "leaves": [5]}}, r"leaf 0 is not an object"),
        (
            {"layout": {"kind": "x", "leaves": []}},
            r"'kind' must be 'tensor' or 'tensordict'",
        ),
        (
            {
                "layout": {
                    "kind": "tensordict",
                    "leaves": [{"key": ["id"], "shape": [], "dtype": "complex64"}],
                }
            },
            r"complex64",
        ),
        (
            {
                "layout": {
                    "kind": "tensordict",
                    "leaves": [{"key": ["id"], "shape": [], "dtype": "os.system"}],
                }
            },
            r"unknown dtype",
        ),
        (
            {
                "layout": {
                    "kind": "tensordict",
                    "leaves": [{"key": ["id"], "shape": [10**12], "dtype": "float32"}],
                }
            },
            r"'shape'",
        ),
    ],
)
def test_metadata_fields_are_checked_at_open(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    path = tmp_path / "rb"
    make(path)
    edit_meta(path, **fields)
    with pytest.raises(ValueError, match=message) as info:
        ArrowStorage.open(path)
    assert META in str(info.value)


def test_deep_or_huge_json_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    make(path)
    (path / META).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="corrupt metadata file"):
        ArrowStorage.open(path)
    (path / META).write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match="corrupt metadata file"):
        ArrowStorage.open(path)


@pytest.mark.parametrize("ragged", [[3], 5, "boxes", [("a", 1)], [()], [None]])
def test_constructor_ragged_argument_is_checked(ragged: Any) -> None:
    with pytest.raises(TypeError, match=r"ragged: expected a list of keys"):
        ArrowStorage(8, ragged=ragged)


def test_constructor_accepts_str_and_tuple_keys() -> None:
    storage = ArrowStorage(8, ragged=["boxes", ("next", "boxes")])
    assert storage.config()["ragged"] == [["boxes"], ["next", "boxes"]]
    storage.close()


# --- 14. sizes checked against the files before anything is allocated ---------------------------
def test_huge_capacity_with_tiny_chunks_allocates_nothing_before_refusing(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    make(path, ragged=False)
    edit_meta(path, capacity=10**8, chunk_size=1, length=10**8)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"chunk-000000\.arrow: 1 rows?, expected|missing"):
            ArrowStorage.open(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB allocated before refusing"


def test_huge_capacity_with_tiny_chunks_opens_cheaply_when_true(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    storage = ArrowStorage(10**8, path=path, chunk_size=1)
    storage.set(slice(0, 3), fixed_batch(range(3)))
    storage.close()
    tracemalloc.start()
    try:
        again = ArrowStorage.open(path)
        got = again[torch.arange(3)]["id"].tolist()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [0, 1, 2]
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB for a storage of 3 rows"
    again.close()


# --- 3. no escape through symlinks -------------------------------------------------------------
def test_a_symlinked_chunk_is_refused_and_the_outside_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    make(path, ragged=False, n=16)
    outside = tmp_path / "outside.arrow"
    (path / "chunk-000001.arrow").rename(outside)
    (path / "chunk-000001.arrow").symlink_to(outside)
    before = outside.read_bytes()
    with pytest.raises(ValueError, match=r"chunk-000001\.arrow.*symlink"):
        ArrowStorage.open(path)
    assert outside.read_bytes() == before


def test_a_chunk_swapped_for_a_symlink_after_open_is_never_written(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    make(path, ragged=False, n=16)  # a full ring of full chunks: the in-place write path
    storage = ArrowStorage.open(path)
    outside = tmp_path / "outside.arrow"
    (path / "chunk-000001.arrow").rename(outside)
    (path / "chunk-000001.arrow").symlink_to(outside)
    before = outside.read_bytes()
    with pytest.raises(ValueError, match="symlink"):
        storage.set(slice(4, 8), fixed_batch(range(100, 104)))
    assert outside.read_bytes() == before


def test_symlinked_storage_dir_and_files_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    make(real)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ValueError, match="symlink"):
        ArrowStorage.open(link)
    empty = tmp_path / "empty"
    empty.mkdir()
    link2 = tmp_path / "link2"
    link2.symlink_to(empty)
    with pytest.raises(ValueError, match="symlink"):
        ArrowStorage(8, path=link2)
    outside_meta = tmp_path / "meta.json"
    (real / META).rename(outside_meta)
    (real / META).symlink_to(outside_meta)
    with pytest.raises(ValueError, match="symlink"):
        ArrowStorage.open(real)


def test_a_symlinked_journal_is_never_followed(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    storage = ArrowStorage(16, path=path, chunk_size=4)
    storage.set(slice(0, 2), fixed_batch(range(2)))
    storage.flush()
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"keep")
    (path / "_journal.bin").symlink_to(outside)
    with pytest.raises(ValueError, match="symlink"):
        storage.set(slice(2, 4), fixed_batch(range(2, 4)))
    assert outside.read_bytes() == b"keep"


# --- 13. a closed storage refuses everything -----------------------------------------------
def test_every_method_of_a_closed_storage_raises(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    storage = ArrowStorage(16, path=path, chunk_size=4)
    storage.set(slice(0, 10), batch(range(10)))
    storage.close()
    files = {p.name: p.read_bytes() for p in path.iterdir()}
    calls = {
        "len": lambda: len(storage),
        "getitem": lambda: storage[0],
        "getitems": lambda: storage[[0, 1]],
        "set": lambda: storage.set(slice(10, 12), batch(range(2))),
        "prepare": lambda: storage.prepare(batch(range(2)), batched=True),
        "flush": storage.flush,
        "clear": storage.clear,
        "column": lambda: storage.column("id", 0),
        "path": lambda: storage.path,
        "config": storage.config,
        "pickle": lambda: pickle.dumps(storage),
        "extend": lambda: ReplayBuffer(storage).extend(batch(range(2))),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="closed"):
            call()
            pytest.fail(f"{name} did not raise")
    assert {p.name: p.read_bytes() for p in path.iterdir()} == files
    storage.close()  # close itself stays a no-op


# --- 5. every returned extend survives: normal exit, del, SIGKILL ------------------------------
WRITER = """
import os, sys, torch
from rbdata.storages import ArrowStorage
path, how = sys.argv[1], sys.argv[2]
st = ArrowStorage(10_000, path=path, chunk_size=1000)
for i in range(23):
    ids = torch.arange(i * 64, (i + 1) * 64)
    st.set(slice(i * 64, (i + 1) * 64), {"id": ids, "obs": ids.float().view(-1, 1).repeat(1, 3)})
if how == "del":
    import gc
    del st
    gc.collect()
elif how == "kill":
    os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("how", ["exit", "del", "kill"])
def test_an_unclosed_storage_reopens_with_every_row(tmp_path: Path, how: str) -> None:
    path = tmp_path / "rb"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", WRITER, str(path), how], capture_output=True, text=True, env=env
    )
    expected_rc = -signal.SIGKILL if how == "kill" else 0
    assert result.returncode == expected_rc, result.stderr[-2000:]
    storage = ArrowStorage.open(path)
    assert len(storage) == 23 * 64 and storage.next_slot == 23 * 64
    got = storage[torch.arange(23 * 64)]
    assert got["id"].tolist() == list(range(23 * 64))
    assert torch.equal(got["obs"], torch.arange(23 * 64.0).view(-1, 1).repeat(1, 3))
    # replayed into the chunks: plain Arrow again, and the journal gone
    names = sorted(p.name for p in path.iterdir())
    assert names == ["_holders.bin", META, "chunk-000000.arrow", "chunk-000001.arrow"]
    table = pa.ipc.open_file(str(path / "chunk-000001.arrow")).read_all()
    assert table.column("id").to_pylist() == list(range(1000, 23 * 64))
    meta = json.loads((path / META).read_text())
    assert meta["length"] == 23 * 64
    storage.close()


def test_rows_dropped_without_close_are_there_on_reopen(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    storage = ArrowStorage(1000, path=path, chunk_size=1000)
    storage.set(slice(0, 300), fixed_batch(range(300)))
    meta = json.loads((path / META).read_text())
    assert meta["length"] == 0  # the metadata never claims rows that are not in a chunk file
    del storage
    again = ArrowStorage.open(path)
    assert again[torch.arange(300)]["id"].tolist() == list(range(300))
    again.close()


def test_a_torn_last_journal_record_is_dropped_whole(tmp_path: Path) -> None:
    path, killed = tmp_path / "rb", tmp_path / "killed"
    storage = ArrowStorage(16, path=path, chunk_size=4)
    storage.set(slice(0, 3), batch(range(3)))
    storage.set(slice(3, 9), batch(range(3, 9)))
    shutil.copytree(path, killed)  # the files as a SIGKILL now leaves them
    storage.close()
    journal = killed / "_journal.bin"
    data = journal.read_bytes()
    journal.write_bytes(data[:-5])  # the second record cut short, as by a kill
    again = ArrowStorage.open(killed)
    assert len(again) == 3 and again.next_slot == 3
    assert again[torch.arange(3)]["text"].tolist() == ["t0", "t1", "t2"]
    again.close()


def test_open_without_recover_leaves_the_journal_alone(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    storage = ArrowStorage(16, path=path, chunk_size=4)
    storage.set(slice(0, 6), fixed_batch(range(6)))
    snapshot = {p.name: p.read_bytes() for p in path.iterdir()}
    copy = ArrowStorage.open(path, recover=False)
    assert len(copy) == 0
    assert {p.name: p.read_bytes() for p in path.iterdir()} == snapshot
    storage.close()
