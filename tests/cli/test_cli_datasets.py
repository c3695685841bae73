"""``rbdata datasets ...``: list, download, info, path, remove, and one-line errors, offline.

D4RL files are generated here with h5py in the D4RL layout and served by a local
``http.server`` on 127.0.0.1 behind ``RBDATA_D4RL_MIRROR``; Minari datasets are created
locally with ``minari.create_dataset_from_buffers`` under a temporary ``MINARI_DATASETS_PATH``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from _cli import one_error_line, run

from rbdata._core.resources import catalog_path
from rbdata.cli import main
from rbdata.datasets._catalog import d4rl_catalog
from rbdata.datasets._commands import DatasetRef, parse_id
from tests._d4rl_files import serve

NAME = "hopper-medium-v2"
FILE = "gym_mujoco_v2/hopper_medium-v2.hdf5"  # the catalog path of NAME
ROWS = 50
TERMINALS = (9, 30)  # rows ending an episode by termination ...
TIMEOUTS = (19,)  # ... and by truncation; rows 31..49 are an unfinished last episode


def _write_d4rl_file(path: Path) -> None:
    rng = np.random.default_rng(0)
    terminals = np.zeros(ROWS, bool)
    terminals[list(TERMINALS)] = True
    timeouts = np.zeros(ROWS, bool)
    timeouts[list(TIMEOUTS)] = True
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as h5:
        h5["observations"] = rng.standard_normal((ROWS, 3)).astype(np.float32)
        h5["actions"] = rng.standard_normal((ROWS, 2)).astype(np.float32)
        h5["rewards"] = rng.standard_normal(ROWS).astype(np.float32)
        h5["terminals"] = terminals
        h5["timeouts"] = timeouts
        h5["metadata/algorithm"] = "SAC"
        h5["metadata/policy/fc0/weight"] = np.zeros((64, 3), np.float32)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A mirror on 127.0.0.1 serving a generated D4RL file at FILE: (mirror URL, sha256)."""
    base = tmp_path_factory.mktemp("mirror")
    _write_d4rl_file(base / FILE)
    digest = hashlib.sha256((base / FILE).read_bytes()).hexdigest()
    with serve(base) as (url, _):
        yield url, digest


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RBDATA_HOME", str(root))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.delenv("RBDATA_D4RL_MIRROR", raising=False)
    return root


@pytest.fixture()
def mirror(served: tuple[str, str], home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("RBDATA_D4RL_MIRROR", served[0])
    return served[1]


def d4rl_rows(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines() if line.startswith("d4rl/")]


def files_below(root: Path) -> list[str]:
    """Files under ``root`` other than lock files."""
    if not root.exists():
        return []
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.name.endswith(".lock")
    )


# --- ids -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("hopper-medium-v2", DatasetRef("d4rl", "hopper-medium-v2")),
        ("d4rl/hopper-medium-v2", DatasetRef("d4rl", "hopper-medium-v2")),
        ("minari/mujoco/hopper/medium-v0", DatasetRef("minari", "mujoco/hopper/medium-v0")),
        ("minari/D4RL/door/human-v2", DatasetRef("minari", "D4RL/door/human-v2")),
    ],
)
def test_parse_id(text: str, ref: DatasetRef) -> None:
    assert parse_id(text) == ref


