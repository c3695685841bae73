"""Minari: datasets created locally with ``minari.create_dataset_from_buffers``, converted.

Expectations come from what ``minari`` itself returns (``load_dataset(...).iterate_episodes()``),
step by step, never from the conversion code.
"""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _paths import ROOT_DIR
from torch.utils.data import DataLoader

minari = pytest.importorskip("minari")
gym = pytest.importorskip("gymnasium")
pytest.importorskip("PIL")
pytest.importorskip("pyarrow")

from minari.data_collector import EpisodeBuffer  # noqa: E402

import rbdata.datasets.minari as minari_module  # noqa: E402
from rbdata import SliceSampler  # noqa: E402
from rbdata.datasets.minari import Minari  # noqa: E402
from rbdata.errors import MissingExtraError, ReadOnlyError  # noqa: E402

FORMATS = ["hdf5", "arrow", "parquet"]
#: episode lengths, and how each ends: "term", "trunc" or "" (unfinished: neither flag)
EPISODES = [(5, "term"), (1, "trunc"), (7, ""), (3, "term"), (12, "trunc"), (2, ""), (6, "term")]
REF_MIN, REF_MAX = -20.0, 80.0

DICT_OBS = {
    "pos": ((3,), np.float32),
    "image": ((32, 32, 3), np.uint8),  # JPEG-encoded by minari (uint8, 0..255, >= 32x32)
    "gray": ((32, 32), np.uint8),  # JPEG too, a 2-D (grayscale) image
}


# --- building Minari datasets ----------------------------------------------------------------
@pytest.fixture
def minari_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Minari's data directory for this test (``MINARI_DATASETS_PATH``)."""
    path = tmp_path / "minari-data"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(path))
    return path


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "rbdata-cache"


def dict_spaces() -> tuple[Any, Any]:
    obs = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
            "image": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8),
            "gray": gym.spaces.Box(0, 255, (32, 32), np.uint8),
        }
    )
    act = gym.spaces.Tuple((gym.spaces.Discrete(4), gym.spaces.Box(-1.0, 1.0, (2,), np.float64)))
    return obs, act


def episode(kind: str, fmt: str, steps: int, end: str, rng: np.random.Generator) -> EpisodeBuffer:
    """One random episode of ``steps`` steps, its infos as a DataCollector gives them (lists)."""
    term = np.zeros(steps, bool)
    trunc = np.zeros(steps, bool)
    if end == "term":
        term[-1] = True
    elif end == "trunc":
        trunc[-1] = True
    n = steps + 1
    infos: dict[str, Any]
    if kind == "simple":
        obs: Any = rng.standard_normal((n, 4)).astype(np.float32)
        act: Any = rng.integers(0, 2, steps)
        rewards: Any = rng.standard_normal(steps).astype(np.float32)
        if fmt == "hdf5":  # length T (kept as is) and text (skipped)
            infos = {"t": np.arange(steps), "label": ["x"] * n, "ok": np.ones((n, 1), bool)}
        else:  # minari's arrow reader cannot read back 1-D array infos: lists of scalars
            infos = {"ok": [bool(i % 2) for i in range(n)]}
    else:
        obs = {
            name: (
                rng.integers(0, 256, (n, *shape), dtype=np.uint8)
                if dtype == np.uint8
                else rng.uniform(-1, 1, (n, *shape)).astype(dtype)
            )
            for name, (shape, dtype) in DICT_OBS.items()
        }
        act = (rng.integers(0, 4, steps), rng.uniform(-1, 1, (steps, 2)))
        rewards = [float(r) for r in rng.standard_normal(steps)]  # float64 in the file
        infos = {
            "x": [float(v) for v in rng.standard_normal(n)],
            "v": [rng.standard_normal(2).astype(np.float32) for _ in range(n)],
            # nested: a dict in hdf5, an object array (skipped) from arrow/parquet
            "sub": {"a": [rng.standard_normal(2) for _ in range(n)]},
        }
    return EpisodeBuffer(
        observations=obs,
        actions=act,
        rewards=rewards,
        terminations=term,
        truncations=trunc,
        infos=infos,
    )


