"""``rbdata datasets ...`` for the ``atari-dqn/`` family: list, download, info, path, remove.

Dopamine-format checkpoints are generated here (``tests/_atari_dqn_files.py``) and served by a
local HTTP server on 127.0.0.1 behind ``RBDATA_ATARI_DQN_MIRROR``.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cli import one_error_line, run
from _paths import ROOT_DIR

from rbdata.datasets._commands import DatasetRef, parse_id
from tests._atari_dqn_files import reference, serve_ranges, write_run

PACKAGE = ROOT_DIR / "rbdata"
LOGS = "Breakout/2/replay_logs"


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RBDATA_HOME", str(root))
    monkeypatch.delenv("RBDATA_ATARI_DQN_MIRROR", raising=False)
    return root


@pytest.fixture()
def mirror(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    files = tmp_path / "bucket"
    write_run(files / LOGS, seed=3)
    with serve_ranges(files) as (url, requests):
        monkeypatch.setenv("RBDATA_ATARI_DQN_MIRROR", url)
        yield {"url": url, "dir": files, "requests": requests}


def rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.startswith("atari-dqn/")]


def test_parse_id() -> None:
    assert parse_id("atari-dqn/Pong/1") == DatasetRef("atari-dqn", "Pong/1/50")
    assert parse_id("atari-dqn/Pong/1/50") == DatasetRef("atari-dqn", "Pong/1/50")
    assert parse_id("atari-dqn/Pong/5/49+48+47") == DatasetRef("atari-dqn", "Pong/5/47-49")
    with pytest.raises(ValueError, match="atari-dqn/<Game>/<run>"):
        parse_id("Pong/1")
    with pytest.raises(ValueError, match="not a DQN Replay id"):
        parse_id("atari-dqn/Pong")


def test_list_every_game_and_run(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "list", "--family", "atari-dqn")
    assert code == 0 and err == ""
    ids = [row[0] for row in rows(out)]
    assert len(ids) == 300 and ids[0] == "atari-dqn/AirRaid/1" and ids[-1] == "atari-dqn/Zaxxon/5"
    assert rows(out)[0][1:] == ["?", "remote", "-"]
    assert "D4RL" not in out and not home.exists()
    code, out, _ = run(capsys, "list", "--family", "atari-dqn", "--downloaded")
    assert code == 0 and rows(out) == [] and "0 datasets in the cache" in out
    code, out, _ = run(capsys, "list")
    assert code == 0 and len(rows(out)) == 300 and "OGBench" in out


def test_the_catalog_needs_no_torch() -> None:
    """`datasets list` reads the DQN Replay catalog and its rows with the stdlib only."""
    allowed = {
        "__future__",
        "csv",
        "difflib",
        "functools",
        "dataclasses",
        "pathlib",
        "typing",
        "urllib.parse",
        "os",
        "collections.abc",
    }
    allowed.add("importlib")  # the package imports the dataset (torch) on first use
    for module in ("datasets/atari/_catalog.py", "datasets/atari/__init__.py"):
        tree = ast.parse((PACKAGE / module).read_text(encoding="utf-8"))
        for node in tree.body:  # module level: the download imports the dataset on use
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert all(
                n in allowed or n in ("rbdata._core.resources", "rbdata.datasets.atari._catalog")
                for n in names
            ), (module, names)


def test_download_info_path_remove(mirror: dict, home: Path, capsys) -> None:
    entry = home / "atari-dqn" / "Breakout" / "2" / "1-2" / "frames"
    downloads = home / "atari-dqn" / "downloads" / LOGS
    code, out, err = run(capsys, "download", "atari-dqn/Breakout/2/1-2")
    assert code == 0, err
    path, summary = out.splitlines()
    expected = reference(mirror["dir"] / LOGS, [1, 2])
    episodes = expected[-1]["episode"] + 1
    assert Path(path) == entry
    assert summary.startswith(
        f"atari-dqn/Breakout/2/1-2 (frames): {len(expected)} transitions, {episodes} episodes"
    )
    assert len(mirror["requests"]) == 12 and len(list(downloads.iterdir())) == 12

    code, out, _ = run(capsys, "list", "--family", "atari-dqn", "--downloaded")
    assert rows(out) == [["atari-dqn/Breakout/2", "?", "2", "ckpts", "1-2"]]

    code, out, err = run(capsys, "info", "atari-dqn/Breakout/2/2+1")
    assert code == 0 and err == ""
    fields = dict(x.split(":", 1) for x in out.splitlines() if not x.startswith(" "))
    assert fields["checkpoints"].strip() == "[1, 2]" and fields["codec"].strip() == "lz4"
    assert fields["source"].strip() == mirror["url"] + LOGS + "/"
    files = [x.split()[1:] for x in out.splitlines() if x.startswith("source.file:")]
    assert len(files) == 12
    name = "$store$_observation_ckpt.2.gz"
    digest = hashlib.sha256((downloads / name).read_bytes()).hexdigest()
    assert [name, *files[[f[0] for f in files].index(name)][1:]][-2:] == [digest, "(computed)"]
    keys = {x.split()[0]: x.split()[1:] for x in out.split("keys (")[1].splitlines()[2:]}
    assert keys["observation"] == ["[4,", "6,", "5]", "uint8"]

    code, out, err = run(capsys, "path", "atari-dqn/Breakout/2/1-2")
    assert (code, out, err) == (0, f"{entry}\n", "")
    code, out, err = run(capsys, "info", "atari-dqn/Breakout/2")
    assert code == 1 and "converted:    no" in out
    bucket = "https://storage.googleapis.com/atari-replay-datasets/dqn/Breakout/2/replay_logs/"
    assert f"url:          {bucket}" in out
    assert "rbdata datasets download atari-dqn/Breakout/2/50" in err

    code, out, err = run(capsys, "remove", "atari-dqn/Breakout/2/1-2")
    assert code == 0 and err == ""
    assert f"removed {entry} (" in out and f"removed {downloads / name} (" in out
    assert not (home / "atari-dqn").exists()
    code, _, err = run(capsys, "remove", "atari-dqn/Breakout/2/1-2")
    assert code == 1 and "nothing to remove" in one_error_line(err)


def test_download_a_local_folder(home: Path, tmp_path: Path, capsys) -> None:
    write_run(tmp_path / "mine" / "replay_logs", seed=5)
    code, _, err = run(capsys, "download", "atari-dqn/Pong/3/4", "--file", str(tmp_path / "mine"))
    assert code == 0, err
    assert not (home / "atari-dqn" / "downloads").exists()
    code, _, err = run(capsys, "remove", "atari-dqn/Pong/3/4")
    assert code == 0 and (tmp_path / "mine" / "replay_logs" / "add_count_ckpt.4.gz").is_file()
    for extra in (["--sha256", "ab" * 32], ["--url", "http://x/"], ["--backend", "arrow"]):
        code, _, err = run(capsys, "download", "atari-dqn/Pong/3/4", *extra)
        assert code == 1 and extra[0] in one_error_line(err)


@pytest.mark.parametrize("text", ["atari-dqn/Pongg/1", "atari-dqn/Pong/6", "atari-dqn/Pong/1/51"])
def test_unknown_id(home: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    for action in ("download", "info", "path", "remove"):
        code, _, err = run(capsys, action, text)
        assert code == 1
        line = one_error_line(err)
        assert "did you mean 'Pong'" in line or "expected" in line
    assert not home.exists()
