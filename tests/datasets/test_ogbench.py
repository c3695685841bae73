"""OGBench: exact conversion of generated OGBench files, splits, the cache, mirrors, checksums."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _dataset_rows import assert_rows

from rbdata import SliceSampler
from rbdata.datasets import ChecksumError, DownloadError, OfflineDataset, OGBench
from rbdata.datasets import ogbench as ogbench_module
from rbdata.datasets._catalog import ogbench_entry
from tests._d4rl_files import serve
from tests._ogbench_files import expected_episodes, reference_rows, write_ogbench_file

ID = "pointmaze-medium-navigate-v0"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _all(ds: OfflineDataset) -> Any:
    return ds.__getitems__(torch.arange(len(ds)))


def check_rows(ds: OfflineDataset, arrays: dict[str, np.ndarray]) -> None:
    """Every key, dtype, shape and value of ``ds`` against the per-row reference."""
    assert_rows(ds, reference_rows(arrays))


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A local mirror serving generated ``<ID>.npz`` and ``<ID>-val.npz``."""
    files = tmp_path / "mirror"
    train = write_ogbench_file(files / f"{ID}.npz", n=700)
    val = write_ogbench_file(files / f"{ID}-val.npz", n=90, seed=1)
    monkeypatch.setenv("RBDATA_HOME", str(tmp_path / "home"))
    with serve(files) as (url, requests):
        monkeypatch.setenv("RBDATA_OGBENCH_MIRROR", url)
        yield {
            "dir": files,
            "url": url,
            "requests": requests,
            "train": train,
            "val": val,
            "sha256": _sha(files / f"{ID}.npz"),
            "home": tmp_path / "home",
        }


