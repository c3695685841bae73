"""Issue 22 §4: an ArrowStorage dropped without ``close()`` writes its rows to the chunk files.

The writer runs in a child interpreter (exit without ``close``, ``del``, a reference cycle
collected by ``gc``); this process then reads the directory with pyarrow alone — what polars
and duckdb see — and compares the rows with the ones the child wrote, computed here.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset
import pyarrow.ipc
import pytest
import torch
from _child import run_child

from rbdata import ReplayBuffer
from rbdata.errors import StorageInUseError
from rbdata.storages import ArrowStorage

META = "_rbdata.json"


def rows(ids: range) -> dict[str, Any]:
    """Every field a function of the id: fixed, ragged and string leaves."""
    return {
        "id": torch.tensor(list(ids), dtype=torch.int64),
        "obs": torch.tensor([[i, i + 0.5] for i in ids], dtype=torch.float32).view(-1, 2),
        "boxes": [torch.full((i % 3, 2), float(i)) for i in ids],
        "text": [f"t{i}" * (i % 4) for i in ids],
    }


def expected(ids: list[int]) -> dict[str, list[Any]]:
    """The columns pyarrow must read for ``ids``, built without rbdata."""
    return {
        "id": ids,
        "obs": [[float(i), i + 0.5] for i in ids],
        "boxes": [[[float(i)] * 2] * (i % 3) for i in ids],
        "text": [f"t{i}" * (i % 4) for i in ids],
    }


WRITER = """
import gc, os, sys
import torch
sys.path.insert(0, "tests")
from test_arrow_dropped import rows
from rbdata.storages import ArrowStorage

path, how = sys.argv[1], sys.argv[2]
st = ArrowStorage(40, path=path, chunk_size=8)
st.set(slice(0, 40), rows(range(40)))
st.set(slice(0, 5), rows(range(40, 45)))  # a second lap into a sealed chunk
if how == "del":
    del st
    gc.collect()
    assert not os.path.exists(os.path.join(path, "_journal.bin")), "not flushed by del"
elif how == "cycle":
    holder = {"storage": st}
    holder["self"] = holder  # only the cycle collector frees it
    del st, holder
    gc.collect()
    assert not os.path.exists(os.path.join(path, "_journal.bin")), "not flushed by gc"
elif how == "exit":
    pass  # still referenced at interpreter exit
