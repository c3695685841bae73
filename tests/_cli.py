"""Calling the ``rbdata datasets`` command in-process, and reading its one error line.

Shared by the CLI tests (``tests/cli/``); ``tests/`` is on ``sys.path`` (conftest).
"""

from __future__ import annotations

import pytest

from rbdata.cli import main

__all__ = ["one_error_line", "run"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``rbdata datasets *argv``: its exit code, stdout and stderr."""
    code = main(["datasets", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    """The single ``rbdata: error:`` line of stderr (tqdm bars aside), checked."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("rbdata:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("rbdata: error: "), err
    return lines[0]
