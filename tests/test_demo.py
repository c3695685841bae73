"""The demo, its CLI, the bundled sample dataset and its recipe."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from rbdata._resources import catalog_path
from rbdata.cli import main
from rbdata.demo import SAMPLE_KEYS, load_sample, run_demo

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "datasets" / "samples" / "cartpole_random.py"
SAMPLE = "cartpole-random-v0"


def _load_recipe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_cartpole_random_recipe", RECIPE)
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


# --- the demo ------------------------------------------------------------------------------
@pytest.mark.parametrize("num_workers", [0, 2])
def test_run_demo_counts(num_workers: int) -> None:
    lines: list[str] = []
    batch_size = 1000
    report = run_demo(batch_size=batch_size, num_workers=num_workers, out=lines.append)
    n = 20_000
    assert report["items"] == n
    assert report["bytes_per_item"] == 4 * 4 + 8 + 4 * 4 + 4 + 3
    assert report["num_workers"] == num_workers
    for path in ("dataloader", "buffer"):
        stats = report[path]
        assert stats["items"] == n
        assert stats["batches"] == math.ceil(n / batch_size)
        assert stats["seconds"] > 0 and stats["batches_per_s"] > 0 and stats["mb_per_s"] > 0
    assert lines and "items: 20000" in lines[1]


def test_run_demo_default_batch_size_counts() -> None:
    report = run_demo(num_workers=0, out=lambda line: None)
    for path in ("dataloader", "buffer"):
        assert report[path]["batches"] == math.ceil(20_000 / 256)


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"num_workers": -1}])
def test_run_demo_rejects_bad_arguments(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        run_demo(out=lambda line: None, **kwargs)


# --- the command line ----------------------------------------------------------------------
def test_cli_main_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--workers", "0", "--batch-size", "5000"]) == 0
    printed = capsys.readouterr().out
    assert "items: 20000" in printed and "4 batches" in printed


def test_cli_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--batch-size", "0"])
    assert exc.value.code == 2
    assert "--batch-size" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


def test_python_m_rbdata_demo() -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-m", "rbdata", "demo", "--workers", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "rbdata demo: cartpole-random-v0" in proc.stdout
    assert "items: 20000, bytes per item: 47" in proc.stdout
    assert proc.stdout.count("79 batches,") == 2
    assert "batches/s" in proc.stdout and "MB/s" in proc.stdout