"""


def read_with_pyarrow(path: Path) -> dict[str, list[Any]]:
    """The rows of the chunk files in slot order, read by pyarrow only."""
    chunks = sorted(path.glob("chunk-*.arrow"))
    table = pa.concat_tables(pa.ipc.open_file(str(chunk)).read_all() for chunk in chunks)
    return {name: table.column(name).to_pylist() for name in table.column_names}


@pytest.mark.parametrize("how", ["exit", "del", "cycle"])
def test_rows_of_a_storage_dropped_without_close_are_in_the_arrow_files(
    tmp_path: Path, how: str
) -> None:
    path = tmp_path / "rb"
    result = run_child(WRITER.replace("sys.argv[1], sys.argv[2]", f"{str(path)!r}, {how!r}"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Warning" not in result.stderr, result.stderr[-3000:]
    slots = [*range(40, 45), *range(5, 40)]  # what each slot holds, in slot order
    assert read_with_pyarrow(path) == expected(slots)
    # pyarrow.dataset (what polars and duckdb scan) sees the same rows, once each
    table = pyarrow.dataset.dataset(path, format="arrow").to_table()
    assert sorted(table.column("id").to_pylist()) == sorted(slots)
    chunks = [f"chunk-{k:06d}.arrow" for k in range(5)]
    assert sorted(os.listdir(path)) == ["_holders.bin", META, *chunks]
    meta = json.loads((path / META).read_text())
    assert (meta["length"], meta["next"]) == (40, 5)
    again = ArrowStorage.open(path)  # and rbdata reads what pyarrow read
    assert again[torch.arange(40)]["id"].tolist() == slots
    again.close()


def test_a_closed_storage_is_not_written_again_when_dropped(tmp_path: Path) -> None:
    storage = ArrowStorage(40, path=tmp_path / "rb", chunk_size=8)
    storage.set(slice(0, 13), rows(range(13)))
    storage.close()
    files = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "rb").iterdir()}
    del storage
    gc.collect()
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "rb").iterdir()}
    assert after == files


def test_a_reading_copy_never_flushes_the_owners_rows(tmp_path: Path) -> None:
    """A copy (pickled, or opened with recover=False) does not own the writes: no flush."""
    path = tmp_path / "rb"
    owner = ArrowStorage(40, path=path, chunk_size=8)
    owner.set(slice(0, 13), rows(range(13)))  # rows 8..12 in an open chunk of the owner
    copy = pickle.loads(pickle.dumps(owner))  # flushes the owner first (its rule)
    files = {p.name: p.read_bytes() for p in path.iterdir()}
    reader = ArrowStorage.open(path, recover=False)
    owner.set(slice(13, 15), rows(range(13, 15)))  # journal only
    snapshot = {p.name: p.read_bytes() for p in path.iterdir()}
    assert snapshot.keys() == files.keys() | {"_journal.bin"}
    del copy, reader
    gc.collect()
    assert {p.name: p.read_bytes() for p in path.iterdir()} == snapshot
    owner.close()
    assert read_with_pyarrow(path)["id"] == list(range(15))


def test_closing_a_storage_that_wrote_nothing_writes_no_file(tmp_path: Path) -> None:
    """Only read since it was opened: ``close`` writes nothing (a read-only cache, a reader).

    A reading copy closed after its owner moved on used to publish its own, stale metadata
    over the owner's (the owner's later rows lost on reopen).
    """
    path = tmp_path / "rb"
    owner = ArrowStorage(40, path=path, chunk_size=8)
    owner.set(slice(0, 13), rows(range(13)))
    owner.flush()
    reader = ArrowStorage.open(path, recover=False)
    with pytest.raises(StorageInUseError, match="one writer"):
        ArrowStorage.open(path)  # a second writer: refused, so it never publishes either
    owner.set(slice(13, 20), rows(range(13, 20)))
    owner.flush()
    files = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in path.iterdir()}
    assert reader[torch.arange(13)]["id"].tolist() == list(range(13))
    reader.close()
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in path.iterdir()} == files
    owner.close()
    again = ArrowStorage.open(path)
    assert again[torch.arange(len(again))]["id"].tolist() == list(range(20))
    again.close()


def test_a_forked_child_that_exits_does_not_flush_the_parents_storage(tmp_path: Path) -> None:
    code = f"""
    import os, sys
    sys.path.insert(0, "tests")
    from test_arrow_dropped import rows
    from rbdata.storages import ArrowStorage
    path = {str(tmp_path / "rb")!r}
    st = ArrowStorage(40, path=path, chunk_size=8)
    st.set(slice(0, 13), rows(range(13)))
    before = {{n: open(os.path.join(path, n), "rb").read() for n in os.listdir(path)}}
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # a normal exit: atexit and the finalizers run in the child
    os.waitpid(pid, 0)
    after = {{n: open(os.path.join(path, n), "rb").read() for n in os.listdir(path)}}
    print("unchanged" if after == before else "changed: " + str(sorted(after)))
    """
    result = run_child(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "unchanged"
    assert read_with_pyarrow(tmp_path / "rb")["id"] == list(range(13))  # the parent's exit


def test_temporary_and_checkpoint_copies_are_removed_not_flushed(tmp_path: Path) -> None:
    temporary = ArrowStorage(40, chunk_size=8)
    temporary.set(slice(0, 3), rows(range(3)))
    root = temporary.path
    rb = ReplayBuffer(ArrowStorage(40, path=tmp_path / "rb", chunk_size=8))
    rb.extend(rows(range(11)))
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    copy_root = loaded.storage.path
    loaded.extend(rows(range(100, 103)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del temporary, loaded
        gc.collect()
    assert [str(w.message) for w in caught] == []
    assert not root.exists() and not copy_root.exists()
    rb.storage.close()


def test_a_flush_that_fails_when_dropped_warns_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rb"
    storage = ArrowStorage(40, path=path, chunk_size=8)
    storage.set(slice(0, 13), rows(range(13)))

    def full_disk(self: ArrowStorage, fsync: bool) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ArrowStorage, "_sync", full_disk)
    with pytest.warns(RuntimeWarning, match=r"dropped without close\(\).*No space left.*open"):
        del storage
        gc.collect()
    monkeypatch.undo()
    again = ArrowStorage.open(path)  # the journal had them
    got = again[torch.arange(13)]
    assert got["id"].tolist() == list(range(13))
    assert got["text"].tolist() == expected(list(range(13)))["text"]
    assert [b.tolist() for b in got["boxes"].unbind()] == expected(list(range(13)))["boxes"]
    again.close()


def test_rows_helper_matches_expected() -> None:
    """The two views of the test data agree (the child writes ``rows``, we read ``expected``)."""
    data = rows(range(5))
    want = expected(list(range(5)))
    assert data["id"].tolist() == want["id"] and data["obs"].tolist() == want["obs"]
    assert [np.asarray(b).tolist() for b in data["boxes"]] == want["boxes"]
    assert data["text"] == want["text"]


def test_a_storage_whose_directory_was_removed_is_dropped_quietly(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    storage = ArrowStorage(40, path=path, chunk_size=8)
    storage.set(slice(0, 13), rows(range(13)))
    for file in path.iterdir():
        file.unlink()
    path.rmdir()  # e.g. a TemporaryDirectory that ended first
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del storage
        gc.collect()
    assert [str(w.message) for w in caught] == []
    assert not path.exists()  # nothing recreated
