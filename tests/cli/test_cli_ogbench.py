"""``rbdata datasets ...`` for the ``ogbench/`` family: list, download, info, path, remove.

OGBench files are generated here in the OGBench layout and served by a local ``http.server``
on 127.0.0.1 behind ``RBDATA_OGBENCH_MIRROR``.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cli import one_error_line, run
from _paths import ROOT_DIR

from rbdata.datasets._catalog import ogbench_catalog
from rbdata.datasets._commands import DatasetRef, parse_id
from tests._d4rl_files import serve
from tests._ogbench_files import expected_episodes, write_ogbench_file

NAME = "cube-single-play-v0"
PACKAGE = ROOT_DIR / "rbdata"


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RBDATA_HOME", str(root))
    monkeypatch.delenv("RBDATA_OGBENCH_MIRROR", raising=False)
    return root


@pytest.fixture()
def mirror(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    files = tmp_path / "mirror"
    arrays = {
        "train": write_ogbench_file(files / f"{NAME}.npz", n=120),
        "val": write_ogbench_file(files / f"{NAME}-val.npz", n=30, seed=3),
    }
    with serve(files) as (url, requests):
        monkeypatch.setenv("RBDATA_OGBENCH_MIRROR", url)
        yield {"url": url, "arrays": arrays, "dir": files, "requests": requests}


def rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.startswith("ogbench/")]


def test_parse_id() -> None:
    assert parse_id(f"ogbench/{NAME}") == DatasetRef("ogbench", NAME)
    assert parse_id(f"ogbench/{NAME}-val") == DatasetRef("ogbench", f"{NAME}-val")


def test_list_every_id_and_split(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "list", "--family", "ogbench")
    assert code == 0 and err == ""
    ids = [row[0] for row in rows(out)]
    catalog = ogbench_catalog()
    assert len(catalog) == 85  # OGBench's README: "85 datasets"
    assert ids == [f"ogbench/{n}{s}" for n in catalog for s in ("", "-val")]
    assert rows(out)[0][1:] == ["?", "remote", "-"]
    assert "D4RL" not in out and not home.exists()
    code, out, _ = run(capsys, "list", "--family", "ogbench", "--downloaded")
    assert code == 0 and rows(out) == [] and "OGBench: 0 datasets in the cache" in out


def test_the_catalog_needs_no_torch() -> None:
    """`datasets list` reads the OGBench catalog only: stdlib and the catalog locator.

    The catalogs' module also holds the ``minari`` extra's import (done on use) and the
    torch-free ``rbdata.errors``.
    """
    allowed = {"__future__", "csv", "difflib", "functools", "dataclasses", "pathlib"}
    allowed |= {"os", "collections.abc", "contextlib", "typing", "rbdata.errors", "minari"}
    for module in ("datasets/_catalog.py", "_core/resources.py"):
        tree = ast.parse((PACKAGE / module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert all(n in allowed or n == "rbdata._core.resources" for n in names), (
                module,
                names,
            )


def test_download_info_path_remove(mirror: dict, home: Path, capsys) -> None:
    train = home / "ogbench" / NAME / "memmap"
    val = home / "ogbench" / f"{NAME}-val" / "memmap"
    download = home / "ogbench" / "downloads" / f"{NAME}-val.npz"
    code, out, err = run(capsys, "download", f"ogbench/{NAME}-val")
    assert code == 0, err
    path, summary = out.splitlines()
    assert Path(path) == val and download.is_file() and not train.exists()
    episodes = expected_episodes(mirror["arrays"]["val"])
    assert summary.startswith(f"ogbench/{NAME}-val (memmap): 30 transitions, {episodes} episodes")
    assert mirror["requests"] == [f"/{NAME}-val.npz"]

    code, out, _ = run(capsys, "list", "--family", "ogbench", "--downloaded")
    assert rows(out) == [[f"ogbench/{NAME}-val", "?", "downloaded", "memmap"]]

    code, out, err = run(capsys, "info", f"ogbench/{NAME}-val")
    assert code == 0 and err == ""
    fields = dict(x.split(":", 1) for x in out.splitlines() if not x.startswith(" "))
    assert fields["split"].strip() == "val" and fields["layout"].strip() == "compact"
    assert fields["source"].strip() == mirror["url"] + f"{NAME}-val.npz"
    digest = hashlib.sha256(download.read_bytes()).hexdigest()
    assert fields["sha256"].strip() == f"{digest} (not verified: no digest was expected)"
    keys = {x.split()[0]: x.split()[1:] for x in out.split("keys (")[1].splitlines()[2:]}
    assert keys["next.valid"] == ["[1]", "bool"] and keys["info.button_states"] == ["[2]", "int64"]

    code, out, err = run(capsys, "path", f"ogbench/{NAME}-val")
    assert (code, out, err) == (0, f"{val}\n", "")
    code, out, err = run(capsys, "info", f"ogbench/{NAME}")
    assert code == 1 and "converted:    no" in out
    assert f"url:          https://rail.eecs.berkeley.edu/datasets/ogbench/{NAME}.npz" in out
    assert f"rbdata datasets download ogbench/{NAME}" in err

    code, out, err = run(capsys, "remove", f"ogbench/{NAME}-val")
    assert code == 0 and err == ""
    assert f"removed {val} (" in out and f"removed {download} (" in out
    assert not (home / "ogbench").exists()
    code, _, err = run(capsys, "remove", f"ogbench/{NAME}-val")
    assert code == 1 and "nothing to remove" in one_error_line(err)


def test_download_a_local_file_with_sha256(home: Path, tmp_path: Path, capsys) -> None:
    file = tmp_path / "mine.npz"
    write_ogbench_file(file, n=50, compact=False)
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    code, out, err = run(capsys, "download", f"ogbench/{NAME}", "--file", str(file))
    assert code == 0, err
    code, out, err = run(capsys, "info", f"ogbench/{NAME}")
    assert "layout:       regular" in out
    run(capsys, "remove", f"ogbench/{NAME}")
    code, out, err = run(
        capsys, "download", f"ogbench/{NAME}", "--file", str(file), "--sha256", "ab" * 32
    )
    assert code == 1 and digest in one_error_line(err) and file.is_file()
    code, _, err = run(capsys, "download", f"ogbench/{NAME}", "--url", "http://x/")
    assert code == 1 and "RBDATA_OGBENCH_MIRROR" in one_error_line(err)


@pytest.mark.parametrize("text", ["ogbench/cube-singel-play-v0", "ogbench/cube-singel-play-v0-val"])
def test_unknown_id(home: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    for action in ("download", "info", "path", "remove"):
        code, _, err = run(capsys, action, text)
        assert code == 1
        line = one_error_line(err)
        assert "unknown OGBench dataset" in line and "did you mean" in line
    assert not home.exists()
