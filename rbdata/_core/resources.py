"""Locate the bundled catalog: the top-level ``datasets/`` folder, shipped as ``rbdata/_catalog``.

A wheel installs the catalog inside the package (``rbdata/_catalog/...``); an editable install
or a source checkout reads the repository's ``datasets/`` folder directly.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["catalog_path"]

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # rbdata/
#: Where a wheel puts the catalog.
_INSTALLED = _PACKAGE_DIR / "_catalog"
#: Where the catalog lives in a source checkout (editable installs).
_CHECKOUT = _PACKAGE_DIR.parent / "datasets"


def catalog_path(*parts: str) -> Path:
    """Return the path of a catalog file or folder, installed or in the source checkout.

    Args:
        *parts: path components below the catalog root, e.g.
            ``("samples", "cartpole-random-v0.npz")``; none gives the root itself.

    Returns:
        ``rbdata/_catalog/<parts>`` when the package was installed from a wheel, else
        ``<repository>/datasets/<parts>``.

    Raises:
        FileNotFoundError: neither location holds ``parts``; the message names both.

    Examples:
        >>> catalog_path("samples", "cartpole-random-v0.npz").name
        'cartpole-random-v0.npz'
        >>> catalog_path("samples", "no-such-file.npz")
        Traceback (most recent call last):
        ...
        FileNotFoundError: catalog entry 'samples/no-such-file.npz' not found ...
    """
    for root in (_INSTALLED, _CHECKOUT):
        path = root.joinpath(*parts)
        if root.is_dir() and path.exists():
            return path
    name = "/".join(parts) or "."
    raise FileNotFoundError(
        f"catalog entry {name!r} not found in the installed catalog ({_INSTALLED}) or in the "
        f"source checkout ({_CHECKOUT}); reinstall rbdata, or build sample datasets with the "
        "recipes in the repository's datasets/ folder"
    )
