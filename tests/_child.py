"""Run risky code in a fresh interpreter: a crash there is an exit code, not a dead test run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

__all__ = ["ROOT", "run_child"]

ROOT = Path(__file__).resolve().parents[1]


def run_child(
    code: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (dedented) in a new interpreter that imports this checkout's rbdata.

    Returns the completed process (``returncode`` < 0: killed by that signal); output is text.
    """
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
        cwd=ROOT,
        check=False,
    )
