"""The logic behind ``rbdata datasets ...``: dataset ids, the cache's contents, the subcommands.

An ID is ``d4rl/<name>``, ``minari/<dataset_id>``, ``ogbench/<name>`` or
``atari-dqn/<Game>/<run>[/<checkpoints>]`` (lower-case prefixes, case-sensitive, so Minari's own
``D4RL/...`` namespace stays unambiguous: ``minari/D4RL/door/human-v2``; ``ogbench/<name>-val``
is the validation split of ``<name>``; ``atari-dqn/Pong/1`` is ``atari-dqn/Pong/1/50``); a bare
name without ``/`` is a D4RL id. Each ``*_command`` prints its report to stdout, notes to
stderr, and returns the exit code; errors are raised (``rbdata.cli`` prints them as one line
with :func:`error_line`). ``info`` and ``remove`` live in ``_entries``, the ``atari-dqn`` rows
and download in :mod:`rbdata.datasets.atari`.

``rbdata datasets sample`` writes an rbdata sample dataset's file, from the installed wheel. The
sample ids of the D4RL catalog (``datasets/d4rl-samples.tsv``, e.g. ``cartpole-random-v0``) are not
on the D4RL host: their file is built locally by a recipe shipped in the catalog
(``datasets/samples/d4rl_sample.py``, from the bundled ``.npz``). :func:`write_sample` runs it; the
file is then converted like any local copy, with ``D4RL(name, file=PATH)`` or ``rbdata datasets
download d4rl/<name> --file PATH``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from rbdata._core.resources import catalog_path
from rbdata.datasets import atari
from rbdata.datasets._cache import BACKENDS, DATASET_FILE, check_name, d4rl_download_path, entry_dir
from rbdata.datasets._catalog import (
    D4RLEntry,
    OGBenchFile,
    d4rl_catalog,
    d4rl_entry,
    minari_module,
    ogbench_catalog,
    ogbench_download_path,
    ogbench_file,
    remote_access,
)
from rbdata.datasets.atari._catalog import AtariSource, atari_id, atari_rows
from rbdata.errors import MissingExtraError

__all__ = [
    "DOWNLOADS",
    "DatasetRef",
    "FAMILIES",
    "cached_entries",
    "catalog_entry",
    "converted_backends",
    "download_command",
    "entry_path",
    "error_line",
    "human_size",
    "list_command",
    "parse_id",
    "path_command",
    "pick_backend",
    "print_table",
    "sample_command",
    "sample_ids",
    "tree_size",
    "write_sample",
]


FAMILIES = ("d4rl", "minari", "ogbench", "atari-dqn")
DOWNLOADS = "downloads"


@dataclass(frozen=True)
class DatasetRef:
    """A parsed dataset ID: its family (``"d4rl"``, ``"minari"``, ...) and its name."""

    family: str
    name: str

    def __str__(self) -> str:
        return f"{self.family}/{self.name}"


def parse_id(text: str) -> DatasetRef:
    """Parse a command-line dataset ID.

    Raises:
        ValueError: an empty or malformed ID, or a name with ``/`` but no family prefix.

    Examples:
        >>> parse_id("hopper-medium-v2")
        DatasetRef(family='d4rl', name='hopper-medium-v2')
        >>> str(parse_id("minari/D4RL/door/human-v2"))
        'minari/D4RL/door/human-v2'
        >>> parse_id("ogbench/scene-play-v0-val")
        DatasetRef(family='ogbench', name='scene-play-v0-val')
        >>> parse_id("atari-dqn/Pong/1")  # the entry's name: its checkpoints too
        DatasetRef(family='atari-dqn', name='Pong/1/50')
        >>> parse_id("D4RL/door/human-v2")
        Traceback (most recent call last):
        ...
        ValueError: 'D4RL/door/human-v2' is not a dataset ID: ... 'minari/D4RL/door/human-v2' ...
    """
    for family in FAMILIES:
        if text.startswith(family + "/"):
            name = text[len(family) + 1 :]
            check_name(name, "ID")
            if family == "atari-dqn":
                name = atari_id(name).id
            return DatasetRef(family, name)
    if "/" in text:
        raise ValueError(
            f"{text!r} is not a dataset ID: write 'minari/{text}' for a Minari dataset "
            "(IDs are d4rl/<name>, minari/<dataset_id>, ogbench/<name> or "
            "atari-dqn/<Game>/<run>, the prefixes in lower case)"
        )
    check_name(text, "ID")
    return DatasetRef("d4rl", text)


def error_line(err: BaseException) -> str:
    """The message of ``err`` on one line (a ``KeyError``'s message, not its repr).

    Examples:
        >>> error_line(KeyError("unknown D4RL dataset 'x'"))
        "unknown D4RL dataset 'x'"
    """
    if isinstance(err, KeyError) and err.args:
        text = str(err.args[0])
    else:
        text = str(err) or type(err).__name__
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def human_size(size: float | None) -> str:
    """A byte count in binary units, ``"?"`` when unknown.

    Examples:
        >>> human_size(152756557), human_size(512), human_size(None)
        ('145.7 MiB', '512 B', '?')
    """
    if size is None:
        return "?"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def tree_size(path: Path) -> int:
    """Bytes of the regular files below ``path`` (symbolic links are not followed)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            file = Path(dirpath, name)
            if not file.is_symlink():
                total += file.stat().st_size
    return total


def entry_path(root: Path, ref: DatasetRef, backend: str) -> Path:
    """The directory of ``ref``'s converted entry for ``backend`` under ``root``."""
    return entry_dir(root, ref.family, ref.name, backend)


def converted_backends(root: Path, ref: DatasetRef) -> list[str]:
    """The backends ``ref`` is converted to in the cache under ``root``."""
    return [b for b in BACKENDS if (entry_path(root, ref, b) / DATASET_FILE).is_file()]


def cached_entries(root: Path, family: str) -> dict[str, list[str]]:
    """Every converted entry of ``family`` under ``root``: name -> backends, sorted by name."""
    base = root / family
    found: dict[str, list[str]] = {}
    for dirpath, dirnames, files in os.walk(base):
        here = Path(dirpath)
        dirnames[:] = [
            d for d in dirnames if not d.startswith(".") and (here != base or d != DOWNLOADS)
        ]
        if here != base and here.name in BACKENDS and DATASET_FILE in files:
            found.setdefault(here.parent.relative_to(base).as_posix(), []).append(here.name)
            dirnames[:] = []
    return {k: sorted(v, key=BACKENDS.index) for k, v in sorted(found.items())}


def pick_backend(root: Path, ref: DatasetRef, backend: str | None) -> str:
    """``backend``, else memmap, else the one backend ``ref`` is converted to."""
    if backend is not None:
        return backend
    have = converted_backends(root, ref)
    return have[0] if have and "memmap" not in have else "memmap"


def catalog_entry(ref: DatasetRef, root: Path) -> D4RLEntry | OGBenchFile | AtariSource | None:
    """The catalog entry of ``ref`` (D4RL, the OGBench file, or the DQN Replay files).

    ``None`` for Minari, or for a no longer listed but cached id.

    Raises:
        KeyError: an unknown D4RL or OGBench id with nothing in the cache (with "did you mean").
    """
    if ref.family not in ("d4rl", "ogbench", "atari-dqn"):
        return None
    try:
        if ref.family == "atari-dqn":
            return atari_id(ref.name)
        return d4rl_entry(ref.name) if ref.family == "d4rl" else ogbench_file(ref.name)
    except KeyError:
        if converted_backends(root, ref):
            return None
        raise


def _count(rows: Sequence[object]) -> str:
    return f"{len(rows)} dataset{'' if len(rows) == 1 else 's'}"


def print_table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> None:
    """Print ``rows`` under ``header`` in left-aligned columns (the last one unpadded)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())


# --- list ------------------------------------------------------------------------------------
def list_command(root: Path, *, family: str | None, downloaded: bool, remote: bool) -> int:
    """``rbdata datasets list``: the D4RL, OGBench, DQN Replay catalogs, Minari, the cache."""
    code = 0
    if family in (None, "d4rl"):
        _list_d4rl(root, downloaded)
    if family in (None, "minari"):
        if family is None:
            print()
        code = _list_minari(root, downloaded, remote)
    if family in (None, "ogbench"):
        if family is None:
            print()
        _list_ogbench(root, downloaded)
    if family in (None, "atari-dqn"):
        if family is None:
            print()
        rows = atari_rows(root, cached_entries(root, "atari-dqn"), downloaded)
        what = "in the cache" if downloaded else "in the catalog (games x runs)"
        print(f"DQN Replay (atari-dqn): {_count(rows)} {what} (cache: {root / 'atari-dqn'})")
        if rows:
            print_table(rows, ("ID", "SIZE", "FILES", "CONVERTED (checkpoints)"))
    return code


def _list_d4rl(root: Path, downloaded: bool) -> None:
    cached = cached_entries(root, "d4rl")
    rows = []
    for name, entry in d4rl_catalog().items():
        backends = cached.get(name, [])
        file = d4rl_download_path(root, entry).is_file()
        if downloaded and not (backends or file):
            continue
        where = "downloaded" if file else ("sample" if entry.is_sample else "remote")
        rows.append((f"d4rl/{name}", human_size(entry.size), where, ",".join(backends) or "-"))
    what = "in the cache" if downloaded else "in the catalog"
    print(f"D4RL: {_count(rows)} {what} (cache: {root / 'd4rl'})")
    if rows:
        print_table(rows, ("ID", "SIZE", "FILE", "CONVERTED"))


def _list_ogbench(root: Path, downloaded: bool) -> None:
    """Both files of every OGBench id (``<id>`` and ``<id>-val``); reads no data, no torch."""
    cached = cached_entries(root, "ogbench")
    rows = []
    for entry in ogbench_catalog().values():
        for source in (entry.train, entry.val):
            backends = cached.get(source.id, [])
            file = ogbench_download_path(root, source).is_file()
            if downloaded and not (backends or file):
                continue
            where = "downloaded" if file else "remote"
            size = human_size(source.size)
            rows.append((f"ogbench/{source.id}", size, where, ",".join(backends) or "-"))
    what = "in the cache" if downloaded else "in the catalog (train and -val splits)"
    print(f"OGBench: {_count(rows)} {what} (cache: {root / 'ogbench'})")
    if rows:
        print_table(rows, ("ID", "SIZE", "FILE", "CONVERTED"))


def _minari_size(meta: dict[str, Any]) -> str:
    mb = meta.get("dataset_size")  # Minari: MB (10**6 bytes), rounded to 0.1
    if not isinstance(mb, (int, float)):
        return "?"
    return human_size(mb * 1e6) if mb > 0 else "<0.1 MB"


def _list_minari(root: Path, downloaded: bool, remote: bool) -> int:
    cached = cached_entries(root, "minari")
    local: dict[str, Any] = {}
    remote_meta: dict[str, Any] = {}
    problem = None
    try:
        minari = minari_module("Minari datasets")
        local = dict(minari.list_local_datasets())
        if remote and not downloaded:
            try:
                with remote_access("listing remote Minari datasets"):
                    remote_meta = dict(minari.list_remote_datasets())
            except Exception as err:  # network, the remote's client library, its answer...
                problem = f"could not list remote Minari datasets: {error_line(err)}"
    except MissingExtraError as err:
        print(f"Minari: local and remote datasets are not listed: {err}")
        if remote and not downloaded:
            problem = str(err)
    names = set(cached) if downloaded else {*cached, *local, *remote_meta}
    rows = []
    for name in sorted(names):
        meta = local.get(name) or remote_meta.get(name) or {}
        where = "local" if name in local else ("remote" if name in remote_meta else "-")
        backends = ",".join(cached.get(name, [])) or "-"
        rows.append((f"minari/{name}", _minari_size(meta), where, backends))
    what = "in the cache" if downloaded else "local, cached" + (", remote" if remote else "")
    print(f"Minari: {_count(rows)} {what} (cache: {root / 'minari'})")
    if rows:
        print_table(rows, ("ID", "SIZE", "DATA", "CONVERTED"))
    if problem is not None:
        print(f"rbdata: error: {problem}", file=sys.stderr)
        return 1
    return 0


# --- download --------------------------------------------------------------------------------
def download_command(
    root: Path,
    ref: DatasetRef,
    *,
    backend: str,
    url: str | None,
    sha256: str | None,
    file: str | None = None,
) -> int:
    """``rbdata datasets download``: download (or take ``file``) and convert; print the path."""
    existed = (entry_path(root, ref, backend) / DATASET_FILE).is_file()
    dataset: Any
    if ref.family == "d4rl":
        from rbdata.datasets.d4rl import D4RL

        d4rl_entry(ref.name)
        if file is not None and url is not None:
            raise ValueError(f"--file and --url: give one of them, not both (got {file}, {url})")
        dataset = D4RL(
            ref.name, root, backend=backend, url=url, file=file, sha256=sha256, progress=True
        )
    elif ref.family == "ogbench":
        from rbdata.datasets.ogbench import OGBench

        source = ogbench_file(ref.name)
        if url is not None:
            raise ValueError(
                f"--url applies to D4RL ids only; for {ref} set RBDATA_OGBENCH_MIRROR to a "
                "mirror (a URL or a file:// folder), or pass --file PATH"
            )
        dataset = OGBench(
            source.dataset,
            root,
            split=source.split,
            backend=backend,
            file=file,
            sha256=sha256,
            progress=True,
        )
    elif ref.family == "atari-dqn":
        dataset = atari.open_atari(
            root, ref.name, backend=backend, url=url, sha256=sha256, file=file
        )
    else:
        if url is not None or sha256 is not None or file is not None:
            raise ValueError(
                "--url, --file and --sha256 apply to D4RL ids only (--file and --sha256 to "
                "OGBench ids too), not to Minari datasets (Minari reads local datasets from "
                "MINARI_DATASETS_PATH)"
            )
        from rbdata.datasets.minari import Minari

        dataset = Minari(ref.name, root, backend=backend, progress=True)
    try:
        info = dataset.info
        print(dataset.path)
        print(
            f"{ref} ({backend}): {info['transitions']:,} transitions, "
            f"{info['episodes']:,} episodes, {len(info.get('keys', {}))} keys, "
            f"{human_size(tree_size(dataset.path))} on disk"
            + (" (already converted)" if existed else "")
        )
    finally:
        dataset.close()
    return 0


# --- path ------------------------------------------------------------------------------------
def path_command(root: Path, ref: DatasetRef | None, *, backend: str | None) -> int:
    """``rbdata datasets path``: print the entry's directory (exit 1 if it is not converted).

    Without an ID, print the cache root.
    """
    if ref is None:
        print(root)
        return 0
    catalog_entry(ref, root)
    backend = pick_backend(root, ref, backend)
    path = entry_path(root, ref, backend)
    print(path)
    if not (path / DATASET_FILE).is_file():
        print(f"rbdata: {ref} is not converted ({backend})", file=sys.stderr)
        return 1
    return 0


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
