"""The Sphinx docs (concept pages and the autodoc API reference) build with no warnings.

``make docs`` builds HTML; this test runs the same sources through Sphinx's ``dummy`` builder,
which imports every documented module, parses every docstring and resolves every
cross-reference (nitpicky, see ``docs/conf.py``) but writes no pages: a broken docstring, an
unknown role or a dangling reference fails the test run, in a third of the HTML build's time.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import warnings
from pathlib import Path

import pytest

sphinx_build = pytest.importorskip("sphinx.cmd.build", reason="needs the docs extra")

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_docs_build_without_warnings(tmp_path: Path) -> None:
    log = tmp_path / "sphinx-warnings.txt"
    argv = ["-b", "dummy", "-E", "-q", "-W", "--keep-going", "-w", str(log)]
    argv += ["-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "out")]
    with warnings.catch_warnings():
        # Sphinx's own extensions (napoleon) call APIs that Sphinx deprecates; that is not ours.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        status = sphinx_build.build_main(argv)
    problems = log.read_text(encoding="utf-8") if log.exists() else ""
    assert status == 0 and not problems, f"Sphinx build failed (exit {status}):\n{problems}"


# Public modules documented elsewhere: the buffer under ``rbdata`` (which re-exports it), the
# command line (``rbdata --help``) and the demo it runs.
NOT_API = {"rbdata.buffer", "rbdata.cli", "rbdata.demo"}


def _public_modules() -> set[str]:
    """``rbdata``'s public top-level modules and packages, and those of ``rbdata.compat``."""
    import rbdata

    found = {f"rbdata.{m.name}" for m in pkgutil.iter_modules(rbdata.__path__)}
    if "rbdata.compat" in found:
        compat = importlib.import_module("rbdata.compat")
        found.remove("rbdata.compat")
        found |= {f"rbdata.compat.{m.name}" for m in pkgutil.iter_modules(compat.__path__)}
    return {name for name in found if not name.rsplit(".", 1)[1].startswith("_")} - NOT_API


def test_every_public_module_has_an_api_page() -> None:
    directives = re.findall(
        r"^\.\. automodule:: (\S+)$",
        "".join(p.read_text(encoding="utf-8") for p in (DOCS / "api").glob("*.rst")),
        flags=re.M,
    )
    missing = _public_modules() - set(directives)
    assert not missing, f"no page under docs/api/ documents {sorted(missing)}"
    assert len(directives) == len(set(directives)), "a module is documented twice"
