"""Module layering: storages never import a sampler's private modules (and vice versa)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "rbdata"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("storages", "rbdata.samplers._"), ("samplers", "rbdata.storages._")],
)
def test_no_private_imports_across_packages(package: str, forbidden: str) -> None:
    offenders = {
        f"{path.name}: {name}"
        for path in sorted((PACKAGE / package).glob("*.py"))
        for name in _imports(path)
        if name.startswith(forbidden)
    }
    assert not offenders, f"{package} imports private modules of another package: {offenders}"


def test_numba_helpers_live_in_one_private_module() -> None:
    users = [p.name for p in PACKAGE.rglob("*.py") if "intrinsic" in p.read_text(encoding="utf-8")]
    assert users == ["_numba.py"]


#: the private names that packages once called on each other's objects (#24): now the named
#: implementer contract of Storage (gather, add_fast, ...) and Sampler (begin_epoch, epoch_over)
_RETIRED = {"_gather", "_add_fast", "_extend_fast", "_write_row", "_write_rows", "_begin_iter"}
_RETIRED |= {"_epoch_over"}


def test_no_private_calls_on_other_objects() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute) or node.attr not in _RETIRED:
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id == "self":
                continue  # a class's own private helper of the same name (the SB3 adapter's)
            offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: .{node.attr}")
    assert not offenders, f"call the named contract instead: {offenders}"
