"""``rbdata --help`` and ``rbdata datasets list`` start without importing torch (issue 25).

Each check runs in a fresh interpreter: torch is already imported in the test process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
