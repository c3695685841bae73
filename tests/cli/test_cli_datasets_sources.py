"""``rbdata datasets ...`` without the D4RL host: local files, samples, failures, leftovers.

A user with D4RL's own file converts it with ``--file`` (or a ``file://`` ``--url``); a user
offline gets a fast failure whose message ends with the way out and a cache with nothing
left in it; ``remove`` clears what older or killed runs left; ``info`` of a sample id gives
commands that work, which the tests run. Files are generated with h5py in the D4RL layout.
"""

from __future__ import annotations

import hashlib
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _cli import one_error_line, run

from rbdata.cli import main
from tests._d4rl_files import write_d4rl_file

NAME = "hopper-medium-v2"
FILE = "gym_mujoco_v2/hopper_medium-v2.hdf5"  # the catalog path of NAME


def everything(root: Path) -> list[str]:
    """Every file and folder below ``root``: lock files and empty folders count."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RBDATA_HOME", str(root))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.delenv("RBDATA_D4RL_MIRROR", raising=False)
    return root


@pytest.fixture()
def local(tmp_path: Path) -> tuple[Path, str]:
    """A D4RL-layout file as D4RL keeps it (``~/.d4rl/datasets/...``) and its sha256."""
    path = tmp_path / "dot-d4rl" / "datasets" / "hopper_medium-v2.hdf5"
    path.parent.mkdir(parents=True)
    write_d4rl_file(path, n=120)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


# --- a local file -----------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["--file", "--url"])
def test_download_a_local_file(
    home: Path, local: tuple[Path, str], capsys: pytest.CaptureFixture[str], how: str
) -> None:
    path, digest = local
    before = path.read_bytes()
    value = str(path) if how == "--file" else path.as_uri()
    code, out, err = run(capsys, "download", f"d4rl/{NAME}", how, value, "--sha256", digest)
    assert code == 0, err
    entry = home / "d4rl" / NAME / "memmap"
    assert out.splitlines()[0] == str(entry)
    assert out.splitlines()[1].startswith(f"d4rl/{NAME} (memmap): 120 transitions")
    code, out, _ = run(capsys, "info", NAME)
    assert code == 0 and f"source.path:  {path}\n" in out
    assert f"{digest} (verified: the digest given with --sha256)" in out
    code, out, err = run(capsys, "remove", NAME)
    assert code == 0, err
    assert path.read_bytes() == before  # the user's file is never removed
    assert everything(home) == []


def test_download_a_local_file_failing_the_catalog_check(
    home: Path, local: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = local
    code, out, err = run(capsys, "download", NAME, "--file", str(path))
    assert code == 1 and out == ""
    line = one_error_line(err)
    assert repr(str(path)) in line and "expected 152756557 bytes, got " in line
    assert path.is_file()
    assert everything(home) == []


def test_file_and_url_exclude_each_other(
    home: Path, local: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["datasets", "download", NAME, "--file", str(local[0]), "--url", "http://x/"])
    assert exc.value.code == 2
    capsys.readouterr()


# --- offline ----------------------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("host", ["dns", "refused"])
def test_offline_download_fails_fast_with_the_way_out(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    mirror = (
        "http://nonexistent.invalid/" if host == "dns" else f"http://127.0.0.1:{_closed_port()}/"
    )
    monkeypatch.setenv("RBDATA_D4RL_MIRROR", mirror)
    attempts: list[Any] = []
    from rbdata.datasets import _download

    real = _download.attempt

    def counted(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(_download, "attempt", counted)
    start = time.monotonic()
    code, out, err = run(capsys, "download", f"d4rl/{NAME}")
    assert time.monotonic() - start < 5
    assert code == 1 and out == ""
    assert attempts == [mirror + FILE] * 2  # one retry at most
    line = one_error_line(err)
    assert f"could not download dataset '{NAME}'" in line and "2 attempts failed" in line
    assert "RBDATA_D4RL_MIRROR" in line
    assert line.endswith(f"`rbdata datasets download d4rl/{NAME} --file PATH`")
    assert everything(home) == []  # no lock file, no empty folder


# --- remove clears leftovers ------------------------------------------------------------------
def test_remove_clears_lock_files_and_empty_folders(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a failed download of an older version (or a killed one) left behind."""
    leftovers = [
        home / "d4rl" / NAME / "memmap.lock",
        home / "d4rl" / "downloads" / f"{FILE}.lock",
    ]
    for path in leftovers:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    (home / "d4rl" / NAME / "arrow-tmp-empty").mkdir()  # a foreign folder stays: not ours
    code, out, err = run(capsys, "remove", f"d4rl/{NAME}")
    assert code == 0, err
    for path in leftovers:
        assert f"removed leftover lock file {path}" in out
    assert f"removed empty folder {home / 'd4rl' / 'downloads'}" in out
    assert everything(home) == [
        "d4rl",
        f"d4rl/{NAME}",
        f"d4rl/{NAME}/arrow-tmp-empty",
    ]
    (home / "d4rl" / NAME / "arrow-tmp-empty").rmdir()
    (home / "d4rl" / NAME).mkdir(exist_ok=True)
    code, out, err = run(capsys, "remove", f"d4rl/{NAME}")  # only empty folders now
    assert code == 0 and f"removed empty folder {home / 'd4rl' / NAME}" in out
    assert everything(home) == []
    code, _, err = run(capsys, "remove", f"d4rl/{NAME}")
    assert code == 1 and "nothing to remove" in one_error_line(err)


