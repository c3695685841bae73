"""Sphinx configuration: MyST concept pages plus an autodoc API reference (``make docs``).

The build runs offline and nitpicky with warnings as errors (``tests/test_docs_build.py`` runs
it in the test suite), so a broken docstring or a dangling cross-reference fails the tests.
"""

from __future__ import annotations

import importlib
from typing import Any

project = "rbdata"
author = "rbdata developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "rbdata"

# API reference (docs/api/): every name in a module's ``__all__``, in source order, with the
# constructor's signature on the class line. Constructor arguments are documented in the class
# docstring (``Args:``); "class" keeps autodoc from showing an inherited ``__init__`` docstring
# (torchdata's ``BaseNode.__init__``, ``Exception.__init__``) under a class that has none.
autodoc_member_order = "bysource"
autoclass_content = "class"
autodoc_class_signature = "mixed"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_default_options = {"show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Every cross-reference must resolve, except to libraries whose inventories a build without
# network cannot fetch, and to private names (shown as text, never linked).
nitpicky = True
_EXTERNAL = (
    "abc|builtins|collections|contextlib|enum|io|os|pathlib|threading|types|typing|typing_extensions"
    "|numpy|np|torch|tensordict|torchdata|pyarrow|pa|ray|minari|gymnasium|stable_baselines3"
)
nitpick_ignore_regex = [
    (r"py:.*", rf"({_EXTERNAL})(\..*)?"),
    (r"py:.*", r"rbdata(\.\w+)*\._\w+(\..*)?"),  # private modules and names
]


def _defining_class(target: str) -> tuple[str, list[str]] | None:
    """``rbdata.X.attr`` → (``X``'s defining module + qualname, ``["attr"]``), if X is a class."""
    parts = target.split(".")
    if parts[0] != "rbdata":
        return None
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for i, name in enumerate(parts[split:], start=split):
            obj = getattr(obj, name, None)
            if isinstance(obj, type):
                return f"{obj.__module__}.{obj.__qualname__}", parts[i + 1 :]
        return None
    return None


def _resolve_reexport(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """``missing-reference`` hook: resolve re-exported names (``rbdata.RoundRobinWriter``).

    A class is documented once, where its package exports it; autodoc records its defining
    module's name as an alias, which leads to the documented name and then to the member.
    """
    if node.get("refdomain") != "py":
        return None
    found = _defining_class(node["reftarget"])
    if found is None:
        return None
    defining, rest = found
    domain = env.get_domain("py")
    entry = domain.objects.get(defining)
    if entry is None:
        return None
    target = ".".join([entry.node_id, *rest])
    if target == node["reftarget"]:
        return None
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], target, node, contnode
    )


def _record_init_typehints(app: Any, what: str, name: str, obj: Any, *_: Any) -> None:
    """Record a class's parameter types from ``__init__``, with the annotations evaluated.

    Autodoc reads a class's parameter types from ``inspect.signature(cls)``, which leaves the
    strings of ``from __future__ import annotations`` unevaluated (``"ReplayBuffer"``: an
    ambiguous reference once ``rbdata.compat.sb3`` has a class of that name too); the
    ``__init__`` function's annotations evaluate to the classes themselves.
    """
    if what == "class" and callable(getattr(obj, "__init__", None)):
        from sphinx.ext.autodoc.typehints import record_typehints

        record_typehints(app, what, name, obj.__init__, None, "", "")


def _drop_bases_object(app: Any, doctree: Any) -> None:
    """Remove the uninformative ``Bases: object`` line of plain classes."""
    from docutils import nodes

    for paragraph in list(doctree.findall(nodes.paragraph)):
        if paragraph.astext() == "Bases: object":
            paragraph.parent.remove(paragraph)


def setup(app: Any) -> None:
    """Register the hooks above."""
    app.connect("missing-reference", _resolve_reexport)
    app.connect("doctree-read", _drop_bases_object)
    # after autodoc's own recorder (priority 500), so that these types win
    app.connect("autodoc-process-signature", _record_init_typehints, priority=600)
