"""Where the repository and the shared test helpers are (test files live in subfolders)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ROOT_DIR", "TESTS_DIR", "TEST_PATHS"]

TESTS_DIR = Path(__file__).resolve().parent  #: ``tests/``: the shared helpers, ``sb3_suite``
ROOT_DIR = TESTS_DIR.parent  #: the repository
#: ``tests/`` and its subfolders of test files: on ``sys.path`` in the test process (conftest)
#: and in the child processes the tests start, which import test modules by name
_SUBFOLDERS = sorted(
    str(d)
    for d in TESTS_DIR.rglob("*")
    if d.is_dir()
    and not {"benchmarks", "sb3_suite", "__pycache__"} & set(d.relative_to(TESTS_DIR).parts)
    and any(d.glob("test_*.py"))
)
TEST_PATHS = [str(TESTS_DIR), *_SUBFOLDERS]
