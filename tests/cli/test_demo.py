"""The demo, its CLI, the bundled sample dataset, the D4RL-layout sample and their recipes."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from _paths import ROOT_DIR

from rbdata._core.resources import catalog_path
from rbdata.cli import main
from rbdata.datasets import D4RL
from rbdata.datasets._catalog import d4rl_entry
from rbdata.demo import SAMPLE_KEYS, load_sample, run_demo
from rbdata.demo._mirror import environ, serving

REPO = ROOT_DIR
RECIPE = REPO / "datasets" / "samples" / "cartpole_random.py"
D4RL_RECIPE = REPO / "datasets" / "samples" / "d4rl_sample.py"
SAMPLE = "cartpole-random-v0"


def _load_recipe(path: Path = RECIPE) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_recipe_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shipped() -> dict[str, np.ndarray]:
    with np.load(catalog_path("samples", f"{SAMPLE}.npz"), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


# --- the sample dataset --------------------------------------------------------------------
def test_shipped_file_is_small() -> None:
    assert catalog_path("samples", f"{SAMPLE}.npz").stat().st_size < 1_000_000


def test_load_sample_keys_shapes_dtypes() -> None:
    td = load_sample()
    n = td.batch_size[0]
    assert n == 20_000
    expected: dict[str | tuple[str, str], tuple[tuple[int, ...], torch.dtype]] = {
        "observation": ((n, 4), torch.float32),
        "action": ((n,), torch.int64),
        ("next", "observation"): ((n, 4), torch.float32),
        ("next", "reward"): ((n, 1), torch.float32),
        ("next", "done"): ((n, 1), torch.bool),
        ("next", "terminated"): ((n, 1), torch.bool),
        ("next", "truncated"): ((n, 1), torch.bool),
    }
    assert set(td.keys(True, True)) == set(expected)
    for key, (shape, dtype) in expected.items():
        assert td[key].shape == shape, key
        assert td[key].dtype == dtype, key


def test_sample_episodes_are_consistent() -> None:
    td = load_sample()
    done = td["next", "done"].squeeze(-1)
    terminated = td["next", "terminated"].squeeze(-1)
    truncated = td["next", "truncated"].squeeze(-1)
    assert torch.equal(done, terminated | truncated)
    assert 0 < int(done.sum()) < done.numel()
    assert set(td["action"].unique().tolist()) == {0, 1}
    assert torch.all(td["next", "reward"] == 1.0)
    # Within an episode, the next observation is the following step's observation ...
    cont = ~done[:-1]
    assert torch.equal(td["next", "observation"][:-1][cont], td["observation"][1:][cont])
    # ... and after a reset it is not.
    ends = done[:-1]
    assert not torch.any(
        torch.all(td["next", "observation"][:-1][ends] == td["observation"][1:][ends], dim=-1)
    )


def test_load_sample_unknown_name() -> None:
    with pytest.raises(FileNotFoundError, match=r"no bundled sample dataset 'nope'.*" + SAMPLE):
        load_sample("nope")


def test_catalog_path_missing_entry() -> None:
    with pytest.raises(FileNotFoundError, match="not found in the installed catalog"):
        catalog_path("samples", "missing.npz")


def test_recipe_reproduces_shipped_file(tmp_path: Path, shipped: dict[str, np.ndarray]) -> None:
    recipe = _load_recipe()
    out = tmp_path / "sub" / f"{SAMPLE}.npz"
    recipe.build(out)
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no temporary left
    with np.load(out, allow_pickle=False) as npz:
        rebuilt = {k: npz[k] for k in npz.files}
    assert sorted(rebuilt) == sorted(shipped) == sorted(SAMPLE_KEYS)
    for key, array in shipped.items():
        assert rebuilt[key].dtype == array.dtype, key
        np.testing.assert_array_equal(rebuilt[key], array, err_msg=key)


# --- the D4RL-layout sample: recipe, catalog row, conversion --------------------------------
D4RL_COLUMNS = {  # HDF5 dataset -> (sample array, dtype)
    "observations": ("observation", np.float32),
    "actions": ("action", np.int64),
    "rewards": ("next_reward", np.float32),
    "terminals": ("next_terminated", np.bool_),
    "timeouts": ("next_truncated", np.bool_),
    "next_observations": ("next_observation", np.float32),
}


@pytest.fixture(scope="module")
def d4rl_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _load_recipe(D4RL_RECIPE).build(tmp_path_factory.mktemp("d4rl") / "sample.hdf5")


def test_d4rl_recipe_rows_equal_the_sample(d4rl_file: Path, shipped: dict[str, np.ndarray]) -> None:
    n = shipped["observation"].shape[0]
    with h5py.File(d4rl_file, "r") as h5:
        for name, (array, dtype) in D4RL_COLUMNS.items():
            column = h5[name][()]
            assert column.dtype == dtype, name
            expected = shipped[array].reshape(column.shape)
            assert column.shape[0] == n, name
            np.testing.assert_array_equal(column, expected, err_msg=name)
        np.testing.assert_array_equal(h5["infos/action_log_probs"][()], np.log(0.5).astype("f4"))
        meta = {k: h5["metadata"][k][()] for k in h5["metadata"]}
    assert meta["algorithm"] == b"uniform random policy"
    assert meta["env"] == b"CartPole-v1"
    assert meta["num_episodes"] == int(shipped["next_done"].sum())
    assert meta["gymnasium_version"].decode() == importlib.metadata.version("gymnasium")


def test_d4rl_recipe_is_deterministic_and_atomic(tmp_path: Path, d4rl_file: Path) -> None:
    out = _load_recipe(D4RL_RECIPE).build(tmp_path / "sub" / "again.hdf5")
    assert out == tmp_path / "sub" / "again.hdf5"
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary left
    assert out.read_bytes() == d4rl_file.read_bytes()


def test_d4rl_recipe_script(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(D4RL_RECIPE), str(tmp_path / "x.hdf5")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    digest = hashlib.sha256((tmp_path / "x.hdf5").read_bytes()).hexdigest()
    assert f"sha256 {digest}" in proc.stdout
    assert "mean return of the 884 complete episodes (ref_min_score): 22.6165" in proc.stdout


def test_d4rl_samples_catalog_row(shipped: dict[str, np.ndarray]) -> None:
    entry = d4rl_entry(SAMPLE)
    assert entry.is_sample and entry.url == f"rbdata-samples/{SAMPLE}.hdf5"
    assert entry.size is None and entry.sha256 is None  # built locally: no published digest
    mean, episodes = _load_recipe(D4RL_RECIPE).mean_episode_return(shipped)
    assert episodes == 884
    assert entry.ref_min_score == round(mean, 4)
    assert entry.ref_max_score == 500.0


def test_d4rl_sample_converts_to_the_sample_rows(tmp_path: Path, d4rl_file: Path) -> None:
    """Served by the demo's mirror and read by D4RL, every row equals the bundled sample's."""
    root = tmp_path / "mirror"
    (root / "rbdata-samples").mkdir(parents=True)
    (root / "rbdata-samples" / f"{SAMPLE}.hdf5").write_bytes(d4rl_file.read_bytes())
    with serving(root) as mirror, environ({"RBDATA_D4RL_MIRROR": mirror.url}):
        ds = D4RL(SAMPLE, root=tmp_path / "home", progress=False)
    try:
        td = load_sample()
        got = ds[:]
        for key in SAMPLE_KEYS.values():
            torch.testing.assert_close(got[key], td[key], rtol=0, atol=0, msg=str(key))
        assert len(ds) == td.batch_size[0] and ds.num_episodes == 885  # 884 + an unfinished one
        assert ds.metadata["env"] == "CartPole-v1"
        assert ds.info["source"]["sha256"] == hashlib.sha256(d4rl_file.read_bytes()).hexdigest()
        assert ds.normalized_score(500.0) == 1.0
    finally:
        ds.close()


# --- the demo ------------------------------------------------------------------------------
DEMO_STEPS = 150


@pytest.fixture(scope="module")
def demo() -> Iterator[tuple[dict[str, Any], list[str], dict[str, dict[str, str]]]]:
    """One demo run in a hostile environment: a dead proxy, a foreign RBDATA_HOME."""
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RBDATA_HOME", "/nonexistent/rbdata-home")
        mp.delenv("RBDATA_D4RL_MIRROR", raising=False)
        mp.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there
        mp.setenv("HTTP_PROXY", "http://127.0.0.1:9")
        mp.setenv("no_proxy", "example.org")
        before = dict(os.environ)
        threads, rng = torch.get_num_threads(), torch.get_rng_state()
        report = run_demo(num_workers=0, steps=DEMO_STEPS, out=lines.append, progress=False)
        after = dict(os.environ)
        assert torch.get_num_threads() == threads
        assert torch.equal(torch.get_rng_state(), rng)  # the global RNG is not used
        yield report, lines, {"before": before, "after": after}


def test_run_demo_restores_the_environment(demo: Any) -> None:
    _, _, env = demo
    assert env["after"] == env["before"]


def test_run_demo_removes_its_files(demo: Any) -> None:
    _, lines, _ = demo
    (home_line,) = [line for line in lines if "RBDATA_HOME=" in line]
    home = Path(home_line.split("RBDATA_HOME=")[1].strip())
    assert home.name == "home" and not home.parent.exists()


def test_run_demo_report(demo: Any) -> None:
    report, lines, _ = demo
    assert report["dataset"] == SAMPLE
    assert report["transitions"] == load_sample().batch_size[0] == 20_000
    assert report["episodes"] == 885
    assert {"observation", "action", "next/observation", "next/reward", "episode"} <= set(
        report["keys"]
    )
    assert len(report["sha256"]) == 64 and report["file_bytes"] > 0
    assert report["download_s"] > 0 and report["convert_s"] > 0
    # the converted entry opens faster than it was downloaded and converted
    assert report["reopen_s"] < report["download_s"] + report["convert_s"]
    assert report["steps"] == DEMO_STEPS and report["epochs"] == 2  # 79 batches an epoch
    assert report["batches_per_s"] > 0
    assert abs(report["normalized_score"]) < 1e-3  # ref_min is this data's mean return
    assert any("TD loss" in line for line in lines)


def test_run_demo_loss_goes_down(demo: Any) -> None:
    report, _, _ = demo
    losses = report["losses"]
    assert len(losses) == DEMO_STEPS // 50
    assert losses[-1] < 0.9 * losses[0]


def test_run_demo_with_workers_is_deterministic() -> None:
    kwargs: dict[str, Any] = {"steps": 20, "log_every": 10, "out": lambda line: None}
    a = run_demo(num_workers=2, progress=False, **kwargs)
    b = run_demo(num_workers=2, progress=False, **kwargs)
    assert a["losses"] == b["losses"] and len(a["losses"]) == 2


@pytest.mark.parametrize(
    "kwargs", [{"batch_size": 0}, {"num_workers": -1}, {"steps": 0}, {"log_every": True}]
)
def test_run_demo_rejects_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        run_demo(out=lambda line: None, **kwargs)


# --- the command line ----------------------------------------------------------------------
def test_cli_main_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--workers", "0", "--batch-size", "5000", "--steps", "8"]) == 0
    printed = capsys.readouterr().out
    assert "transitions=20000" in printed and "8 steps (2 epochs)" in printed


def test_cli_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["demo", "--batch-size", "0"], ["demo", "--steps", "0"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert argv[1] in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


def test_python_m_rbdata_demo() -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-m", "rbdata", "demo", "--workers", "0", "--steps", "100"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"rbdata demo: D4RL '{SAMPLE}'" in out
    assert "download " in out and "convert " in out and "reopen from the cache" in out
    assert "transitions=20000, episodes=885" in out
    assert out.count("TD loss") == 2 and "batches/s" in out and "normalized score" in out
    assert "100%" in proc.stderr  # the download's and the conversion's progress bars
