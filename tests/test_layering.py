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
    assert users == ["native.py"]  # rbdata/_core/native.py


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
#: the core every package may use, private names included (``rbdata/_core``)
_CORE = {"_core"}


def test_the_core_is_the_only_shared_private_place() -> None:
    """No private top-level module but the core package; the core imports only itself."""
    loose = sorted(
        p.name for p in PACKAGE.glob("_*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    assert not loose, f"private top-level modules (put them in _core or in their user): {loose}"
    found = {}
    for path in sorted((PACKAGE / "_core").rglob("*.py")):
        deps = {
            name
            for name in _imports(path)
            if name.split(".")[0] == "rbdata"
            and not name.startswith("rbdata._core")
            and name != "rbdata.errors"
        }
        if deps:
            found[path.relative_to(PACKAGE).as_posix()] = sorted(deps)
    assert not found, f"the core imports the rest of rbdata: {found}"


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
            "from rbdata._core.index import as_int_index\nimport rbdata._core.files\n",
            False,
        ),
        (
            "cli.py",
            "from rbdata._core.atomic import CURRENT\nfrom rbdata.inspect import Summary\n",
            False,
        ),
        (
            "__init__.py",
            "from rbdata._core.layout import STRING\nfrom rbdata.buffer import X\n",
            False,
        ),
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


# --- a class lives in one file; no import cycles (issue 36) -----------------------------------
def _module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _rbdata_imports(tree: ast.AST) -> dict[str, str]:
    """Local name -> the rbdata module or ``module.name`` it was imported as."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "rbdata":
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "rbdata":
                    names[alias.asname or alias.name.split(".")[0]] = alias.name
    return names


def bound_functions(source: str, defined: set[str] | None = None) -> list[str]:
    """Class attributes bound to a function of another module (``close = _other.close``).

    ``defined``: the qualified names of the classes and constants that are not functions
    (a class attribute holding a class or a constant of another module is fine).
    """
    tree = ast.parse(source)
    imported = _rbdata_imports(tree)
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in cls.body:
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            value = node.value
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id in ("property", "staticmethod", "classmethod")
                and value.args
            ):
                value = value.args[0]
            target = None
            if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
                if value.value.id in imported:
                    target = f"{imported[value.value.id]}.{value.attr}"
            elif isinstance(value, ast.Name) and value.id in imported:
                target = imported[value.id]
            if target is None or target.rpartition(".")[2].isupper():  # a constant
                continue
            if defined is not None and target in defined:
                continue
            found.append(f"{cls.name}.{ast.unparse(node).split('=')[0].strip()} = {target}")
    return found


def _not_functions() -> set[str]:
    """Qualified names of the classes and module-level constants of rbdata."""
    out = set()
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                out.add(f"{module}.{node.name}")
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        out.add(f"{module}.{target.id}")
    return out


def test_no_class_attribute_is_another_modules_function() -> None:
    defined = _not_functions()
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        bound = bound_functions(path.read_text(encoding="utf-8"), defined)
        if bound:
            found[path.relative_to(PACKAGE).as_posix()] = bound
    assert not found, f"methods defined in another module (a class lives in one file): {found}"


def test_bound_functions_are_found() -> None:
    source = (
        "from rbdata.x import _writes\nfrom rbdata.y import helper, LIMIT\n"
        "class A:\n    close = _writes.close\n    run = helper\n    size = LIMIT\n"
        "    value = property(_writes.value)\n    def ok(self):\n        return 1\n"
    )
    assert bound_functions(source) == [
        "A.close = rbdata.x._writes.close",
        "A.run = rbdata.y.helper",
        "A.value = rbdata.x._writes.value",
    ]


def works_on_others(source: str, classes: set[str]) -> list[str]:
    """Free functions whose first parameter is typed as one of ``classes`` and that read
    its private attributes (``def flush(storage: MemmapStorage): storage._header...``)."""
    found = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.args.args:
            continue
        first = node.args.args[0]
        ann = first.annotation
        name = ann.id if isinstance(ann, ast.Name) else getattr(ann, "value", None)
        if name not in classes:
            continue
        private = sorted(
            {
                n.attr
                for n in ast.walk(node)
                if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == first.arg
                and n.attr.startswith("_")
                and not n.attr.startswith("__")
            }
        )
        if private:
            found.append(f"{node.name}({first.arg}: {name}) reads {', '.join(private)}")
    return found


def test_no_free_function_works_on_a_class_of_its_package() -> None:
    classes: dict[str, set[str]] = {}  # package -> class names defined in it
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(_package(path), set()).add(node.name)
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        hits = works_on_others(path.read_text(encoding="utf-8"), classes.get(_package(path), set()))
        if hits:
            found[path.relative_to(PACKAGE).as_posix()] = hits
    assert not found, (
        f"a class's behaviour outside its class (make it a method or an object): {found}"
    )


def test_functions_working_on_others_are_found() -> None:
    source = (
        "def flush(storage: Memmap) -> None:\n    storage._header.flush()\n"
        "def size(storage: Memmap) -> int:\n    return storage.capacity\n"
        "def other(x: Pool) -> None:\n    x._free = 0\n"
    )
    assert works_on_others(source, {"Memmap"}) == ["flush(storage: Memmap) reads _header"]


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the rbdata modules it imports: at the top, under ``TYPE_CHECKING`` or in a
    function alike (each is a dependency)."""
    paths = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        deps = set()
        for target in _rbdata_imports(ast.parse(path.read_text(encoding="utf-8"))).values():
            while target and target not in paths:  # ``from pkg import name``: pkg
                target = target.rpartition(".")[0]
            if target and target != module:
                deps.add(target)
        graph[module] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles() -> None:
    cycles = import_cycles(import_graph())
    assert not cycles, f"import cycles (TYPE_CHECKING and function-level imports count): {cycles}"


def test_import_cycles_are_found(tmp_path: Path) -> None:
    pkg = tmp_path / "rbdata"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from rbdata.sub.b import B\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rbdata.sub.a import A\n"
    )
    (pkg / "sub" / "c.py").write_text("def f():\n    from rbdata.sub import a\n")
    graph = import_graph(pkg)
    assert import_cycles(graph) == [["rbdata.sub.a", "rbdata.sub.b"]]
    assert graph["rbdata.sub.c"] == {"rbdata.sub.a"}
