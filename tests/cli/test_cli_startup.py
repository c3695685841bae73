"""``rbdata --help``, ``rbdata datasets list`` (issue 25) and ``rbdata inspect`` (issue 37)
start without importing torch (nor tensordict).

Each check runs in a fresh interpreter: torch is already imported in the test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _paths import ROOT_DIR

ROOT = ROOT_DIR

_RUN = """
import contextlib, io, sys
from rbdata.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main({argv!r})
    except SystemExit as stop:  # --help exits 0
        code = stop.code
print(code, "torch" in sys.modules, len(out.getvalue()))
"""


def _run(code: str, tmp_path: Path) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["RBDATA_HOME"] = str(tmp_path / "cache")
    env["MINARI_DATASETS_PATH"] = str(tmp_path / "minari")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["datasets", "--help"], ["datasets", "list"], ["inspect", "--help"]],
    ids=" ".join,
)
def test_help_and_list_do_not_import_torch(argv: list[str], tmp_path: Path) -> None:
    code, torch_imported, printed = _run(_RUN.format(argv=argv), tmp_path).split()
    assert code == "0" and int(printed) > 0
    assert torch_imported == "False"


def test_import_rbdata_is_lazy_and_complete(tmp_path: Path) -> None:
    code = (
        "import sys, rbdata\n"
        "lazy = 'torch' not in sys.modules\n"
        "names = [n for n in rbdata.__all__ if getattr(rbdata, n, None) is None]\n"
        "from rbdata import ReplayBuffer, TensorStorage\n"
        "from rbdata.datasets import D4RL, Minari, OfflineDataset\n"
        "ok = ReplayBuffer is rbdata.ReplayBuffer and set(rbdata.__all__) <= set(dir(rbdata))\n"
        "try:\n"
        "    rbdata.NoSuchName\n"
        "except AttributeError as err:\n"
        "    ok = ok and 'NoSuchName' in str(err)\n"
        "print(lazy, names, ok)"
    )
    assert _run(code, tmp_path) == "True [] True"


# --- rbdata inspect reads metadata without torch (issue 37, item 5) ---------------------------
_INSPECT = """
import contextlib, io, json, sys
from rbdata.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(["inspect", {path!r}])
print(json.dumps([code, out.getvalue(), "torch" in sys.modules, "tensordict" in sys.modules]))
"""


def _transitions(n: int) -> Any:
    import torch
    from tensordict import TensorDict

    return TensorDict(
        {
            "observation": torch.randn(n, 3),
            "action": torch.arange(n),
            "next": {"reward": torch.randn(n, 1), "done": torch.zeros(n, 1, dtype=torch.bool)},
        },
        batch_size=[n],
    )


def _frames(n: int) -> Any:
    import torch
    from tensordict import TensorDict

    frames = torch.arange((n + 3) * 4, dtype=torch.uint8).view(n + 3, 2, 2)
    obs = torch.stack([frames[i : i + 3] for i in range(n)])
    nxt = torch.stack([frames[i + 1 : i + 4] for i in range(n)])
    return TensorDict({"observation": obs, ("next", "observation"): nxt}, [n])


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One of each kind ``rbdata inspect`` reads, written by the objects that own them."""
    import hashlib

    import torch

    from rbdata import ArrowStorage, MemmapStorage, PrioritizedSampler, ReplayBuffer, TensorStorage
    from rbdata.datasets import D4RL
    from rbdata.storages import FrameStackStorage
    from tests._d4rl_files import serve, write_d4rl_file

    root = tmp_path_factory.mktemp("inspect")
    memmap = MemmapStorage(10, path=root / "memmap")
    memmap.set(slice(0, 4), _transitions(4))
    memmap.close()
    arrow = ArrowStorage(10, path=root / "arrow", chunk_size=4)
    arrow.set(slice(0, 6), _transitions(6))
    arrow.close()
    frames = FrameStackStorage(20, stack=3, path=root / "frames", codec="lz4")
    frames.set(slice(0, 5), _frames(5))
    frames.close()
    rb = ReplayBuffer(TensorStorage(16), batch_size=4)
    rb.extend(_transitions(7))
    rb.dumps(root / "checkpoint")
    sampler = PrioritizedSampler(
        32, alpha=0.6, beta=0.4, generator=torch.Generator().manual_seed(1)
    )
    rb = ReplayBuffer(TensorStorage(32), sampler, batch_size=8)
    rb.extend(_transitions(20))
    batch = rb.sample()
    rb.update_priority(batch["index"], torch.rand(8) + 0.5)
    rb.dumps(root / "prioritized")
    file = root / "src" / "data.hdf5"
    file.parent.mkdir()
    write_d4rl_file(file, n=50)
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    with serve(file.parent) as (url, _):
        ds = D4RL(
            "hopper-medium-v2", root / "home", url=url + "data.hdf5", sha256=digest, progress=False
        )
    ds.storage.close()
    return {
        "memmap": root / "memmap",
        "arrow": root / "arrow",
        "frames": root / "frames",
        "checkpoint": root / "checkpoint",
        "prioritized": root / "prioritized",
        "dataset": Path(ds.path),
    }


@pytest.mark.parametrize(
    "kind", ["memmap", "arrow", "frames", "checkpoint", "prioritized", "dataset"]
)
def test_inspect_does_not_import_torch(kind: str, on_disk: dict[str, Path], tmp_path: Path) -> None:
    from rbdata.inspect import format_summary, inspect_path

    path = on_disk[kind]
    code, out, torch_imported, tensordict_imported = json.loads(
        _run(_INSPECT.format(path=str(path)), tmp_path)
    )
    summary = inspect_path(path)  # in this process, torch imported: the same report
    assert summary.kind == {"prioritized": "checkpoint"}.get(kind, kind)
    assert (code, out) == (0, format_summary(summary) + "\n")
    assert (torch_imported, tensordict_imported) == (False, False)
    if kind == "prioritized":  # the trees' roots were read (no torch.frombuffer)
        assert summary.checkpoint is not None
        state = summary.checkpoint["sampler"]["state"]
        assert state["total_priority"] is not None and state["min_priority"] is not None
        assert "total_priority:" in out


def test_packages_are_lazy_and_complete(tmp_path: Path) -> None:
    code = (
        "import sys, types\n"
        "import rbdata.checkpoint, rbdata.samplers, rbdata.storages\n"
        "import rbdata.storages.arrow, rbdata.storages.frames, rbdata.storages.memmap\n"
        "lazy = 'torch' not in sys.modules\n"
        "mods = [rbdata.checkpoint, rbdata.samplers, rbdata.storages, rbdata.storages.arrow,\n"
        "        rbdata.storages.frames, rbdata.storages.memmap]\n"
        "missing = [f'{m.__name__}.{n}' for m in mods for n in m.__all__\n"
        "           if getattr(m, n, None) is None]\n"
        "from rbdata.storages import convert\n"
        "ok = callable(convert) and not isinstance(convert, types.ModuleType)\n"
        "print(lazy, missing, ok)"
    )
    assert _run(code, tmp_path) == "True [] True"
