"""``rbdata inspect PATH``: storage directories, checkpoints and cache entries, data unread.

Every expectation comes from the objects that wrote the files (``len(storage)``,
``capacity``, ``next_slot``, the layout, the sampler's and writer's own state) or from the
data written; errors are checked for exit code 1 and one ``rbdata: error:`` line.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _paths import ROOT_DIR
from tensordict import TensorDict

from rbdata import (
    ArrowStorage,
    ListStorage,
    MemmapStorage,
    PrioritizedSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorStorage,
)
from rbdata.cli import main
from rbdata.errors import CheckpointError
from rbdata.inspect import inspect_path
from rbdata.samplers._trees import sumtree as _sumtree

ROOT = ROOT_DIR


def transitions(n: int, start: int = 0) -> TensorDict:
    return TensorDict(
        {
            "observation": torch.randn(n, 4),
            "action": torch.arange(start, start + n),
            "next": {"reward": torch.randn(n, 1), "done": torch.zeros(n, 1, dtype=torch.bool)},
        },
        batch_size=[n],
    )


#: the per-item shape and dtype of every key of ``transitions`` (what was written)
WRITTEN = {
    ("observation",): ([4], "float32"),
    ("action",): ([], "int64"),
    ("next", "reward"): ([1], "float32"),
    ("next", "done"): ([1], "bool"),
}


def inspect(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def as_json(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    code, out, err = inspect(capsys, "--json", str(path))
    assert (code, err) == (0, "")
    return json.loads(out)


def field(out: str, name: str) -> str:
    """The value of the ``name:`` line of a text report."""
    values = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith(name)]
    assert len(values) == 1, out
    return values[0]


def check_storage_fields(report: dict[str, Any], storage: Any, fmt: str) -> None:
    """The storage part of a JSON report against the live storage and the data written."""
    st = report["storage"]
    assert st["format"] == fmt
    assert (st["capacity"], st["length"], st["next_slot"]) == (
        storage.capacity,
        len(storage),
        storage.next_slot,
    )
    layout = [
        (list(leaf.key), list(leaf.shape), str(leaf.dtype).removeprefix("torch."))
        for leaf in storage.layout.leaves
    ]
    assert [(k["key"], k["shape"], k["dtype"]) for k in st["keys"]] == layout
    assert {tuple(k["key"]): (k["shape"], k["dtype"]) for k in st["keys"]} == WRITTEN


def disk_size(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


# --- storage directories ---------------------------------------------------------------------
def test_memmap_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mm"
    rb = ReplayBuffer(MemmapStorage(100, path=path))
    rb.extend(transitions(70))
    rb.extend(transitions(50, start=70))  # the ring wrapped: next slot 20, length 100
    report = as_json(capsys, path)  # while the writing process still has it open
    assert report["kind"] == "memmap" and report["storage_class"] == "MemmapStorage"
    check_storage_fields(report, rb.storage, "memmap")
    assert report["size_bytes"] == disk_size(path)
    assert report["path"] == os.path.abspath(path) and report["problems"] == []

    code, out, err = inspect(capsys, str(path))
    assert (code, err) == (0, "")
    assert field(out, "kind") == "MemmapStorage directory"
    assert field(out, "capacity") == f"{rb.storage.capacity:,}"
    assert field(out, "length") == f"{len(rb.storage):,}"
    assert field(out, "next slot") == str(rb.storage.next_slot)
    assert "  next.reward  [1]    float32" in out.splitlines()
    rb.storage.close()


def test_empty_memmap_directory_has_no_keys(tmp_path: Path) -> None:
    storage = MemmapStorage(10, path=tmp_path / "new")
    summary = inspect_path(tmp_path / "new")
    assert (summary.storage.capacity, summary.storage.length, summary.storage.keys) == (10, 0, ())
    storage.close()


def test_arrow_directory_flushed_and_with_a_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "arrow"
    storage = ArrowStorage(64, path=path, chunk_size=16, ragged=("boxes",))
    batch = {
        "boxes": [torch.ones(i % 3, 4) for i in range(40)],
        "text": [f"item {i}" for i in range(40)],
        "score": torch.arange(40.0),
    }
    storage.set(slice(0, 40), batch)
    # not flushed: the metadata still says 0 rows, the journal holds the write
    pending = inspect_path(path)
    assert pending.storage.length == 0 and "journal" in pending.storage.details
    storage.flush()
    report = as_json(capsys, path)
    st = report["storage"]
    assert (st["capacity"], st["length"], st["next_slot"]) == (64, len(storage), 40 % 64)
    assert st["details"] == {"chunk_size": storage.chunk_size}
    kinds = {tuple(k["key"]): (k["kind"], k["shape"]) for k in st["keys"]}
    layout = {leaf.key: (leaf.kind, list(leaf.shape)) for leaf in storage.layout.leaves}
    written = {("boxes",): ("ragged", [4]), ("text",): ("string", []), ("score",): ("tensor", [])}
    assert kinds == layout == written
    code, out, _ = inspect(capsys, str(path))
    assert code == 0 and field(out, "kind") == "ArrowStorage directory"
    assert field(out, "chunk size") == "16"
    assert any(line.split()[:2] == ["boxes", "[*,"] for line in out.splitlines())
    storage.close()


def test_no_data_file_is_opened_or_mapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rb = ReplayBuffer(MemmapStorage(50), PrioritizedSampler(50, alpha=0.6, beta=0.4), batch_size=4)
    rb.extend(transitions(30))
    rb.dumps(tmp_path / "ckpt")
    arrow = ArrowStorage(50, path=tmp_path / "arrow", chunk_size=8)
    arrow.set(slice(0, 30), transitions(30))
    arrow.close()
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.fspath(file) if not isinstance(file, int) else "")
        return real_open(file, *args, **kwargs)

    def spy_os_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.fspath(file))
        return real_os_open(file, *args, **kwargs)

    def no_mmap(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("inspect mapped a file")

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    monkeypatch.setattr(mmap, "mmap", no_mmap)
    inspect_path(tmp_path / "ckpt")
    inspect_path(tmp_path / "arrow")
    names = {Path(p).name for p in opened}
    assert names and not {n for n in names if n.endswith((".bin", ".arrow"))} - {
        "header.bin",
        "tensors.bin",  # its sum/min tree roots: one pread of 4 bytes each
    }
    rb.storage.close()


# --- checkpoints -----------------------------------------------------------------------------
def test_prioritized_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ckpt"
    sampler = PrioritizedSampler(
        200, alpha=0.7, beta=0.4, generator=torch.Generator().manual_seed(0)
    )
    rb = ReplayBuffer(MemmapStorage(200), sampler, batch_size=32)
    rb.extend(transitions(150))
    rb.extend(transitions(90, start=150))
    batch = rb.sample()
    rb.update_priority(batch["index"], torch.rand(32) * 5 + 0.1)
    rb.dumps(path)

    report = as_json(capsys, path)
    assert report["kind"] == "checkpoint" and report["storage_class"] == "MemmapStorage"
    check_storage_fields(report, rb.storage, "memmap")
    live = (path / "CURRENT").read_text().strip()
    ckpt = report["checkpoint"]
    assert (ckpt["live"], ckpt["batch_size"], ckpt["checksums"]) == (live, rb.batch_size, True)
    assert report["size_bytes"] == disk_size(path)

    state = rb.sampler.state_dict()
    tree = state["sum_tree"]
    leaves = tree[_sumtree.leaf_offset(tree) :][: sampler.capacity].double()
    shown = ckpt["sampler"]
    assert shown["class"] == "PrioritizedSampler"
    assert {k: shown["config"][k] for k in ("capacity", "alpha", "beta", "eps")} == {
        "capacity": sampler.capacity,
        "alpha": sampler.alpha,
        "beta": sampler.beta,
        "eps": sampler.eps,
    }
    assert shown["state"]["max_priority"] == state["max_priority"]
    # the tree's root against a brute-force sum and minimum of its leaves
    assert shown["state"]["total_priority"] == pytest.approx(float(leaves.sum()), rel=1e-5)
    assert shown["state"]["min_priority"] == pytest.approx(float(leaves[leaves > 0].min()))
    assert shown["state"]["sum_tree"] == f"<tensor float32 [{tree.numel()}]>"
    assert ckpt["writer"] == {
        "class": "RoundRobinWriter",
        "config": {},
        "state": {"cursor": rb.writer.cursor},
    }

    code, out, _ = inspect(capsys, str(path))
    assert code == 0 and field(out, "kind") == f"ReplayBuffer checkpoint (live: {live})"
    assert field(out, "batch size") == "32"
    assert field(out, "sampler") == "PrioritizedSampler"
    assert field(out, "    alpha") == "0.7" and field(out, "    cursor") == str(rb.writer.cursor)
    # the live subdirectory itself is a checkpoint too
    assert as_json(capsys, path / live)["storage"] == report["storage"]
    rb.storage.close()


@pytest.mark.parametrize("kind", ["tensor", "arrow", "list"])
def test_other_storage_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    storage: Any = {
        "tensor": lambda: TensorStorage(40),
        "arrow": lambda: ArrowStorage(40, chunk_size=16),
        "list": lambda: ListStorage(40),
    }[kind]()
    rb = ReplayBuffer(storage, SamplerWithoutReplacement(), batch_size=8)
    rb.extend(transitions(30))
    rb.sample()
    rb.dumps(tmp_path / "ckpt")
    report = as_json(capsys, tmp_path / "ckpt")
    assert report["storage_class"] == type(storage).__name__
    check_storage_fields(report, storage, {"tensor": "memmap"}.get(kind, kind))
    shown = report["checkpoint"]["sampler"]
    assert shown["class"] == "SamplerWithoutReplacement"
    assert shown["state"]["pos"] == rb.sampler.state_dict()["pos"] == 8
    assert shown["config"] == {k: v for k, v in rb.sampler.config().items()}


def test_unregistered_writer_class_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rb = ReplayBuffer(MemmapStorage(10))
    rb.extend(transitions(4))
    rb.dumps(tmp_path / "ckpt")
    live = tmp_path / "ckpt" / (tmp_path / "ckpt" / "CURRENT").read_text().strip()
    meta = json.loads((live / "checkpoint.json").read_text())
    meta["writer"]["class"] = "their_project.writers.CustomWriter"  # another program's class
    (live / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="unknown class"):
        ReplayBuffer.loads(tmp_path / "ckpt")
    code, out, _ = inspect(capsys, str(tmp_path / "ckpt"))
    assert code == 0
    assert field(out, "writer") == "their_project.writers.CustomWriter (not registered here)"
    assert field(out, "    cursor") == str(rb.writer.cursor)
    rb.storage.close()


# --- offline dataset cache entries -------------------------------------------------------------
def test_d4rl_cache_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rbdata.datasets import D4RL
    from tests._d4rl_files import serve, write_d4rl_file

    file = tmp_path / "src" / "data.hdf5"
    file.parent.mkdir()
    write_d4rl_file(file, n=120)
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    with serve(file.parent) as (url, _):
        ds = D4RL(
            "hopper-medium-v2",
            tmp_path / "home",
            url=url + "data.hdf5",
            sha256=digest,
            progress=False,
        )
    report = as_json(capsys, ds.path)
    assert report["kind"] == "dataset"
    assert report["dataset"]["id"] == "hopper-medium-v2"
    assert report["dataset"]["transitions"] == len(ds) == report["storage"]["length"]
    assert report["dataset"]["episodes"] == ds.num_episodes
    keys = [list(leaf.key) for leaf in ds.storage.layout.leaves]
    assert [k["key"] for k in report["storage"]["keys"]] == keys
    assert report["problems"] == []
    ds.storage.close()


# --- problems and errors -----------------------------------------------------------------------
def test_truncated_data_file_is_a_problem_not_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mm"
    storage = MemmapStorage(20, path=path)
    storage.set(slice(0, 5), transitions(5))
    storage.close()
    leaf = sorted(path.glob("*-observation.bin"))[0]
    os.truncate(leaf, 10)
    with pytest.raises(ValueError, match="truncated"):  # what open says
        MemmapStorage.open(path)
    code, out, _ = inspect(capsys, str(path))
    assert code == 0
    expected = 20 * 4 * torch.float32.itemsize + 32  # capacity x 4 floats, the id trailer
    problem = f"{leaf.name}: 10 bytes, expected {expected} for key 'observation'"
    assert field(out, "problem") == problem


def test_pending_memmap_journal_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "mm"
    rb = ReplayBuffer(MemmapStorage(8, path=path))
    rb.extend(transitions(8))
    rb.extend(transitions(3))  # an overwrite: goes through the journal, then cleared
    rb.storage.close()
    assert "journal" not in inspect_path(path).storage.details
    with open(path / "journal.bin", "r+b") as f:  # a commit word, as a killed writer leaves
        f.seek(8)
        f.write((1 << 62).to_bytes(8, "little"))
    assert "journal" in inspect_path(path).storage.details


def error_of(capsys: pytest.CaptureFixture[str], path: Path) -> str:
    code, out, err = inspect(capsys, str(path))
    assert (code, out) == (1, "")
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("rbdata: error: "), err
    return err


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "no such file" in error_of(capsys, tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    assert "an empty directory, not a storage" in error_of(capsys, tmp_path / "empty")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("hello")
    assert "not a storage directory or checkpoint" in error_of(capsys, tmp_path / "other")
    (tmp_path / "file.bin").write_bytes(os.urandom(64))
    assert "is a file" in error_of(capsys, tmp_path / "file.bin")


def test_corrupt_metadata(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mm"
    MemmapStorage(10, path=path).close()
    (path / "layout.json").write_text('{"format": "rbdata.memmap", "version": 1, "capa')
    assert "layout.json: corrupt metadata file" in error_of(capsys, path)
    (path / "layout.json").write_text('{"format": "rbdata.memmap", "version": 1, "capacity": -3}')
    assert "field 'capacity' is -3" in error_of(capsys, path)

    MemmapStorage(10, path=tmp_path / "hdr").close()
    (tmp_path / "hdr" / "header.bin").write_bytes(os.urandom(64))
    with pytest.raises(ValueError) as opened:
        MemmapStorage.open(tmp_path / "hdr")
    assert str(opened.value) in error_of(capsys, tmp_path / "hdr")  # the same check as open


def test_corrupt_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ckpt"
    rb = ReplayBuffer(MemmapStorage(10))
    rb.extend(transitions(4))
    rb.dumps(path)
    live = path / (path / "CURRENT").read_text().strip()
    meta = json.loads((live / "checkpoint.json").read_text())
    meta["storage"]["class"] = "os.system"
    (live / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as loading:
        ReplayBuffer.loads(path)
    assert str(loading.value) in error_of(capsys, path)
    (live / "checkpoint.json").write_text("[1, 2")
    assert "checkpoint.json: corrupt metadata file" in error_of(capsys, path)
    (path / "CURRENT").write_text("../elsewhere\n")
    assert "not a checkpoint subdirectory" in error_of(capsys, path)
    rb.storage.close()


def test_symlinks_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = MemmapStorage(10, path=tmp_path / "real")
    storage.set(slice(0, 2), transitions(2))
    storage.close()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert "symlink" in error_of(capsys, tmp_path / "link")
    layout = tmp_path / "real" / "layout.json"
    (tmp_path / "layout.json").write_bytes(layout.read_bytes())
    layout.unlink()
    layout.symlink_to(tmp_path / "layout.json")
    assert "symlink" in error_of(capsys, tmp_path / "real")


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["inspect"])
    assert exc.value.code == 2
    assert "PATH" in capsys.readouterr().err


def test_python_dash_m(tmp_path: Path) -> None:
    path = tmp_path / "mm"
    storage = MemmapStorage(16, path=path)
    storage.set(slice(0, 6), transitions(6))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "rbdata", "inspect", "--json", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    st = json.loads(run.stdout)["storage"]
    assert (st["capacity"], st["length"], st["next_slot"]) == (16, len(storage), 6)
    storage.close()
