"""D4RL's sources: a local file, ``file://`` URLs and mirrors, ``download=False``, failures.

What a user with D4RL's own ``~/.d4rl/datasets/*.hdf5`` or without network meets: the local
file is verified and converted without the network and never touched; ``download=False``
never opens a connection; a download that cannot connect fails fast, says the way out and
leaves nothing in the cache. Connections and name lookups are counted by wrapping
``socket.socket.connect`` and ``socket.getaddrinfo``; rows are checked against the reference
reader of ``tests/_d4rl_files.py``.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rbdata.datasets import D4RL, ChecksumError, DownloadError
from rbdata.datasets._catalog import d4rl_entry
from tests._d4rl_files import reference_rows, serve, write_d4rl_file

ID = "hopper-medium-v2"
FILE = d4rl_entry(ID).file  # gym_mujoco_v2/hopper_medium-v2.hdf5
CATALOG_SIZE = d4rl_entry(ID).size  # 152756557: the real file's


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_rows(ds: D4RL, arrays: dict[str, np.ndarray]) -> None:
    expected = reference_rows(arrays)
    batch = ds.__getitems__(torch.arange(len(ds)))
    for key in expected[0]:
        column = np.stack([row[key] for row in expected])
        assert np.array_equal(batch[key].numpy(), column), key


def _everything(root: Path) -> list[str]:
    """Every file and folder below ``root`` (lock files and empty folders included)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RBDATA_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RBDATA_D4RL_MIRROR", raising=False)
    return tmp_path / "home"


@pytest.fixture
def local(tmp_path: Path) -> dict[str, Any]:
    """A D4RL-layout file outside the cache, as D4RL keeps it in ``~/.d4rl/datasets``."""
    path = tmp_path / "dot-d4rl" / "datasets" / "hopper_medium-v2.hdf5"
    path.parent.mkdir(parents=True)
    arrays = write_d4rl_file(path, n=300)
    return {"path": path, "arrays": arrays, "sha256": _sha(path), "bytes": path.read_bytes()}