# --- exact data ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["memmap", "arrow"])
@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"compressed": False},
        {"compact": False},
        {"compact": False, "compressed": False, "infos": False},
        {"last_terminal": False},
        {"obs_shape": (4, 4, 3), "obs_dtype": np.uint8},  # a visual dataset's images
        {"byteorder": ">"},  # a big-endian file: same values, native dtypes
    ],
    ids=["compact", "stored", "regular", "regular-stored-bare", "unfinished", "pixels", "be"],
)
def test_every_row_matches_the_file(
    tmp_path: Path, backend: str, variant: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "src" / "data.npz"
    arrays = write_ogbench_file(file, n=1000, **variant)
    monkeypatch.setattr(ogbench_module, "_BLOCK_ROWS", 97)  # many blocks, odd boundaries
    ds = OGBench(ID, tmp_path / "home", file=file, backend=backend, progress=False)
    assert len(ds) == 1000
    check_rows(ds, arrays)
    assert ds.num_episodes == expected_episodes(arrays)
    assert ds.info["layout"] == ("regular" if variant.get("compact") is False else "compact")
    assert ds.info["split"] == "train" and ds.metadata == {}
    single = ds[3]
    assert single.batch_size == () and torch.equal(
        single["observation"], torch.from_numpy(arrays["observations"][3])
    )
    ds.close()


def test_blocks_of_one_row_and_of_the_whole_file(tmp_path: Path, monkeypatch) -> None:
    file = tmp_path / "data.npz"
    arrays = write_ogbench_file(file, n=150)
    for rows in (1, 150, 10_000):
        monkeypatch.setattr(ogbench_module, "_BLOCK_ROWS", rows)
        ds = OGBench(ID, tmp_path / f"home-{rows}", file=file, progress=False)
        check_rows(ds, arrays)
        ds.close()


def test_scalars_go_to_metadata(tmp_path: Path) -> None:
    file = tmp_path / "data.npz"
    arrays = write_ogbench_file(file, n=40, infos=False)
    np.savez(file, **arrays, seed=np.int64(7), note=np.float32(0.5))
    ds = OGBench(ID, tmp_path / "home", file=file, progress=False)
    assert ds.metadata == {"seed": 7, "note": 0.5}
    check_rows(ds, arrays)


# --- splits, the cache, mirrors ----------------------------------------------------------------
def test_train_and_val_splits_from_a_mirror(mirror: dict[str, Any]) -> None:
    train = OGBench(ID, progress=False)
    val = OGBench(ID, split="val", progress=False)
    assert sorted(mirror["requests"]) == [f"/{ID}-val.npz", f"/{ID}.npz"]
    check_rows(train, mirror["train"])
    check_rows(val, mirror["val"])
    assert val.path == mirror["home"] / "ogbench" / f"{ID}-val" / "memmap"
    assert val.info["id"] == f"{ID}-val" and val.info["dataset"] == ID
    # the catalog has no digest: the computed one is recorded, marked as not verified
    assert ogbench_entry(ID).train.sha256 is None
    assert train.info["source"]["sha256"] == mirror["sha256"]
    assert train.info["source"]["sha256_verified"] is False
    assert train.info["source"]["url"] == mirror["url"] + f"{ID}.npz"
    assert train.info["source"]["file"] == f"ogbench/downloads/{ID}.npz"
    with pytest.raises(ValueError, match="split must be one of"):
        OGBench(ID, split="test")


def test_reopen_is_fast_and_needs_neither_file_nor_network(
    mirror: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = OGBench(ID, sha256=mirror["sha256"], progress=False)
    data = _all(first)
    assert first.info["source"]["sha256_verified"] is True
    monkeypatch.setattr(ogbench_module, "fetch", _refuse)
    monkeypatch.setattr(ogbench_module, "convert_ogbench", _refuse)
    monkeypatch.setenv("RBDATA_OGBENCH_MIRROR", "http://127.0.0.1:9/")
    (mirror["home"] / "ogbench" / "downloads" / f"{ID}.npz").unlink()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        again = OGBench(ID, progress=False)
        best = min(best, time.perf_counter() - start)
        again.close()
    assert best <= 0.2, best
    again = OGBench(ID, progress=False)
    assert (_all(again) == data).all() and again.path == first.path


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("must not be called when the dataset is cached")


def test_a_file_mirror_and_a_local_file(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "local"
    arrays = write_ogbench_file(folder / f"{ID}-val.npz", n=80)
    monkeypatch.setenv("RBDATA_OGBENCH_MIRROR", folder.as_uri())
    ds = OGBench(ID, tmp_path / "home", split="val", progress=False)
    check_rows(ds, arrays)
    assert ds.info["source"]["path"] == str(folder / f"{ID}-val.npz")
    assert not (tmp_path / "home" / "ogbench" / "downloads").exists()  # converted in place
    monkeypatch.delenv("RBDATA_OGBENCH_MIRROR")
    mine = OGBench(ID, tmp_path / "home2", split="val", file=folder / f"{ID}-val.npz")
    assert mine.info["source"]["url"] == (folder / f"{ID}-val.npz").as_uri()
    assert (folder / f"{ID}-val.npz").is_file()


def test_sha256_mismatch_caches_nothing(mirror: dict[str, Any]) -> None:
    wrong = "ab" * 32
    with pytest.raises(ChecksumError) as err:
        OGBench(ID, sha256=wrong, progress=False)
    assert wrong in str(err.value) and mirror["sha256"] in str(err.value)
    assert [p for p in mirror["home"].rglob("*") if p.is_file()] == []
    with pytest.raises(ValueError, match="64 hex digits"):
        OGBench(ID, sha256="xyz", progress=False)


def test_download_false_needs_the_cache(mirror: dict[str, Any]) -> None:
    with pytest.raises(FileNotFoundError, match="download=True"):
        OGBench(ID, download=False, progress=False)
    assert mirror["requests"] == []


def test_offline_error_names_the_ways_out(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RBDATA_OGBENCH_MIRROR", "http://127.0.0.1:9/")  # refused at once
    with pytest.raises(DownloadError) as err:
        OGBench(ID, tmp_path / "home", split="val", progress=False)
    message = str(err.value)
    assert "RBDATA_OGBENCH_MIRROR" in message and "file=PATH" in message
    assert f"ogbench/{ID}-val --file PATH" in message
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*.npz*"))


def test_unknown_id_suggests_close_ones(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="pointmaze-medium-navigate-v0"):
        OGBench("pointmaze-medum-navigate-v0", tmp_path)


_BASE = {"observations": np.zeros((5, 2)), "actions": np.zeros(5), "terminals": np.ones(5)}


# --- refused files: nothing cached --------------------------------------------------------------
@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        ({"observations": np.zeros((5, 2)), "actions": np.zeros((5, 1))}, "terminals"),
        (
            {"observations": np.zeros((5, 2)), "actions": np.zeros(4), "terminals": np.ones(5)},
            "'actions' has shape",
        ),
        (
            {
                "observations": np.zeros((5, 2)),
                "actions": np.zeros(5),
                "terminals": np.ones(5),
                "valids": np.ones(5),
            },
            "compact_dataset=True",
        ),
        (
            {
                "observations": np.zeros((5, 2)),
                "actions": np.zeros(5),
                "terminals": np.ones(5),
                "names": np.array(["a"] * 5),
            },
            "not supported",
        ),
        (
            {
                "observations": np.zeros((5, 2)),
                "next_observations": np.zeros((5, 3)),
                "actions": np.zeros(5),
                "terminals": np.ones(5),
            },
            "differ",
        ),
        ({**_BASE, "": np.zeros(5)}, "not a key"),
        ({**_BASE, "a/../b": np.zeros(5)}, "not a key"),
        ({**_BASE, "a": np.zeros(5), "a/b": np.zeros(5)}, "nested under array 'a'"),
    ],
    ids=["no-terminals", "rows", "valids", "strings", "next-shape", "empty", "dots", "nested"],
)
def test_a_foreign_file_is_refused_and_not_cached(
    tmp_path: Path, arrays: dict[str, np.ndarray], match: str
) -> None:
    file = tmp_path / "x.npz"
    np.savez(file, **arrays)
    with pytest.raises(ValueError, match=match):
        OGBench(ID, tmp_path / "home", file=file, progress=False)
    assert not (tmp_path / "home" / "ogbench").exists()


def test_a_failed_conversion_leaves_no_entry(mirror: dict[str, Any], monkeypatch) -> None:
    original = ogbench_module._blocks

    def failing(*args: Any, **kwargs: Any) -> Iterator[Any]:
        blocks = original(*args, **kwargs)
        yield next(blocks)
        raise RuntimeError("injected failure")

    monkeypatch.setattr(ogbench_module, "_BLOCK_ROWS", 100)
    monkeypatch.setattr(ogbench_module, "_blocks", failing)
    with pytest.raises(RuntimeError, match="injected"):
        OGBench(ID, progress=False)
    left = sorted(p.relative_to(mirror["home"]).as_posix() for p in mirror["home"].rglob("*"))
    assert left == ["ogbench", "ogbench/downloads", f"ogbench/downloads/{ID}.npz"]
    monkeypatch.setattr(ogbench_module, "_blocks", original)
    check_rows(OGBench(ID, progress=False), mirror["train"])
    assert mirror["requests"] == [f"/{ID}.npz"]  # the download was kept


def test_slices_never_cross_episodes(tmp_path: Path) -> None:
    file = tmp_path / "data.npz"
    write_ogbench_file(file, n=2000)
    ds = OGBench(ID, tmp_path, file=file, sampler=SliceSampler(slice_len=4, traj_key="episode"))
    steps = ds.sample(64).reshape(16, 4)
    assert (steps["episode"] == steps["episode"][:, :1]).all()


# --- the real thing ----------------------------------------------------------------------------
@pytest.mark.network
def test_a_real_validation_file(tmp_path: Path) -> None:
    """The smallest real file (~3 MB): its rows against the .npz read whole by numpy."""
    ds = OGBench(ID, tmp_path, split="val", progress=False)
    file = tmp_path / "ogbench" / "downloads" / f"{ID}-val.npz"
    with np.load(file, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    assert set(arrays) >= {"observations", "actions", "terminals", "qpos", "qvel"}
    check_rows(ds, arrays)
    assert ds.info["layout"] == "compact" and arrays["terminals"][-1]