def make_dataset(
    dataset_id: str, kind: str = "simple", fmt: str = "hdf5", seed: int = 0, refs: bool = True
) -> Any:
    """Create a Minari dataset under ``$MINARI_DATASETS_PATH`` with random episodes."""
    rng = np.random.default_rng(seed)
    buffers = [episode(kind, fmt, steps, end, rng) for steps, end in EPISODES]
    about = {
        "algorithm_name": "random",
        "author": "rbdata tests",
        "author_email": "tests@example.com",
        "code_permalink": "https://example.com/rbdata",
        "description": "a test dataset",
        "data_format": fmt,
    }
    if kind == "simple":  # CartPole's spaces; an env makes minari keep the reference scores
        scores = {"ref_min_score": REF_MIN, "ref_max_score": REF_MAX} if refs else {}
        return minari.create_dataset_from_buffers(
            dataset_id, buffers, env="CartPole-v1", eval_env="CartPole-v1", **about, **scores
        )
    obs_space, act_space = dict_spaces()
    with warnings.catch_warnings():
        # unavoidable without an environment (these spaces have none): minari's notes
        warnings.filterwarnings("ignore", "`eval_env` is set to None", UserWarning)
        warnings.filterwarnings("ignore", "env_spec is None", UserWarning)
        return minari.create_dataset_from_buffers(
            dataset_id, buffers, observation_space=obs_space, action_space=act_space, **about
        )


# --- the reference: minari's own episodes, step by step --------------------------------------
def leaves(value: Any, key: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, (*key, str(k)))
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            yield from leaves(v, (*key, str(i)))
    else:
        yield key, value


def expected_rows(ep: Any) -> dict[tuple[str, ...], np.ndarray]:
    """The rows of one minari episode, built step by step from what minari returned."""
    steps = len(ep.rewards)
    rows: dict[tuple[str, ...], list[Any]] = {}

    def put(key: tuple[str, ...], value: Any) -> None:
        rows.setdefault(key, []).append(np.asarray(value))

    for t in range(steps):
        for key, value in leaves(ep.observations):
            put(("observation", *key), value[t])
        for key, value in leaves(ep.observations):
            put(("next", "observation", *key), value[t + 1])
        for key, value in leaves(ep.actions):
            put(("action", *key), value[t])
        put(("next", "reward"), ep.rewards[t : t + 1])
        put(("next", "terminated"), ep.terminations[t : t + 1])
        put(("next", "truncated"), ep.truncations[t : t + 1])
        put(("next", "done"), ep.terminations[t : t + 1] | ep.truncations[t : t + 1])
        put(("episode",), np.int64(ep.id))
        for key, value in leaves(ep.infos or {}, ("info",)):
            numeric = isinstance(value, np.ndarray) and value.dtype.kind in "biufc"
            if numeric and value.ndim >= 1 and len(value) in (steps, steps + 1):
                put(key, value[t])
    return {key: np.stack(values) for key, values in rows.items()}


def astuple(key: str | tuple[str, ...]) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else key


def assert_matches_minari(ds: Minari, dataset_id: str) -> set[tuple[str, ...]]:
    """Every row of ``ds`` equals minari's own episodes, key by key, value and dtype."""
    reference = minari.load_dataset(dataset_id)
    start, keys = 0, None
    episodes = 0
    for ep in reference.iterate_episodes():
        want = expected_rows(ep)
        steps = len(ep.rewards)
        got = ds[list(range(start, start + steps))]
        got_keys = {astuple(k) for k in got.keys(True, True)}
        assert got_keys == set(want), (got_keys ^ set(want), ep.id)
        for key, array in want.items():
            expected = torch.from_numpy(array)
            assert got[key].dtype == expected.dtype, (key, got[key].dtype, expected.dtype)
            assert torch.equal(got[key], expected), key
        keys = got_keys if keys is None else keys
        start += steps
        episodes += 1
    assert start == len(ds) == reference.total_steps
    assert ds.num_episodes == episodes == reference.total_episodes
    assert keys is not None
    return keys


# --- tests -------------------------------------------------------------------------------------
CASES = [
    pytest.param(fmt, kind, "memmap", None, id=f"{fmt}-{kind}")
    for fmt in FORMATS
    for kind in ("simple", "dict")
] + [
    pytest.param("parquet", "dict", "arrow", None, id="parquet-dict-arrow-backend"),
    pytest.param("hdf5", "simple", "arrow", 4, id="hdf5-simple-arrow-backend-blocks4"),
    pytest.param("arrow", "dict", "memmap", 5, id="arrow-dict-blocks5"),
]