@pytest.fixture
def mirror(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A local mirror serving a generated file at the catalog path of ``hopper-medium-v2``."""
    files = tmp_path / "mirror"
    (files / FILE).parent.mkdir(parents=True)
    write_d4rl_file(files / FILE, n=100)
    with serve(files) as (url, requests):
        monkeypatch.setenv("RBDATA_D4RL_MIRROR", url)
        yield {"url": url, "requests": requests}


# --- download=False: never the network, never delete ------------------------------------------
@pytest.mark.parametrize("download", [False, True])
def test_a_cached_file_failing_the_check_is_kept(
    mirror: dict[str, Any], home: Path, local: dict[str, Any], connects: list[Any], download: bool
) -> None:
    """The issue's case: a file at the download path that fails the size check."""
    cached = home / "d4rl" / "downloads" / FILE
    cached.parent.mkdir(parents=True)
    cached.write_bytes(local["bytes"])
    start = time.monotonic()
    with pytest.raises(ChecksumError) as info:
        D4RL(ID, download=download, progress=False)
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert repr(str(cached)) in message
    assert f"expected {CATALOG_SIZE} bytes, got {len(local['bytes'])} bytes" in message
    assert "the file is kept" in message and f"`rbdata datasets remove d4rl/{ID}`" in message
    assert cached.read_bytes() == local["bytes"]  # not deleted
    assert mirror["requests"] == [] and connects == []  # no connection at all
    assert not (home / "d4rl" / ID).exists()


def test_download_false_converts_a_good_cached_file_offline(
    mirror: dict[str, Any], home: Path, local: dict[str, Any], connects: list[Any]
) -> None:
    cached = home / "d4rl" / "downloads" / FILE
    cached.parent.mkdir(parents=True)
    cached.write_bytes(local["bytes"])
    ds = D4RL(ID, download=False, sha256=local["sha256"], progress=False)
    _check_rows(ds, local["arrays"])
    assert ds.info["source"]["file"] == f"d4rl/downloads/{FILE}"
    assert mirror["requests"] == [] and connects == []
    assert sorted(p.name for p in cached.parent.iterdir()) == [cached.name]  # no lock file
    ds.close()


def test_download_false_without_the_file_says_what_to_do(
    mirror: dict[str, Any], home: Path, connects: list[Any]
) -> None:
    with pytest.raises(FileNotFoundError) as info:
        D4RL(ID, download=False, progress=False)
    message = str(info.value)
    assert "download=True" in message and "file=PATH" in message and "--file PATH" in message
    assert mirror["requests"] == [] and connects == []
    assert _everything(home) == []  # no lock file, no empty folder


# --- a local file -----------------------------------------------------------------------------
def test_a_local_file_is_verified_and_converted_in_place(
    home: Path, local: dict[str, Any], connects: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RBDATA_D4RL_MIRROR", "http://nonexistent.invalid/")
    ds = D4RL(ID, file=local["path"], sha256=local["sha256"], progress=False)
    _check_rows(ds, local["arrays"])
    source = ds.info["source"]
    assert source["path"] == str(local["path"])
    assert source["url"] == local["path"].as_uri()
    assert source["sha256"] == local["sha256"] and source["sha256_verified"] is True
    assert "file" not in source  # nothing in the cache's downloads: `remove` leaves it alone
    assert connects == []
    assert not (home / "d4rl" / "downloads").exists()  # not copied
    assert local["path"].read_bytes() == local["bytes"]
    again = D4RL(ID, progress=False)  # the converted entry, without the file
    assert again.path == ds.path
    ds.close()
    again.close()


@pytest.mark.parametrize("how", ["url", "mirror"])
def test_file_urls_and_mirrors_are_local_files(
    home: Path,
    local: dict[str, Any],
    connects: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    if how == "url":
        ds = D4RL(ID, url=local["path"].as_uri(), sha256=local["sha256"], progress=False)
    else:  # a file:// mirror: the D4RL tree in a local folder
        tree = local["path"].parent.parent / "tree"
        (tree / FILE).parent.mkdir(parents=True)
        (tree / FILE).write_bytes(local["bytes"])
        monkeypatch.setenv("RBDATA_D4RL_MIRROR", tree.as_uri())
        ds = D4RL(ID, download=False, sha256=local["sha256"], progress=False)
    _check_rows(ds, local["arrays"])
    assert ds.info["source"]["url"].startswith("file://")
    assert connects == []
    ds.close()


def test_a_local_file_failing_the_catalog_check_is_refused_and_kept(
    home: Path, local: dict[str, Any]
) -> None:
    with pytest.raises(ChecksumError) as info:
        D4RL(ID, file=local["path"], progress=False)  # the catalog's size is the real file's
    message = str(info.value)
    assert repr(str(local["path"])) in message
    assert f"expected {CATALOG_SIZE} bytes, got {len(local['bytes'])} bytes" in message
    assert "sha256=" in message  # how to use it anyway
    wrong = "ab" * 32
    with pytest.raises(ChecksumError) as info:
        D4RL(ID, file=local["path"], sha256=wrong, progress=False)
    assert f"expected sha256 {wrong}, got {local['sha256']}" in str(info.value)
    assert local["path"].read_bytes() == local["bytes"]
    assert _everything(home) == []


def test_a_local_file_that_is_not_d4rl_leaves_nothing(home: Path, tmp_path: Path) -> None:
    import h5py

    file = tmp_path / "other.hdf5"
    with h5py.File(file, "w") as f:
        f["observations"] = np.zeros((5, 2), np.float32)
    with pytest.raises(ValueError, match="not a D4RL file"):
        D4RL(ID, file=file, sha256=_sha(file), progress=False)
    assert file.is_file()
    assert _everything(home) == []


def test_file_and_url_together_are_refused(home: Path, local: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="file, url: pass one of them"):
        D4RL(ID, file=local["path"], url="http://127.0.0.1:9/x.hdf5", progress=False)
    with pytest.raises(FileNotFoundError, match="is not a file"):
        D4RL(ID, file=local["path"].with_name("missing.hdf5"), progress=False)
    assert _everything(home) == []


# --- no network: fast, says the way out, leaves nothing ----------------------------------------
def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unresolvable_host_fails_fast_and_leaves_nothing(
    home: Path, lookups: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RBDATA_D4RL_MIRROR", "http://nonexistent.invalid/offline_rl/")
    start = time.monotonic()
    with pytest.raises(DownloadError) as info:
        D4RL(ID, progress=False)
    assert time.monotonic() - start < 5
    assert lookups.count("nonexistent.invalid") == 2  # one retry at most
    message = str(info.value)
    assert "2 attempts failed; could not connect" in message
    assert "RBDATA_D4RL_MIRROR" in message and f"D4RL({ID!r}, file=PATH)" in message
    assert message.endswith(f"`rbdata datasets download d4rl/{ID} --file PATH`")
    assert _everything(home) == []


def test_refused_connection_fails_fast_and_leaves_nothing(
    home: Path, connects: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _closed_port()
    monkeypatch.setenv("RBDATA_D4RL_MIRROR", f"http://127.0.0.1:{port}/")
    start = time.monotonic()
    with pytest.raises(DownloadError, match="2 attempts failed; could not connect"):
        D4RL(ID, progress=False)
    assert time.monotonic() - start < 5
    assert connects.count(("127.0.0.1", port)) == 2
    assert _everything(home) == []


def test_sample_ids_say_how_to_build_them(home: Path) -> None:
    with pytest.raises(ValueError) as info:
        D4RL("cartpole-random-v0", progress=False)
    message = str(info.value)
    assert "rbdata datasets sample d4rl/cartpole-random-v0 --out FILE" in message
    assert "file=FILE" in message and "RBDATA_D4RL_MIRROR" in message
    assert "make demo" not in message
    assert _everything(home) == []
