"""``rbdata datasets sample``: write an rbdata sample dataset's file, from the installed wheel.

The sample ids of the D4RL catalog (``datasets/d4rl-samples.tsv``, e.g. ``cartpole-random-v0``)
are not on the D4RL host: their file is built locally by a recipe shipped in the catalog
(``datasets/samples/d4rl_sample.py``, from the bundled ``.npz``). :func:`write_sample` runs it;
the file is then converted like any local copy, with ``D4RL(name, file=PATH)`` or
``rbdata datasets download d4rl/<name> --file PATH``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

from rbdata._core.resources import catalog_path
from rbdata.datasets._catalog import d4rl_catalog, d4rl_entry
from rbdata.datasets._commands import DatasetRef, human_size

__all__ = ["sample_command", "sample_ids", "write_sample"]

_RECIPE = "d4rl_sample.py"


def _recipe() -> ModuleType:
    """The catalog's ``samples/d4rl_sample.py`` recipe, loaded as a module."""
    path = catalog_path("samples", _RECIPE)
    spec = importlib.util.spec_from_file_location("_rbdata_sample_recipe", path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has one
        raise ImportError(f"cannot load the sample recipe {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sample_ids() -> list[str]:
    """The D4RL ids that are rbdata samples (built locally, not on the D4RL host).

    Examples:
        >>> sample_ids()
        ['cartpole-random-v0']
    """
    return sorted(name for name, entry in d4rl_catalog().items() if entry.is_sample)


def write_sample(name: str, path: str | os.PathLike[str]) -> Path:
    """Write the D4RL-layout HDF5 file of the sample ``name`` to ``path`` (atomically).

    Args:
        name: a sample id of the catalog (``cartpole-random-v0``).
        path: the file to write (its folder is created; an existing file is replaced).

    Returns:
        ``path``.

    Raises:
        KeyError: ``name`` is not in the catalog.
        ValueError: ``name`` is a D4RL id but not a sample, or no recipe builds it.
    """
    entry = d4rl_entry(name)
    if not entry.is_sample:
        raise ValueError(
            f"name: {name!r} is a D4RL dataset, not an rbdata sample (samples: "
            f"{', '.join(sample_ids())}); download it with `rbdata datasets download d4rl/{name}`"
        )
    recipe = _recipe()
    if name != recipe.ID:  # pragma: no cover - one recipe per sample id, checked by the tests
        raise ValueError(
            f"name: no recipe builds the sample {name!r} (the recipe builds {recipe.ID!r})"
        )
    target = Path(path).expanduser()
    if target.is_dir():
        raise IsADirectoryError(f"out: {str(target)!r} is a directory, expected a file path")
    return Path(recipe.build(target))


def sample_command(ref: DatasetRef, out: str | None) -> int:
    """``rbdata datasets sample``: write the sample's file, print its path and how to convert it."""
    if ref.family != "d4rl":
        raise ValueError(f"{ref}: samples are D4RL ids (samples: {', '.join(sample_ids())})")
    path = write_sample(ref.name, out if out is not None else f"{ref.name}.hdf5").absolute()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    print(path)
    print(f"{ref}: {human_size(path.stat().st_size)}, sha256 {digest}")
    print(f"convert it with: rbdata datasets download {ref} --file {path}")
    return 0