@pytest.mark.parametrize(("fmt", "kind", "backend", "block_rows"), CASES)
def test_matches_minari(
    minari_home: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    fmt: str,
    kind: str,
    backend: str,
    block_rows: int | None,
) -> None:
    if block_rows is not None:  # small blocks: episodes accumulated and split across blocks
        monkeypatch.setattr(minari_module, "_BLOCK_ROWS", block_rows)
    dataset_id = f"tests/{kind}-{fmt}-v0"
    make_dataset(dataset_id, kind, fmt)
    ds = Minari(dataset_id, cache, backend=backend, progress=False)
    keys = assert_matches_minari(ds, dataset_id)
    base = {
        ("next", "reward"),
        ("next", "terminated"),
        ("next", "truncated"),
        ("next", "done"),
        ("episode",),
    }
    if kind == "simple":
        extra = {("observation",), ("next", "observation"), ("action",), ("info", "ok")}
        if fmt == "hdf5":
            extra.add(("info", "t"))  # "label" (text) skipped
    else:
        names = [("observation", n) for n in DICT_OBS] + [
            ("next", "observation", n) for n in DICT_OBS
        ]
        extra = {*names, ("action", "0"), ("action", "1"), ("info", "x"), ("info", "v")}
        if fmt == "hdf5":
            extra.add(("info", "sub", "a"))  # arrow/parquet: an object array, skipped
    assert keys == base | extra
    info = ds.info
    assert info["family"] == "minari" and info["id"] == dataset_id
    assert info["backend"] == backend
    assert info["transitions"] == sum(steps for steps, _ in EPISODES)
    assert info["episodes"] == len(EPISODES)
    assert info["source"]["data_format"] == fmt
    assert info["source"]["minari_version"] == minari.__version__
    assert Path(info["source"]["path"]).is_dir()
    assert ds.path == cache / "minari" / "tests" / f"{kind}-{fmt}-v0" / backend
    ds.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_images_are_jpeg_encoded(minari_home: Path, cache: Path, fmt: str) -> None:
    dataset_id = f"tests/jpeg-{fmt}-v0"
    make_dataset(dataset_id, "dict", fmt)
    reference = minari.load_dataset(dataset_id)
    assert reference.storage.jpeg_encoding
    data = Path(reference.storage.data_path)
    if fmt == "hdf5":
        import h5py

        with h5py.File(data / "main_data.hdf5", "r") as h5:
            stored = h5["episode_0/observations/image"]
            assert stored.shape[1:] != (32, 32, 3)  # one JPEG byte string per frame
    else:
        import pyarrow as pa
        import pyarrow.dataset

        files = pa.dataset.dataset(
            data / "0", format=fmt, ignore_prefixes=["_", ".", "metadata.json"]
        )
        schema = files.schema
        image = schema.field("observations").type.field("image").type
        assert image == pa.binary()
    # what was stored is not what comes back (JPEG is lossy); ours is what minari returns
    rng = np.random.default_rng(0)
    first = episode("dict", fmt, EPISODES[0][0], EPISODES[0][1], rng)
    ep = next(iter(reference.iterate_episodes()))
    assert ep.observations["image"].shape == (EPISODES[0][0] + 1, 32, 32, 3)
    assert ep.observations["gray"].shape == (EPISODES[0][0] + 1, 32, 32)
    assert not np.array_equal(ep.observations["image"], first.observations["image"])
    ds = Minari(dataset_id, cache, progress=False)
    assert ds.info["source"]["jpeg_encoding"] is True
    steps = EPISODES[0][0]
    got = ds[list(range(steps))]
    assert torch.equal(got["observation", "image"], torch.from_numpy(ep.observations["image"][:-1]))
    assert torch.equal(
        got["next", "observation", "gray"], torch.from_numpy(ep.observations["gray"][1:])
    )
    ds.close()


