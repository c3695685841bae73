"""Module layering: storages never import a sampler's private modules (and vice versa)."""

from __future__ import annotations

import ast
import io
import tokenize
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


# --- private names across packages (#24) -----------------------------------------------------
#: the top-level core modules every package may use, private names included; ``_inspect``
#: (once ``rbdata inspect``'s logic) was never one: it was a package of its own
_CORE = {p.stem for p in PACKAGE.glob("_*.py")} - {"__init__", "__main__", "_inspect"}


def _private_crossings(path: Path, package: Path = PACKAGE) -> list[str]:
    """Imports in ``path`` of a private module or name of another package (core excepted).

    A package is ``rbdata.X``, everything below it included; a top-level module that is not
    core (``cli``, ``demo``, ``inspect``) is a package of its own, and so is ``rbdata``'s
    ``__init__``. Lazy imports in function bodies count too.
    """
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        parts.append("")  # a relative import of level 1 resolves to the package itself
    here = ".".join(parts[:2]).rstrip(".")
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: against this module's package
                module = ".".join([*parts[: -node.level], *filter(None, [node.module])])
            targets = [(module.split("."), alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [(alias.name.split("."), "") for alias in node.names]
        else:
            continue
        for names, name in targets:
            if names[0] != "rbdata":
                continue
            if len(names) == 1:  # from rbdata import X: X is the package (or a name of rbdata)
                names, name = ["rbdata", name], ""
            if ".".join(names[:2]) == here or names[1] in _CORE:
                continue
            if any(n.startswith("_") for n in [*names[1:], name]):
                where = f"{path.relative_to(package.parent)}:{node.lineno}"
                found.append(f"{where}: {'.'.join(names)}{' ' + name if name else ''}")
    return found


def test_no_private_names_across_packages() -> None:
    """What crosses a package boundary has a public name: only the core modules are shared."""
    offenders = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _private_crossings(path)]
    assert not offenders, f"import a public name of the other package instead: {offenders}"


@pytest.mark.parametrize(
    ("name", "source", "crosses"),
    [  # the imports #24 removed...
        ("_inspect.py", "from rbdata.checkpoint._codec import MARK\n", True),
        ("_inspect.py", "from rbdata.checkpoint import _FORMAT, component_class\n", True),
        ("_inspect.py", "from rbdata.samplers._trees.sumtree import ROOT\n", True),
        ("cli.py", "def f():\n    from rbdata.datasets import _commands as commands\n", True),
        ("cli.py", "from rbdata._inspect import inspect_path\n", True),
        ("demo.py", "from rbdata.datasets._catalog import d4rl_entry\n", True),
        ("datasets/base.py", "from rbdata.storages._collate import install\n", True),
        ("datasets/base.py", "from ..storages import _collate\n", True),
        ("inspect.py", "import rbdata.samplers._trees.sumtree\n", True),
        ("__init__.py", "from rbdata.storages._describe import KeyInfo\n", True),
        # ... and what stays allowed: a package's own private modules, the core modules
        ("checkpoint/_describe.py", "from rbdata.checkpoint import _FORMAT\n", False),
        ("checkpoint/__init__.py", "from ._codec import MARK\nfrom . import _codec\n", False),
        ("samplers/prioritized.py", "from rbdata.samplers._trees import sumtree\n", False),
        ("storages/memmap/storage.py", "from .._unpack import numpy_views\n", False),
        (
            "storages/base.py",
            "from rbdata._index import as_int_index\nimport rbdata._files\n",
            False,
        ),
        (
            "cli.py",
            "from rbdata._atomic import CURRENT\nfrom rbdata.inspect import Summary\n",
            False,
        ),
        ("__init__.py", "from rbdata._layout import STRING\nfrom rbdata.buffer import X\n", False),
    ],
)
def test_private_crossings_are_found(tmp_path: Path, name: str, source: str, crosses: bool) -> None:
    path = tmp_path / "rbdata" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding="utf-8")
    assert bool(_private_crossings(path, tmp_path / "rbdata")) == crosses


# --- issue 24: components own their files; packages talk through named contracts ---------------
_STORAGE_CLASSES = {"ListStorage", "TensorStorage", "MemmapStorage", "ArrowStorage"}
#: checks of a user's argument (not a switch on the storage's kind): SB3's ``storage=``
_ARGUMENT_CHECKS = {("compat/sb3/_writes.py", "TensorStorage")}


def _package(path: Path) -> str:
    """A module's package under rbdata/ (a top-level module is its own)."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def test_no_switch_on_concrete_storages_outside_storages() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("storages/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Call, ast.Compare)):
                continue
            if isinstance(node, ast.Call) and not (
                isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass")
            ):
                continue
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            for name in sorted(names & _STORAGE_CLASSES):
                if (rel, name) not in _ARGUMENT_CHECKS:
                    found.append(f"{rel}:{node.lineno} {name}")
    assert not found, f"switches on concrete storages outside rbdata/storages/: {found}"


def _private_definitions() -> dict[str, set[str]]:
    """Each private method or ``self._x`` attribute name, with the packages that define it."""
    owners: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        package = _package(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = None
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = node.name
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                name = node.attr
            if name and name.startswith("_") and not name.startswith("__"):
                owners.setdefault(name, set()).add(package)
    return owners


def test_no_private_attribute_of_another_package() -> None:
    owners = _private_definitions()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        package = _package(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
                continue
            if node.attr.startswith("__") or (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                continue
            if isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "super":
                continue
            defined = owners.get(node.attr, set())
            if defined and package not in defined:
                rel = path.relative_to(PACKAGE).as_posix()
                found.append(f"{rel}:{node.lineno} .{node.attr} (of {sorted(defined)})")
    assert not found, f"private attributes of another package used: {found}"


#: code lines a module may have (docstrings, comments and blank lines not counted): past it,
#: a class hides an object to extract with its own state (never squeeze lines to pass)
LIMIT = 450
_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def code_lines(source: str) -> int:
    """Lines of ``source`` that hold code: not blank, not only a comment, not a docstring."""
    docs: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docs.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            code.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docs)
    return len(code)


def test_code_lines_counts_code_only() -> None:
    source = (
        '"""Module doc.\n\nMore."""\n\n# a comment\nimport os\n\n\n'
        'def f(x):\n    """Doc."""\n    y = """not a\n    docstring"""\n'
        "    return (x,  # trailing\n            y)\n"
    )
    # import, def, the two lines of the string, the two lines of the return
    assert code_lines(source) == 6


def test_modules_stay_small() -> None:
    big = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = code_lines(path.read_text(encoding="utf-8"))
        if lines > LIMIT:
            big[path.relative_to(PACKAGE).as_posix()] = lines
    assert not big, f"modules over {LIMIT} lines of code (extract the object inside): {big}"
