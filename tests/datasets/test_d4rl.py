"""D4RL: exact conversion of generated D4RL-layout files, the cache, mirrors, samplers, loaders."""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _dataset_rows import assert_rows
from _paths import ROOT_DIR
from torch.utils.data import DataLoader

from rbdata import PrioritizedSampler, ReadOnlyError, SamplerWithoutReplacement, SliceSampler
from rbdata.datasets import D4RL, ChecksumError, OfflineDataset
from rbdata.datasets import d4rl as d4rl_module
from rbdata.datasets._catalog import d4rl_entry
from rbdata.errors import MissingKeyError
from tests._d4rl_files import reference_rows, serve, write_d4rl_file

ID = "hopper-medium-v2"
FILE = d4rl_entry(ID).file  # gym_mujoco_v2/hopper_medium-v2.hdf5


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A local mirror serving a generated file at the catalog path of ``hopper-medium-v2``."""
    files = tmp_path / "mirror"
    (files / FILE).parent.mkdir(parents=True)
    arrays = write_d4rl_file(files / FILE, n=700)
    monkeypatch.setenv("RBDATA_HOME", str(tmp_path / "home"))
    with serve(files) as (url, requests):
        monkeypatch.setenv("RBDATA_D4RL_MIRROR", url)
        yield {
            "dir": files,
            "url": url,
            "requests": requests,
            "arrays": arrays,
            "sha256": _sha(files / FILE),
            "home": tmp_path / "home",
        }


def _all(ds: OfflineDataset) -> Any:
    return ds.__getitems__(torch.arange(len(ds)))


def _check_rows(ds: OfflineDataset, arrays: dict[str, np.ndarray]) -> None:
    """Every key, dtype, shape and value of ``ds`` against the per-row reference."""
    assert_rows(ds, reference_rows(arrays))


# --- exact data ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["memmap", "arrow"])
@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"next_observations": False},
        {"next_observations": False, "last_done": True},
        {"timeouts": False, "infos": False},
        {"timeouts": False, "next_observations": False},
    ],
    ids=["full", "no-next", "no-next-last-done", "old", "old-no-next"],
)
def test_every_row_matches_the_file(
    tmp_path: Path, backend: str, variant: dict[str, bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "src" / "data.hdf5"
    file.parent.mkdir()
    arrays = write_d4rl_file(file, n=1000, **variant)
    monkeypatch.setattr(d4rl_module, "_BLOCK_ROWS", 97)  # many blocks, odd boundaries
    with serve(file.parent) as (url, _):
        ds = D4RL(
            ID,
            tmp_path / "home",
            backend=backend,
            url=url + "data.hdf5",
            sha256=_sha(file),
            progress=False,
        )
    assert len(ds) == 1000
    _check_rows(ds, arrays)
    done = arrays["terminals"] | arrays.get("timeouts", np.zeros(1000, bool))
    assert ds.num_episodes == int(done.sum()) + (0 if done[-1] else 1)
    assert ds.metadata == {
        "algorithm": "SAC — soft actor critic",
        "iteration": 1_000_000,
        "policy/fc0/weight": np.asarray(
            __import__("h5py").File(file)["metadata/policy/fc0/weight"]
        ).tolist(),
        "policy/nonlinearity": "relu",
        "flag": True,
    }
    single = ds[3]
    assert single.batch_size == () and torch.equal(
        single["observation"], torch.from_numpy(arrays["observations"][3])
    )
    ds.close()


def test_reopen_gives_the_same_data_without_hdf5_or_network(
    mirror: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = D4RL(ID, sha256=mirror["sha256"], progress=False)
    data, meta = _all(first), first.metadata
    assert first.info["source"]["sha256"] == mirror["sha256"]
    # the second construction must not touch the HDF5 file or the network
    monkeypatch.setattr("h5py.File", _refuse)
    monkeypatch.setattr(d4rl_module, "fetch", _refuse)
    monkeypatch.setenv("RBDATA_D4RL_MIRROR", "http://127.0.0.1:9/")
    again = D4RL(ID, progress=False)
    assert (_all(again) == data).all()
    assert again.metadata == meta
    assert again.path == first.path


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("must not be called when the dataset is cached")


# --- download, mirrors, checksums -------------------------------------------------------------
@pytest.mark.parametrize("slash", ["", "/"])
def test_mirror_replaces_the_catalog_prefix(mirror: dict[str, Any], slash: str, monkeypatch):
    monkeypatch.setenv("RBDATA_D4RL_MIRROR", mirror["url"].rstrip("/") + slash)
    ds = D4RL(ID, sha256=mirror["sha256"], progress=False)
    assert mirror["requests"] == ["/" + FILE]
    assert ds.info["source"]["url"] == mirror["url"] + FILE
    _check_rows(ds, mirror["arrays"])


def test_catalog_checksum_refuses_a_different_file(mirror: dict[str, Any]) -> None:
    with pytest.raises(ChecksumError) as err:
        D4RL(ID, progress=False)  # the catalog's size and sha256 are the real file's
    message = str(err.value)
    assert ID in message
    size = (mirror["dir"] / FILE).stat().st_size
    assert str(size) in message and str(d4rl_entry(ID).size) in message
    assert not any(p.is_file() for p in mirror["home"].rglob("*") if p.suffix != ".lock")


def test_sha256_mismatch_caches_nothing(mirror: dict[str, Any]) -> None:
    wrong = "ab" * 32
    with pytest.raises(ChecksumError) as err:
        D4RL(ID, sha256=wrong, progress=False)
    assert wrong in str(err.value) and mirror["sha256"] in str(err.value)
    leftovers = [p for p in mirror["home"].rglob("*") if p.is_file() and p.suffix != ".lock"]
    assert leftovers == []
    assert not (mirror["home"] / "d4rl" / ID / "memmap").exists()


def test_ids_sharing_a_file_download_it_once(tmp_path: Path, monkeypatch) -> None:
    a, b = d4rl_entry("pen-human-v1"), d4rl_entry("pen-human-longhorizon-v1")
    assert a.url == b.url
    files = tmp_path / "mirror"
    (files / a.file).parent.mkdir(parents=True)
    write_d4rl_file(files / a.file, n=50)
    monkeypatch.setenv("RBDATA_HOME", str(tmp_path / "home"))
    with serve(files) as (url, requests):
        monkeypatch.setenv("RBDATA_D4RL_MIRROR", url)
        digest = _sha(files / a.file)
        first = D4RL(a.id, sha256=digest, progress=False)
        second = D4RL(b.id, sha256=digest, progress=False)
    assert requests == ["/" + a.file]
    assert first.path != second.path
    assert (_all(first) == _all(second)).all()


def test_download_false_needs_the_cache(mirror: dict[str, Any]) -> None:
    with pytest.raises(FileNotFoundError, match="download=True"):
        D4RL(ID, download=False, sha256=mirror["sha256"], progress=False)
    assert mirror["requests"] == []


def test_unknown_id_suggests_close_ones(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="hopper-medium-v2") as err:
        D4RL("hoper-medium-v2", tmp_path)
    assert isinstance(err.value, MissingKeyError)
    assert str(err.value).startswith("unknown D4RL dataset 'hoper-medium-v2'; did you mean")


def test_sample_ids_need_a_mirror(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("RBDATA_D4RL_MIRROR", raising=False)
    with pytest.raises(ValueError, match="RBDATA_D4RL_MIRROR"):
        D4RL("cartpole-random-v0", tmp_path, progress=False)


def test_a_foreign_file_is_refused_and_not_cached(tmp_path: Path) -> None:
    import h5py

    file = tmp_path / "src" / "x.hdf5"
    file.parent.mkdir()
    with h5py.File(file, "w") as f:
        f["observations"] = np.zeros((5, 2), np.float32)
        f["actions"] = np.zeros((5, 1), np.float32)
        f["terminals"] = np.zeros(5, bool)
    with serve(file.parent) as (url, _), pytest.raises(ValueError, match="rewards"):
        D4RL(ID, tmp_path / "home", url=url + "x.hdf5", sha256=_sha(file), progress=False)
    assert not (tmp_path / "home" / "d4rl" / ID / "memmap").exists()


# --- atomic conversion ------------------------------------------------------------------------
def test_a_failed_conversion_leaves_no_entry(mirror: dict[str, Any], monkeypatch) -> None:
    original = d4rl_module._blocks

    def failing(*args: Any, **kwargs: Any) -> Iterator[Any]:
        blocks = original(*args, **kwargs)
        yield next(blocks)
        raise RuntimeError("injected failure")

    monkeypatch.setattr(d4rl_module, "_BLOCK_ROWS", 100)
    monkeypatch.setattr(d4rl_module, "_blocks", failing)
    with pytest.raises(RuntimeError, match="injected"):
        D4RL(ID, sha256=mirror["sha256"], progress=False)
    # no entry, no temporary folder, no lock file, no empty folder: only the verified download
    left = sorted(p.relative_to(mirror["home"]).as_posix() for p in mirror["home"].rglob("*"))
    assert left == [
        "d4rl",
        "d4rl/downloads",
        "d4rl/downloads/gym_mujoco_v2",
        f"d4rl/downloads/{FILE}",
    ]
    monkeypatch.setattr(d4rl_module, "_blocks", original)
    ds = D4RL(ID, sha256=mirror["sha256"], progress=False)
    _check_rows(ds, mirror["arrays"])
    assert mirror["requests"] == ["/" + FILE]  # the download was kept: not fetched twice


_CHILD = textwrap.dedent(
    """
    import hashlib, sys, torch
    from rbdata.datasets import D4RL
    ds = D4RL(sys.argv[1], sha256=sys.argv[2], progress=False)
    data = ds.__getitems__(torch.arange(len(ds)))
    print(len(ds), hashlib.sha256(data["observation"].numpy().tobytes()).hexdigest())
    """
)


def test_two_processes_download_and_convert_once(mirror: dict[str, Any]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT_DIR)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, ID, mirror["sha256"]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    assert outputs[0][0] == outputs[1][0]
    expected = hashlib.sha256(mirror["arrays"]["observations"].tobytes()).hexdigest()
    assert outputs[0][0].split() == ["700", expected]
    assert mirror["requests"] == ["/" + FILE]


# --- a dataset and a buffer -------------------------------------------------------------------
@pytest.fixture
def hopper(mirror: dict[str, Any]) -> OfflineDataset:
    return D4RL(ID, sha256=mirror["sha256"], progress=False, batch_size=32)


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_reads_every_row(
    hopper: OfflineDataset, mirror: dict[str, Any], workers: int
) -> None:
    loader = DataLoader(hopper, batch_size=64, num_workers=workers)
    obs = torch.cat([batch["observation"] for batch in loader])
    assert torch.equal(obs, torch.from_numpy(mirror["arrays"]["observations"]))
    shuffled = DataLoader(
        hopper,
        batch_size=256,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(0),
    )
    batches = list(shuffled)
    assert [b.batch_size[0] for b in batches] == [256, 256, 188]
    seen = torch.cat([b["observation"] for b in batches])
    assert torch.equal(seen[seen[:, 0].argsort()], obs[obs[:, 0].argsort()])


def test_pickles_by_reference(hopper: OfflineDataset) -> None:
    blob = pickle.dumps(hopper)
    assert len(blob) < 2000  # the path, not the 700 rows
    copy = pickle.loads(blob)
    assert copy.path == hopper.path and copy.batch_size == hopper.batch_size
    assert (_all(copy) == _all(hopper)).all()


def test_sample_and_iterate_like_a_buffer(mirror: dict[str, Any]) -> None:
    ds = D4RL(
        ID,
        sha256=mirror["sha256"],
        progress=False,
        batch_size=50,
        sampler=SamplerWithoutReplacement(generator=torch.Generator().manual_seed(1)),
        transform=lambda batch: batch.set("seen", torch.ones(batch.batch_size)),
    )
    batches = list(ds)  # one epoch
    index = torch.cat([b["index"] for b in batches])
    assert torch.equal(index.sort().values, torch.arange(700))
    assert all("seen" in b.keys() for b in batches)
    assert "seen" not in ds[[0, 1]].keys() and "seen" not in ds[0].keys()
    sample = ds.sample(8)
    assert sample.batch_size == (8,) and torch.equal(
        sample["observation"], torch.from_numpy(mirror["arrays"]["observations"][sample["index"]])
    )


def test_slice_sampler_follows_episodes(mirror: dict[str, Any]) -> None:
    ds = D4RL(
        ID,
        sha256=mirror["sha256"],
        progress=False,
        sampler=SliceSampler(slice_len=4, traj_key="episode"),
    )
    steps = ds.sample(64).reshape(16, 4)
    assert ((steps["episode"] - steps["episode"][:, :1]) == 0).all()
    assert (steps["index"].diff() == 1).all()


def test_prioritized_sampler_weights_and_updates(mirror: dict[str, Any]) -> None:
    ds = D4RL(
        ID,
        sha256=mirror["sha256"],
        progress=False,
        batch_size=16,
        sampler=PrioritizedSampler(700, alpha=1.0, beta=1.0),
    )
    priority = torch.zeros(700)
    priority[[5, 9]] = 1.0
    ds.update_priority(torch.arange(700), priority)
    batch = ds.sample()
    assert set(batch["index"].tolist()) <= {5, 9} and "weight" in batch.keys()


def test_read_only(hopper: OfflineDataset) -> None:
    before = _all(hopper)
    with pytest.raises(ReadOnlyError):
        hopper.extend(before[:2])
    with pytest.raises(ReadOnlyError):
        hopper.add(before[0])
    with pytest.raises(ReadOnlyError):
        hopper.buffer.extend(before[:2])
    assert (_all(hopper) == before).all()


def test_normalized_score(hopper: OfflineDataset) -> None:
    entry = d4rl_entry(ID)
    lo, hi = entry.ref_min_score, entry.ref_max_score
    assert lo is not None and hi is not None
    assert math.isclose(hopper.normalized_score(1000.0), (1000.0 - lo) / (hi - lo))
    assert hopper.normalized_score(hi) == 1.0
    arr = hopper.normalized_score([lo, hi])
    assert isinstance(arr, np.ndarray) and arr.tolist() == [0.0, 1.0]
    t = hopper.normalized_score(torch.tensor([lo, hi], dtype=torch.float64))
    assert isinstance(t, torch.Tensor) and t.tolist() == [0.0, 1.0]
    with pytest.raises(TypeError, match="returns"):
        hopper.normalized_score("high")


def test_normalized_score_without_reference_scores(tmp_path: Path, monkeypatch) -> None:
    entry = d4rl_entry("carla-town-render-v0")
    assert entry.ref_min_score is None
    files = tmp_path / "mirror"
    (files / entry.file).parent.mkdir(parents=True)
    write_d4rl_file(files / entry.file, n=20)
    with serve(files) as (url, _):
        monkeypatch.setenv("RBDATA_D4RL_MIRROR", url)
        ds = D4RL(entry.id, tmp_path / "home", progress=False)  # no catalog sha256: recorded
    assert ds.info["source"]["sha256"] == _sha(files / entry.file)
    assert ds.info["source"]["sha256_verified"] is False
    with pytest.raises(ValueError, match="no reference scores"):
        ds.normalized_score(1.0)


def test_cache_metadata_is_plain_json(hopper: OfflineDataset) -> None:
    meta = json.loads((hopper.path / "dataset.json").read_text(encoding="utf-8"))
    assert meta["id"] == ID and meta["transitions"] == 700
    assert meta["keys"]["next/reward"] == [[1], "float32"]
    assert meta["source"]["sha256_verified"] is True


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_local_hdf5_names_the_file_the_dataset_and_what_was_expected(
    tmp_path: Path, damage: str
) -> None:
    """A local file that h5py cannot read (its digest passed, so no size check stops it)."""
    good = tmp_path / "good.hdf5"
    write_d4rl_file(good, n=200)
    data = good.read_bytes()
    blob = data[: len(data) // 2] if damage == "truncated" else b"\x89HDF\r\n\x1a\n" + bytes(4096)
    bad = tmp_path / "bad.hdf5"
    bad.write_bytes(blob)
    with pytest.raises(ValueError) as info:
        D4RL(ID, tmp_path / "home", file=bad, sha256=_sha(bad), progress=False)
    message = str(info.value)
    assert str(bad) in message and repr(ID) in message
    assert "not a readable HDF5 file" in message and "truncated or corrupt" in message
    assert isinstance(info.value.__cause__, OSError)  # h5py's own error, kept as the cause
    assert not any((tmp_path / "home").rglob("*.bin"))  # nothing converted was left behind