def test_reopen_needs_no_minari_data(
    minari_home: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_dataset("tests/reopen-v0", "dict", "arrow")
    first = Minari("tests/reopen-v0", cache, progress=False)
    want = first[list(range(len(first)))]
    first.close()
    shutil.rmtree(minari_home)

    def no_loading(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the reopen path must not load the minari dataset")

    monkeypatch.setattr(minari, "load_dataset", no_loading)
    again = Minari("tests/reopen-v0", cache, download=False, progress=False)
    got = again[list(range(len(again)))]
    assert set(got.keys(True, True)) == set(want.keys(True, True))
    for key in want.keys(True, True):
        assert torch.equal(got[key], want[key]), key
    again.close()


def test_download_false_unknown_id(minari_home: Path, cache: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"'tests/unknown-v0' is not local.*download=True"):
        Minari("tests/unknown-v0", cache, download=False, progress=False)
    entry = cache / "minari" / "tests" / "unknown-v0"
    assert not (entry / "memmap").exists()
    assert not list(entry.glob(".memmap.tmp-*"))


def test_bad_id_and_backend(cache: Path) -> None:
    with pytest.raises(ValueError, match=r"not a dataset id"):
        Minari("../escape-v0", cache, progress=False)
    with pytest.raises(ValueError, match=r"backend must be one of"):
        Minari("tests/x-v0", cache, backend="zarr", progress=False)


def test_text_space_is_refused(minari_home: Path, cache: Path) -> None:
    buffers = [
        EpisodeBuffer(
            observations=["ab", "cd", "ef"],
            actions=np.zeros(2, np.int64),
            rewards=[0.0, 1.0],
            terminations=[False, True],
            truncations=[False, False],
        )
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # minari's notes on missing metadata
        minari.create_dataset_from_buffers(
            "tests/text-v0",
            buffers,
            observation_space=gym.spaces.Text(8),
            action_space=gym.spaces.Discrete(2),
        )
    with pytest.raises(ValueError, match=r"^observation: expected a numeric array.*list"):
        Minari("tests/text-v0", cache, progress=False)
    assert not (cache / "minari" / "tests" / "text-v0" / "memmap").exists()


def test_missing_minari_names_the_extra(
    minari_home: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "minari", None)  # `import minari` raises ImportError
    with pytest.raises(MissingExtraError, match=r"pip install 'rbdata\[minari\]'"):
        Minari("tests/anything-v0", cache, progress=False)


def test_download_without_the_hub_names_the_extra(
    minari_home: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Minari's default remote needs huggingface_hub: the error gives rbdata's extra, offline."""
    monkeypatch.delenv("MINARI_REMOTE", raising=False)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import ...` raises ImportError
    monkeypatch.delitem(sys.modules, "minari.storage.remotes.huggingface", raising=False)
    with pytest.raises(MissingExtraError) as info:
        Minari("mujoco/hopper/medium-v0", cache, progress=False)  # not local: a download
    message = str(info.value)
    assert "'huggingface_hub'" in message and "'mujoco/hopper/medium-v0'" in message
    assert message.endswith("pip install 'rbdata[minari]'")
    assert not cache.exists() or list(cache.rglob("*")) == []


def test_other_import_errors_keep_their_message(
    minari_home: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def gcs_missing(*args: Any, **kwargs: Any) -> Any:
        raise ImportError("google-cloud-storage is not installed: pip install 'minari[gcs]'")

    monkeypatch.setenv("MINARI_REMOTE", "gcp://some-bucket")
    monkeypatch.setattr(minari, "load_dataset", gcs_missing)
    with pytest.raises(ImportError, match=r"minari\[gcs\]") as info:
        Minari("mujoco/hopper/medium-v0", cache, progress=False)
    assert not isinstance(info.value, MissingExtraError)


def test_the_extras_bring_what_remote_downloads_need() -> None:
    """``rbdata[minari]`` and ``rbdata[test]`` pull ``minari[hf]``: the default remote's client."""
    import importlib.util

    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    pyproject = ROOT_DIR / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    for extra in ("minari", "test"):
        wanted = [Requirement(r) for r in extras[extra] if Requirement(r).name == "minari"]
        assert len(wanted) == 1 and {"hf", "hdf5", "arrow"} <= wanted[0].extras, extra
    assert importlib.util.find_spec("huggingface_hub") is not None  # the test env has it
    from minari.storage.remotes import DEFAULT_REMOTE, get_cloud_storage

    assert DEFAULT_REMOTE.startswith("hf://")
    storage = get_cloud_storage(DEFAULT_REMOTE)  # built offline: no request until a list
    assert type(storage).__name__ == "HuggingFaceStorage"


def test_normalized_score(minari_home: Path, cache: Path) -> None:
    make_dataset("tests/scored-v0", "simple", "hdf5")
    ds = Minari("tests/scored-v0", cache, progress=False)
    assert (ds.info["ref_min_score"], ds.info["ref_max_score"]) == (REF_MIN, REF_MAX)
    assert ds.metadata["ref_min_score"] == REF_MIN
    assert ds.normalized_score(30.0) == pytest.approx((30.0 - REF_MIN) / (REF_MAX - REF_MIN))
    returns = np.array([REF_MIN, REF_MAX, 0.0])
    np.testing.assert_allclose(ds.normalized_score(returns), [0.0, 1.0, 0.2])
    ds.close()

    make_dataset("tests/unscored-v0", "simple", "hdf5", refs=False)
    plain = Minari("tests/unscored-v0", cache, progress=False)
    assert plain.info["ref_min_score"] is None and plain.info["ref_max_score"] is None
    with pytest.raises(ValueError, match=r"no reference scores"):
        plain.normalized_score(1.0)
    plain.close()


def test_metadata_is_json_safe(minari_home: Path, cache: Path) -> None:
    make_dataset("tests/meta-v0", "dict", "parquet")
    ds = Minari("tests/meta-v0", cache, progress=False)
    meta = ds.metadata
    json.dumps(meta, allow_nan=False)
    reference = minari.load_dataset("tests/meta-v0")
    raw = json.loads((Path(reference.storage.data_path) / "metadata.json").read_text())
    assert meta["observation_space"] == raw["observation_space"]  # minari's serialized space
    assert meta["action_space"] == raw["action_space"]
    assert meta["author"] == ["rbdata tests"]  # a set in minari
    assert meta["dataset_id"] == "tests/meta-v0"
    assert ds.info["keys"]["observation/image"] == [[32, 32, 3], "uint8"]
    assert ds.info["keys"]["action/0"] == [[], "int64"]  # Discrete: as minari returns it
    assert ds.info["keys"]["next/reward"] == [[1], "float64"]
    ds.close()


def test_dataloader_default_collate(minari_home: Path, cache: Path) -> None:
    make_dataset("tests/loader-v0", "dict", "hdf5")
    ds = Minari("tests/loader-v0", cache, backend="arrow", progress=False)
    loader = DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
    rewards, count = [], 0
    for batch in loader:
        assert batch["observation", "image"].shape[1:] == (32, 32, 3)
        assert batch["next", "reward"].shape == (len(batch), 1)
        rewards.append(batch["next", "reward"])
        count += len(batch)
    assert count == len(ds)
    everything = ds[list(range(len(ds)))]["next", "reward"]
    assert torch.equal(torch.cat(rewards).sort(0).values, everything.sort(0).values)
    ds.close()


def test_slices_stay_inside_episodes(minari_home: Path, cache: Path) -> None:
    make_dataset("tests/slices-v0", "simple", "arrow")
    sampler = SliceSampler(
        slice_len=3, traj_key="episode", generator=torch.Generator().manual_seed(0)
    )
    ds = Minari("tests/slices-v0", cache, sampler=sampler, batch_size=12, progress=False)
    seen: set[int] = set()
    for _ in range(50):
        batch = ds.sample().reshape(4, 3)
        episodes = batch["episode"]
        assert bool((episodes == episodes[:, :1]).all())  # never across episodes
        # consecutive steps: each step's next observation is the following step's observation
        assert torch.equal(batch["next", "observation"][:, :-1], batch["observation"][:, 1:])
        seen.update(int(e) for e in episodes[:, 0])
    # episode 2 ends with neither flag: only its id separates it from episode 3
    assert {0, 2, 3, 4, 6} == seen
    # episodes 1 and 5 are shorter than a slice
    ds.close()


def test_failure_midway_leaves_no_entry(
    minari_home: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_dataset("tests/fail-v0", "dict", "hdf5")
    monkeypatch.setattr(minari_module, "_BLOCK_ROWS", 4)
    real = minari_module._blocks
    yielded: list[int] = []

    def failing(*args: Any, **kwargs: Any) -> Iterator[Any]:
        blocks = real(*args, **kwargs)
        block = next(blocks)
        yielded.append(len(block["episode",]))
        yield block
        raise RuntimeError("injected failure")

    monkeypatch.setattr(minari_module, "_blocks", failing)
    with pytest.raises(RuntimeError, match="injected failure"):
        Minari("tests/fail-v0", cache, progress=False)
    assert yielded and 0 < yielded[0] < sum(steps for steps, _ in EPISODES)
    # no entry, no temporary folder, no lock file, no empty folder
    assert not cache.exists() or list(cache.rglob("*")) == []

    monkeypatch.setattr(minari_module, "_blocks", real)
    ds = Minari("tests/fail-v0", cache, progress=False)
    assert_matches_minari(ds, "tests/fail-v0")
    ds.close()


def test_read_only(minari_home: Path, cache: Path) -> None:
    make_dataset("tests/readonly-v0", "simple", "parquet")
    ds = Minari("tests/readonly-v0", cache, progress=False)
    item = ds[0]
    with pytest.raises(ReadOnlyError):
        ds.extend(ds[[0, 1]])
    with pytest.raises(ReadOnlyError):
        ds.add(item)
    assert "Minari('tests/readonly-v0'" in repr(ds)
    ds.close()
