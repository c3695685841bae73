"""DQN Replay: exact transitions of Dopamine-format checkpoints, downloads, local files, errors.

The checkpoints are written by ``tests/_atari_dqn_files.py`` in Dopamine's format (small
frames: the format takes any frame shape) and every transition is checked against a per-index
loop over Dopamine's rules.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rbdata.datasets import AtariDQN, ChecksumError, DownloadError
from rbdata.datasets.atari import _convert as convert_module
from rbdata.datasets.atari import _dataset as atari_module
from rbdata.datasets.atari._catalog import atari_catalog, atari_id, atari_source, checkpoint_spec
from rbdata.datasets.atari._convert import count_transitions, write_transitions
from rbdata.storages import FrameStackStorage, TensorStorage
from tests._atari_dqn_files import load, reference, serve_ranges, write_run

LOGS = "Pong/1/replay_logs"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mirror of the bucket's ``dqn/`` folder: checkpoints 0 to 4 of Pong run 1."""
    root = tmp_path_factory.mktemp("bucket")
    kinds = write_run(root / LOGS)
    assert kinds == {
        0: "not full",
        1: "wrapped",
        2: "logged",
        3: "final",
        4: "terminal at the cursor",
    }
    return root


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RBDATA_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RBDATA_ATARI_DQN_MIRROR", raising=False)
    return tmp_path / "home"