@pytest.mark.parametrize(
    "text", ["D4RL/door/human-v2", "Minari/mujoco/hopper/medium-v0", "mujoco/hopper/medium-v0"]
)
def test_slashed_id_without_prefix_is_an_error(
    home: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    code, out, err = run(capsys, "info", text)
    assert code == 1 and out == ""
    line = one_error_line(err)
    assert f"'minari/{text}'" in line


@pytest.mark.parametrize("text", ["", "d4rl/", "minari/../x", "minari/a b-v0"])
def test_malformed_id(home: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    code, _, err = run(capsys, "path", text)
    assert code == 1
    assert "ID" in one_error_line(err)


@pytest.mark.parametrize("text", ["hoper-medium-v2", "d4rl/hoper-medium-v2"])
def test_unknown_id(home: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    for action in ("download", "info", "path", "remove"):
        code, _, err = run(capsys, action, text)
        assert code == 1
        line = one_error_line(err)
        assert "unknown D4RL dataset 'hoper-medium-v2'; did you mean 'hopper-medium-v2'" in line
        assert "KeyError" not in line and not line.endswith('"')
    assert not home.exists()


# --- list ------------------------------------------------------------------------------------
def test_list_d4rl(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "list", "--family", "d4rl")
    assert code == 0 and err == ""
    rows = d4rl_rows(out)
    catalog = d4rl_catalog()
    assert sum(not e.is_sample for e in catalog.values()) == 183
    assert rows == [f"d4rl/{name}" for name in catalog]
    with open(catalog_path("d4rl-samples.tsv"), encoding="utf-8", newline="") as f:
        samples = [row["id"] for row in csv.DictReader(f, delimiter="\t")]
    assert len(rows) == 183 + len(samples)
    assert {f"d4rl/{s}" for s in samples} <= set(rows)
    line = next(x for x in out.splitlines() if x.startswith(f"d4rl/{NAME} "))
    assert line.split()[1:] == ["145.7", "MiB", "remote", "-"]
    assert "Minari" not in out
    code, out, _ = run(capsys, "list", "--family", "d4rl", "--downloaded")
    assert code == 0 and d4rl_rows(out) == []
    assert "D4RL: 0 datasets in the cache" in out
    assert not home.exists()  # listing creates nothing


def test_list_without_minari(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "minari", None)  # `import minari` raises ImportError
    code, out, err = run(capsys, "list")
    assert code == 0 and err == ""
    assert len(d4rl_rows(out)) == len(d4rl_catalog())
    assert "pip install 'rbdata[minari]'" in out
    code, out, err = run(capsys, "list", "--family", "minari", "--remote")
    assert code == 1
    assert "pip install 'rbdata[minari]'" in one_error_line(err)


def test_list_remote_failure_is_one_line(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    minari = pytest.importorskip("minari")

    def offline(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(minari, "list_remote_datasets", offline)
    code, out, err = run(capsys, "list", "--family", "minari", "--remote")
    assert code == 1
    assert "Minari: 0 datasets local, cached, remote" in out
    line = one_error_line(err)
    assert "could not list remote Minari datasets: network is unreachable" in line


# --- download, info, path, remove ------------------------------------------------------------
def test_download_info_path_remove(
    mirror: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = home / "d4rl" / NAME / "memmap"
    download = home / "d4rl" / "downloads" / FILE
    code, out, err = run(capsys, "download", f"d4rl/{NAME}", "--sha256", mirror)
    assert code == 0, err
    assert "Traceback" not in err
    path, summary = out.splitlines()
    assert Path(path) == entry and (entry / "dataset.json").is_file() and download.is_file()
    assert summary.startswith(f"d4rl/{NAME} (memmap): {ROWS} transitions, 4 episodes, ")
    assert "already" not in summary
    code, out, _ = run(capsys, "download", NAME, "--sha256", mirror)  # a bare name works
    assert code == 0 and out.splitlines()[1].endswith("(already converted)")

    code, out, _ = run(capsys, "list", "--downloaded")
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("d4rl/"))
    assert line.split() == [f"d4rl/{NAME}", "145.7", "MiB", "downloaded", "memmap"]
    assert len(d4rl_rows(out)) == 1

    code, out, err = run(capsys, "info", f"d4rl/{NAME}")
    assert code == 0 and err == ""
    fields = dict(x.split(":", 1) for x in out.splitlines() if not x.startswith(" "))
    assert fields["transitions"].strip() == str(ROWS)
    assert fields["episodes"].strip() == "4"
    assert fields["backend"].strip() == "memmap"
    assert fields["source"].strip() == mirror_url(FILE)
    assert fields["sha256"].strip() == f"{mirror} (verified: the digest given with --sha256)"
    keys = {x.split()[0]: x.split()[1:] for x in out.split("keys (")[1].splitlines()[2:]}
    assert keys["observation"] == ["[3]", "float32"]
    assert keys["action"] == ["[2]", "float32"]
    assert keys["next.reward"] == ["[1]", "float32"]  # spelled as `rbdata inspect` does
    assert keys["next.done"] == ["[1]", "bool"]
    assert keys["episode"] == ["[]", "int64"]
    assert main(["inspect", str(entry)]) == 0
    inspected = capsys.readouterr().out
    rows = [x.split() for x in inspected.split("keys (")[1].splitlines()[2:]]
    assert ["next.reward", "[1]", "float32"] in rows and ["next.done", "[1]", "bool"] in rows
    assert "  algorithm: SAC" in out
    assert "  policy/fc0/weight: <list 64x3>" in out

    code, out, err = run(capsys, "path", f"d4rl/{NAME}")
    assert (code, out, err) == (0, f"{entry}\n", "")
    code, out, err = run(capsys, "path", f"d4rl/{NAME}", "--backend", "arrow")
    assert code == 1 and out == f"{entry.parent / 'arrow'}\n" and "not converted" in err
    code, out, _ = run(capsys, "path")
    assert (code, out) == (0, f"{home}\n")

    code, out, err = run(capsys, "remove", f"d4rl/{NAME}")
    assert code == 0 and err == ""
    assert f"removed {entry} (" in out and f"removed {download} (" in out
    assert f"shared with d4rl/{NAME}" not in out
    assert not entry.exists() and not download.exists()
    assert files_below(home) == []
    code, out, err = run(capsys, "path", f"d4rl/{NAME}")
    assert code == 1 and out == f"{entry}\n"
    code, _, err = run(capsys, "remove", f"d4rl/{NAME}")
    assert code == 1 and "nothing to remove" in one_error_line(err)
    code, out, err = run(capsys, "info", f"d4rl/{NAME}")
    assert code == 1 and "converted:    no" in out and "not converted" in err


def mirror_url(file: str) -> str:
    return os.environ["RBDATA_D4RL_MIRROR"].rstrip("/") + "/" + file


def test_remove_backends_and_keep_download(
    mirror: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for backend in ("memmap", "arrow"):
        code, _, err = run(capsys, "download", NAME, "--sha256", mirror, "--backend", backend)
        assert code == 0, err
    code, out, _ = run(capsys, "list", "--downloaded", "--family", "d4rl")
    assert out.splitlines()[-1].split()[-1] == "memmap,arrow"
    code, out, _ = run(capsys, "remove", NAME, "--backend", "arrow", "--keep-download")
    assert code == 0 and f"kept: d4rl/{NAME} (memmap)" in out
    assert (home / "d4rl" / "downloads" / FILE).is_file()
    code, out, _ = run(capsys, "info", NAME)  # memmap: the one left
    assert code == 0 and "backend:      memmap" in out
    code, out, _ = run(capsys, "remove", NAME, "--all-backends")
    assert code == 0 and "kept" not in out
    assert files_below(home) == []


def test_info_shows_the_only_backend(
    mirror: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run(capsys, "download", NAME, "--sha256", mirror, "--backend", "arrow")
    assert code == 0
    code, out, _ = run(capsys, "info", NAME)
    assert code == 0 and "backend:      arrow" in out
    code, out, _ = run(capsys, "path", NAME)
    assert code == 0 and out.strip().endswith("arrow")


def test_catalog_checksum_refuses_the_file(
    mirror: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "download", f"d4rl/{NAME}")
    assert code == 1 and out == ""
    line = one_error_line(err)
    assert f"'{NAME}'" in line and "expected 152756557 bytes" in line and "got " in line
    assert files_below(home) == []
    code, _, _ = run(capsys, "info", NAME)
    assert code == 1


def test_bad_sha256_argument(mirror: str, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "download", NAME, "--sha256", "abc")
    assert code == 1 and "sha256 must be 64 hex digits" in one_error_line(err)
    assert files_below(home) == []


def test_remove_refuses_symlinks(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "dataset.json").write_text("{}")
    entry = home / "d4rl" / NAME / "memmap"
    entry.parent.mkdir(parents=True)
    entry.symlink_to(outside, target_is_directory=True)
    code, _, err = run(capsys, "remove", NAME)
    assert code == 1 and "symbolic link" in one_error_line(err)
    assert (outside / "dataset.json").is_file() and entry.is_symlink()


def test_remove_refuses_a_recorded_file_outside_downloads(
    mirror: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run(capsys, "download", NAME, "--sha256", mirror)
    assert code == 0
    victim = home / "d4rl" / "keep.bin"
    victim.write_bytes(b"x")
    meta_file = home / "d4rl" / NAME / "memmap" / "dataset.json"
    meta = json.loads(meta_file.read_text())
    meta["source"]["file"] = "d4rl/downloads/../keep.bin"  # a tampered dataset.json
    meta_file.write_text(json.dumps(meta))
    code, _, err = run(capsys, "remove", NAME)
    assert code == 1 and "refusing to remove" in one_error_line(err)
    assert victim.is_file()


def test_url_file_and_sha256_are_for_d4rl_only(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for option, value in (("--url", "http://x/"), ("--file", "x.hdf5"), ("--sha256", "ab" * 32)):
        code, _, err = run(capsys, "download", "minari/test/tiny/random-v0", option, value)
        assert code == 1 and "D4RL ids only" in one_error_line(err)


def test_bad_arguments_exit_2(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["datasets", "remove", NAME, "--backend", "arrow", "--all-backends"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["datasets", "info", NAME, "--backend", "parquet"])
    assert exc.value.code == 2
    capsys.readouterr()


# --- Minari ----------------------------------------------------------------------------------
MINARI_ID = "test/tiny/random-v0"


@pytest.fixture()
def minari_local(home: Path) -> str:
    """A tiny Minari dataset (3 episodes of 5 steps) in the temporary MINARI_DATASETS_PATH."""
    minari = pytest.importorskip("minari")
    gym = pytest.importorskip("gymnasium")
    from minari.data_collector import EpisodeBuffer

    rng = np.random.default_rng(0)
    episodes = [
        EpisodeBuffer(
            observations=rng.standard_normal((6, 3)).astype(np.float32),
            actions=rng.standard_normal((5, 2)).astype(np.float32),
            rewards=list(np.ones(5)),
            terminations=[False] * 4 + [True],
            truncations=[False] * 5,
        )
        for _ in range(3)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Minari's reminders to set author, env, ...
        minari.create_dataset_from_buffers(
            MINARI_ID,
            episodes,
            observation_space=gym.spaces.Box(-1, 1, (3,), np.float32),
            action_space=gym.spaces.Box(-1, 1, (2,), np.float32),
            algorithm_name="random",
        )
    return MINARI_ID


def test_minari_list_download_info_remove(
    minari_local: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "list", "--family", "minari")
    assert code == 0
    assert f"minari/{MINARI_ID}  <0.1 MB  local  -" in out
    pytest.importorskip("rbdata.datasets.minari")
    entry = home / "minari" / "test" / "tiny" / "random-v0" / "memmap"
    code, out, err = run(capsys, "download", f"minari/{MINARI_ID}")
    assert code == 0, err
    path, summary = out.splitlines()
    assert Path(path) == entry
    assert summary.startswith(f"minari/{MINARI_ID} (memmap): 15 transitions, 3 episodes, ")
    code, out, _ = run(capsys, "list", "--downloaded")
    assert f"minari/{MINARI_ID}  <0.1 MB  local  memmap" in out
    assert "D4RL: 0 datasets in the cache" in out
    code, out, err = run(capsys, "info", f"minari/{MINARI_ID}")
    assert code == 0 and err == ""
    assert "transitions:  15" in out and "episodes:     3" in out
    keys = {x.split()[0]: x.split()[1:] for x in out.split("keys (")[1].splitlines()[2:]}
    assert keys["observation"] == ["[3]", "float32"]
    assert keys["next.observation"] == ["[3]", "float32"]
    assert keys["action"] == ["[2]", "float32"]
    assert "  algorithm_name: random" in out
    code, out, _ = run(capsys, "remove", f"minari/{MINARI_ID}")
    assert code == 0 and f"removed {entry}" in out and not entry.exists()
    assert (home.parent / "minari" / MINARI_ID / "data").is_dir()  # Minari's copy stays
