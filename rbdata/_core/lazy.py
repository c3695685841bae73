"""Names a package imports on first use (PEP 562): one ``__getattr__`` and ``__dir__`` for all.

``import rbdata`` (and its subpackages on the way to ``rbdata inspect``) must not import torch:
their public names are imported when first read. Each such package declares which module
defines each name and binds the pair this module makes::

    __getattr__, __dir__ = lazy_names(__name__, {"ReplayBuffer": "rbdata.buffer"}, globals())
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, names: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, whose ``names`` load lazily.

    Args:
        package: the package's ``__name__`` (named in the ``AttributeError``).
        names: each lazy name → the module that defines it; a module named
            ``f"{package}.{name}"`` (a subpackage) stands for itself.
        namespace: the package's ``globals()``: a name, once imported, is stored there (a
            plain attribute afterwards), and ``__dir__`` lists it with the package's ``__all__``.

    Examples:
        >>> ns = {"__all__": ["sqrt"]}
        >>> getattr_, dir_ = lazy_names("pkg", {"sqrt": "math"}, ns)
        >>> getattr_("sqrt")(9.0), "sqrt" in ns, dir_()
        (3.0, True, ['__all__', 'sqrt'])
        >>> getattr_("cbrt")
        Traceback (most recent call last):
        AttributeError: module 'pkg' has no attribute 'cbrt'
    """

    def __getattr__(name: str) -> Any:
        module_name = names.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(module_name)
        value = module if module_name == f"{package}.{name}" else getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return __getattr__, __dir__