@pytest.fixture
def mirror(files: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    with serve_ranges(files, drop={"$store$_observation_ckpt.2.gz": 700}) as (url, requests):
        monkeypatch.setenv("RBDATA_ATARI_DQN_MIRROR", url)
        yield {"url": url, "requests": requests}


def check(ds: Any, folder: Path, checkpoints: list[int]) -> list[dict[str, Any]]:
    """Every key, dtype, shape and value of ``ds`` against the per-index reference."""
    expected = reference(folder, checkpoints)
    batch = ds[torch.arange(len(ds))] if len(ds) else None
    assert len(ds) == len(expected) > 0
    column = {k: np.stack([row[k] for row in expected]) for k in expected[0]}
    pairs = {
        "observation": ("observation",),
        "next_observation": ("next", "observation"),
        "action": ("action",),
        "reward": ("next", "reward"),
        "done": ("next", "done"),
        "episode": ("episode",),
    }
    keys = {tuple(k) if isinstance(k, tuple) else (k,) for k in batch.keys(True, True)}
    assert keys == {*pairs.values(), ("next", "terminated")}
    for name, key in pairs.items():
        got = batch[key].numpy()
        want = column[name].reshape(got.shape) if name in ("reward", "done") else column[name]
        assert got.dtype == want.dtype or name == "episode", (name, got.dtype, want.dtype)
        assert np.array_equal(got, want), name
    assert torch.equal(batch["next", "terminated"], batch["next", "done"])
    return expected


# --- exact data ------------------------------------------------------------------------------
@pytest.mark.parametrize("checkpoints", [[0], [1], [2], [3], [4], [0, 1, 2, 3, 4]])
@pytest.mark.parametrize("chunk", [1, 5, 10_000])
def test_every_valid_transition_bit_exact(
    files: Path, home: Path, checkpoints: list[int], chunk: int, monkeypatch
) -> None:
    monkeypatch.setattr(convert_module, "_CHUNK_FRAMES", chunk)
    ds = AtariDQN("Pong", 1, checkpoints, file=files / "Pong" / "1", progress=False)
    expected = check(ds, files / LOGS, checkpoints)
    assert isinstance(ds.storage, FrameStackStorage) and ds.storage.codec == "lz4"
    assert ds.storage.frames_stored <= len(ds) + 4 * ds.num_episodes  # each frame once
    assert ds.num_episodes == expected[-1]["episode"] + 1
    assert ds.info["id"] == f"Pong/1/{checkpoint_spec(checkpoints)}"
    assert ds.info["stack"] == 4 and ds.info["frame_shape"] == [6, 5]
    described = ds.info["metadata"]["checkpoints"]
    for entry, number in zip(described, checkpoints, strict=True):
        raw = load(files / LOGS, number)
        cap, count = len(raw["terminal"]), int(raw["add_count"])
        assert entry["cursor"] == count % cap and entry["full"] == (count >= cap)
    ds.close()


def test_the_rules_in_the_reference(files: Path) -> None:
    """What the module promises, seen on the reference rows themselves."""
    for number in range(5):
        raw = load(files / LOGS, number)
        rows = reference(files / LOGS, [number])
        kept = {row["index"] for row in rows}
        assert not kept & {int(i) for i in raw["invalid_range"]}
        for prev, row in itertools.pairwise(rows):
            if prev["done"]:  # an episode's first transition: three zero padding frames
                assert not row["observation"][:3].any() and row["observation"][3].any()
                assert not prev["next_observation"][3].any()  # the padding record after it
            elif row["index"] == (prev["index"] + 1) % len(raw["terminal"]):
                assert np.array_equal(row["observation"], prev["next_observation"])
    # checkpoint 2 is a logged buffer (cursor at capacity - 1): index 3 is its first
    assert reference(files / LOGS, [2])[0]["index"] == 3


def test_any_storage_gets_stacked_views(files: Path) -> None:
    """The conversion writes through ``storage.set`` only, handing views of the frames."""
    source = atari_source("Pong", 1, [1, 3])
    sources = [(c, {r: files / LOGS / n for r, n in source.files(c).items()}) for c in (1, 3)]
    total = sum(c.transitions for c in count_transitions(sources))
    storage = TensorStorage(total)
    info = write_transitions(sources, storage, chunk=7)
    assert info["transitions"] == total == len(storage)
    check(storage, files / LOGS, [1, 3])

    class Recording:
        def __init__(self) -> None:
            self.calls: list[Any] = []

        def set(self, index: slice, data: Any) -> None:
            self.calls.append((index, data))

    recording = Recording()
    write_transitions(sources, recording, chunk=64)  # type: ignore[arg-type]
    slots = [i for index, _ in recording.calls for i in range(index.start, index.stop)]
    assert slots == list(range(total))
    _, data = max(recording.calls, key=lambda call: call[1].batch_size[0])
    obs, nxt = data["observation"], data["next", "observation"]
    assert nxt.data_ptr() - obs.data_ptr() == 6 * 5  # the same frames, one frame on
    assert obs.stride(0) == obs.stride(1) == 6 * 5  # a sliding window: one frame per step


@pytest.mark.parametrize("codec", [None, "lz4", ("zstd", 3)])
def test_a_frame_stack_storage_rebuilds_the_stacks(files: Path, codec: Any) -> None:
    """The conversion's target to be: each frame stored once, stacks rebuilt bit-exactly."""
    checkpoints = [0, 1, 2, 3, 4]
    source = atari_source("Pong", 1, checkpoints)
    sources = [(c, {r: files / LOGS / n for r, n in source.files(c).items()}) for c in checkpoints]
    total = sum(c.transitions for c in count_transitions(sources))
    storage = FrameStackStorage(total, 4, codec=codec)
    write_transitions(sources, storage)
    expected = check(storage, files / LOGS, checkpoints)
    runs = 1 + sum(
        b["index"] != a["index"] + 1 or a["episode"] != b["episode"]
        for a, b in itertools.pairwise(expected)
    )
    # one new frame a step, and at most the four of a whole stack where a run starts
    assert total < storage.frames_stored <= total + 4 * runs


# --- the cache, downloads, mirrors -------------------------------------------------------------
def test_download_from_a_mirror_resumes_a_dropped_file(
    files: Path, home: Path, mirror: dict[str, Any]
) -> None:
    ds = AtariDQN("Pong", 1, (2, 3), progress=False)
    check(ds, files / LOGS, [2, 3])
    paths = [path for path, _ in mirror["requests"]]
    assert len(paths) == 13 and len(set(paths)) == 12  # the dropped one asked for twice
    dropped = "/Pong/1/replay_logs/%24store%24_observation_ckpt.2.gz"
    assert [r for p, r in mirror["requests"] if p == dropped] == [None, "bytes=700-"]
    downloads = home / "atari-dqn" / "downloads" / LOGS
    recorded = ds.info["source"]["files"]
    assert len(recorded) == 12 and ds.info["source"]["url"] == mirror["url"] + LOGS + "/"
    for name, entry in recorded.items():
        assert entry["sha256"] == _sha(files / LOGS / name) == _sha(downloads / name)
        assert entry["file"] == f"atari-dqn/downloads/{LOGS}/{name}"
        assert entry["size"] == (files / LOGS / name).stat().st_size
        assert entry["sha256_verified"] is False
    assert not list(home.rglob("*.part")) and not list(home.rglob("*.lock"))


def test_a_partial_download_is_resumed(files: Path, home: Path, mirror: dict[str, Any]) -> None:
    name = "$store$_observation_ckpt.4.gz"
    downloads = home / "atari-dqn" / "downloads" / LOGS
    downloads.mkdir(parents=True)
    whole = (files / LOGS / name).read_bytes()
    (downloads / (name + ".part")).write_bytes(whole[:500])
    AtariDQN("Pong", 1, 4, progress=False).close()
    assert ("/Pong/1/replay_logs/%24store%24_observation_ckpt.4.gz", "bytes=500-") in mirror[
        "requests"
    ]
    assert (downloads / name).read_bytes() == whole


def test_reopen_needs_neither_files_nor_network(
    files: Path, home: Path, mirror: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = AtariDQN("Pong", 1, [1], progress=False)
    data = first[:]
    monkeypatch.setattr(atari_module, "fetch", _refuse)
    monkeypatch.setattr(atari_module, "convert_atari", _refuse)
    monkeypatch.setenv("RBDATA_ATARI_DQN_MIRROR", "http://127.0.0.1:9/")
    for file in (home / "atari-dqn" / "downloads").rglob("*.gz"):
        file.unlink()
    again = AtariDQN("Pong", 1, 1, progress=False, codec="zstd")  # opened as written
    again.close()
    again = AtariDQN("Pong", 1, [1], progress=False)
    assert (again[:] == data).all() and again.info["codec"] == "lz4"


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("must not be called when the dataset is cached")


@pytest.mark.parametrize("where", ["run", "replay_logs", "mirror"])
def test_local_files_are_read_in_place(
    files: Path, home: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = files / "Pong" / "1"
    if where == "mirror":
        monkeypatch.setenv("RBDATA_ATARI_DQN_MIRROR", files.as_uri())
        ds = AtariDQN("Pong", 1, [0, 4], progress=False)
    else:
        ds = AtariDQN("Pong", 1, [0, 4], file=folder / "replay_logs" if where != "run" else folder)
    check(ds, files / LOGS, [0, 4])
    assert not (home / "atari-dqn" / "downloads").exists()
    assert ds.info["source"]["url"] == (folder / "replay_logs").as_uri() + "/"
    name = "add_count_ckpt.4.gz"
    assert ds.info["source"]["files"][name]["path"] == str(folder / "replay_logs" / name)


def test_sha256_checked_and_mismatch_refused(files: Path, home: Path, mirror: dict) -> None:
    name = "$store$_terminal_ckpt.1.gz"
    good = _sha(files / LOGS / name)
    with pytest.raises(ChecksumError) as err:
        AtariDQN("Pong", 1, 1, sha256={name: "ab" * 32}, progress=False)
    assert name in str(err.value) and good in str(err.value) and "ab" * 32 in str(err.value)
    downloads = home / "atari-dqn" / "downloads" / LOGS
    assert not (downloads / name).exists() and not (home / "atari-dqn" / "Pong").exists()
    ds = AtariDQN("Pong", 1, 1, sha256={name: good.upper()}, progress=False)
    assert ds.info["source"]["files"][name]["sha256_verified"] is True
    with pytest.raises(ValueError, match="no such file"):
        AtariDQN("Pong", 1, 2, sha256={name: good}, progress=False)
    local, other = files / "Pong" / "1", home / "other"
    with pytest.raises(ChecksumError, match="left as it is"):
        AtariDQN("Pong", 1, 1, other, file=local, sha256={name: "cd" * 32})
    assert (local / "replay_logs" / name).is_file() and not (other / "atari-dqn").exists()


def test_download_false_and_offline(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="download=False"):
        AtariDQN("Pong", 1, download=False, progress=False)
    with socket.socket() as s:  # a port nobody listens on: refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RBDATA_ATARI_DQN_MIRROR", f"http://127.0.0.1:{port}/")
    with pytest.raises(DownloadError) as err:
        AtariDQN("Pong", 1, 3, progress=False)
    message = str(err.value)
    assert "RBDATA_ATARI_DQN_MIRROR" in message and "file=DIR" in message and "gsutil" in message
    assert not home.exists() or not any(p.is_file() for p in home.rglob("*"))


# --- malformed files ---------------------------------------------------------------------------
def _rewrite(folder: Path, name: str, value: Any) -> None:
    with gzip.open(folder / name, "wb") as f:
        np.save(f, value, allow_pickle=False)


@pytest.mark.parametrize(
    "damage",
    ["truncated", "not gzip", "frames 2-d", "actions short", "invalid range", "count < 0"],
)
def test_malformed_files_are_refused(files: Path, home: Path, tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "copy"
    folder.mkdir()
    for file in (files / LOGS).glob("*_ckpt.1.gz"):
        (folder / file.name).write_bytes(file.read_bytes())
    obs = folder / "$store$_observation_ckpt.1.gz"
    if damage == "truncated":
        obs.write_bytes(obs.read_bytes()[:-40])
    elif damage == "not gzip":
        obs.write_bytes(b"not a gzip file at all")
    elif damage == "frames 2-d":
        _rewrite(folder, obs.name, np.zeros((64, 30), np.uint8))
    elif damage == "actions short":
        _rewrite(folder, "$store$_action_ckpt.1.gz", np.zeros(63, np.int32))
    elif damage == "invalid range":
        _rewrite(folder, "invalid_range_ckpt.1.gz", np.array([62, 63, 64, 0, 1]))
    else:
        _rewrite(folder, "add_count_ckpt.1.gz", np.array(-1))
    with pytest.raises(ValueError) as err:
        AtariDQN("Pong", 1, 1, file=folder, progress=False)
    assert str(folder) in str(err.value)
    assert not (home / "atari-dqn").exists()


# --- arguments and the catalog -----------------------------------------------------------------
def test_catalog_ids_and_arguments() -> None:
    catalog = atari_catalog()
    assert len(catalog) == 60 and "Pong" in catalog and "Defender" not in catalog
    for game in catalog.values():
        assert game.runs == (1, 2, 3, 4, 5) and game.checkpoints == tuple(range(51))
    assert atari_id("Pong/3/40-42+50").checkpoints == (40, 41, 42, 50)
    assert atari_source("Pong", 1, [50, 49, 50]).id == "Pong/1/49-50"
    for bad in ("Pong", "Pong/x", "Pong/1/50/2", "Pong/1/50-40", "Pong/1/a"):
        with pytest.raises(ValueError):
            atari_id(bad)
    for kwargs in ({"run": 0}, {"run": True}, {"checkpoints": 51}, {"checkpoints": ()}):
        with pytest.raises(ValueError):
            AtariDQN("Pong", **kwargs)
    with pytest.raises(ValueError, match="codec"):
        AtariDQN("Pong", codec="gzip")
    with pytest.raises(KeyError, match="did you mean 'SpaceInvaders'"):
        AtariDQN("SpaceInvader")


@pytest.mark.network
def test_the_bucket_serves_the_small_files(tmp_path: Path) -> None:
    """The real bucket: Pong run 1's checkpoint 49 count and invalid range (a few bytes)."""
    from rbdata.datasets._download import download
    from rbdata.datasets.atari._convert import _read_all

    source = atari_source("Pong", 1, 49)
    got = {}
    for role in ("add_count", "invalid_range"):
        name = source.files(49)[role]
        file = download(source.file_url(name), tmp_path / name, name=name, progress=False)
        got[role] = _read_all(file.path, role, 1 << 16)
    count = int(got["add_count"])
    assert count >= 1_000_000
    cursor = count % 1_000_000
    assert got["invalid_range"].tolist() == [(cursor - 1 + i) % 1_000_000 for i in range(5)]