# --- sample ids: the advice works -------------------------------------------------------------
def _commands(text: str) -> list[list[str]]:
    return [c.split()[1:] for c in re.findall(r"`(rbdata [^`]+)`", text)]


def test_info_of_a_sample_gives_commands_that_work(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # not the repository: nothing of `make demo` around
    code, out, err = run(capsys, "info", "d4rl/cartpole-random-v0")
    assert code == 1 and "converted:    no" in out
    assert "make demo" not in err and "url=" not in err
    commands = _commands(err)
    assert [c[:2] for c in commands] == [["datasets", "sample"], ["datasets", "download"]]
    for argv in commands:
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 0, err
    assert out.splitlines()[1].startswith("d4rl/cartpole-random-v0 (memmap): 20,000 transitions")
    code, out, _ = run(capsys, "info", "d4rl/cartpole-random-v0")
    assert code == 0 and "transitions:  20,000" in out
    assert everything(home / "d4rl") == [
        "cartpole-random-v0",
        "cartpole-random-v0/memmap",
        "cartpole-random-v0/memmap/dataset.json",
        "cartpole-random-v0/memmap/storage",
    ] + [
        f"cartpole-random-v0/memmap/storage/{p.name}"
        for p in sorted((home / "d4rl" / "cartpole-random-v0" / "memmap" / "storage").iterdir())
    ]


def test_sample_command_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out_file = tmp_path / "sub" / "sample.hdf5"
    code, out, err = run(capsys, "sample", "d4rl/cartpole-random-v0", "--out", str(out_file))
    assert code == 0, err
    path, summary, hint = out.splitlines()
    digest = hashlib.sha256(out_file.read_bytes()).hexdigest()
    assert Path(path) == out_file and f"sha256 {digest}" in summary
    assert (
        hint == f"convert it with: rbdata datasets download d4rl/cartpole-random-v0 --file {path}"
    )
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "sample", "cartpole-random-v0")  # default: ./<name>.hdf5
    assert code == 0 and out.splitlines()[0] == str(tmp_path / "cartpole-random-v0.hdf5")
    assert (tmp_path / "cartpole-random-v0.hdf5").read_bytes() == out_file.read_bytes()
    code, _, err = run(capsys, "sample", NAME)
    assert code == 1 and "not an rbdata sample" in one_error_line(err)


# --- Minari's remote needs huggingface_hub: the extra's line, not minari's -------------------
def test_list_remote_without_the_hub_names_the_extra(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("minari")
    monkeypatch.delenv("MINARI_REMOTE", raising=False)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import ...` raises ImportError
    monkeypatch.delitem(sys.modules, "minari.storage.remotes.huggingface", raising=False)
    code, _, err = run(capsys, "list", "--family", "minari", "--remote")
    assert code == 1
    line = one_error_line(err)
    assert "huggingface_hub" in line and line.endswith("pip install 'rbdata[minari]'")
