"""The logic behind ``rbdata datasets ...``: dataset ids, the cache's contents, the subcommands.

An ID is ``d4rl/<name>`` or ``minari/<dataset_id>`` (lower-case prefixes, case-sensitive, so
Minari's own ``D4RL/...`` namespace stays unambiguous: ``minari/D4RL/door/human-v2``); a bare
name without ``/`` is a D4RL id. Each ``*_command`` function prints its report to stdout,
notes to stderr, and returns the exit code; errors are raised (``rbdata.cli`` prints them as
one line with :func:`error_line`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rbdata.datasets._cache import BACKENDS, DATASET_FILE, entry_dir, lock_for, read_entry
from rbdata.datasets._catalog import D4RLEntry, d4rl_catalog, d4rl_entry
from rbdata.datasets.minari import _minari
from rbdata.errors import MissingExtraError

__all__ = [
    "FAMILIES",
    "DatasetRef",
    "cached_entries",
    "converted_backends",
    "download_command",
    "error_line",
    "human_size",
    "info_command",
    "list_command",
    "parse_id",
    "path_command",
    "remove_command",
    "tree_size",
]

FAMILIES = ("d4rl", "minari")
_DOWNLOADS = "downloads"
_WIDTH = 72  # longest metadata value shown by `info`


@dataclass(frozen=True)
class DatasetRef:
    """A parsed dataset ID: its family (``"d4rl"``/``"minari"``) and its name in the family."""

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
        >>> parse_id("D4RL/door/human-v2")
        Traceback (most recent call last):
        ...
        ValueError: 'D4RL/door/human-v2' is not a dataset ID: ... 'minari/D4RL/door/human-v2' ...
    """
    from rbdata.datasets._cache import check_name

    for family in FAMILIES:
        if text.startswith(family + "/"):
            name = text[len(family) + 1 :]
            check_name(name, "ID")
            return DatasetRef(family, name)
    if "/" in text:
        raise ValueError(
            f"{text!r} is not a dataset ID: write 'minari/{text}' for a Minari dataset "
            "(IDs are d4rl/<name> or minari/<dataset_id>, the prefixes in lower case)"
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


def _entry(root: Path, ref: DatasetRef, backend: str) -> Path:
    return entry_dir(root, ref.family, ref.name, backend)


def converted_backends(root: Path, ref: DatasetRef) -> list[str]:
    """The backends ``ref`` is converted to in the cache under ``root``."""
    return [b for b in BACKENDS if (_entry(root, ref, b) / DATASET_FILE).is_file()]


def cached_entries(root: Path, family: str) -> dict[str, list[str]]:
    """Every converted entry of ``family`` under ``root``: name -> backends, sorted by name."""
    base = root / family
    found: dict[str, list[str]] = {}
    for dirpath, dirnames, files in os.walk(base):
        here = Path(dirpath)
        dirnames[:] = [
            d for d in dirnames if not d.startswith(".") and (here != base or d != _DOWNLOADS)
        ]
        if here != base and here.name in BACKENDS and DATASET_FILE in files:
            found.setdefault(here.parent.relative_to(base).as_posix(), []).append(here.name)
            dirnames[:] = []
    return {k: sorted(v, key=BACKENDS.index) for k, v in sorted(found.items())}


def _pick_backend(root: Path, ref: DatasetRef, backend: str | None) -> str:
    """``backend``, else memmap, else the one backend ``ref`` is converted to."""
    if backend is not None:
        return backend
    have = converted_backends(root, ref)
    return have[0] if have and "memmap" not in have else "memmap"


def _catalog(ref: DatasetRef, root: Path) -> D4RLEntry | None:
    """The D4RL catalog entry of ``ref``; ``None`` for Minari or a no longer listed but cached id.

    Raises:
        KeyError: an unknown D4RL id with nothing in the cache (with "did you mean").
    """
    if ref.family != "d4rl":
        return None
    try:
        return d4rl_entry(ref.name)
    except KeyError:
        if converted_backends(root, ref):
            return None
        raise


def _count(rows: Sequence[object]) -> str:
    return f"{len(rows)} dataset{'' if len(rows) == 1 else 's'}"


def _print_table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())


# --- list ------------------------------------------------------------------------------------
def list_command(root: Path, *, family: str | None, downloaded: bool, remote: bool) -> int:
    """``rbdata datasets list``: the D4RL catalog and the Minari datasets, and what is cached."""
    code = 0
    if family in (None, "d4rl"):
        _list_d4rl(root, downloaded)
    if family in (None, "minari"):
        if family is None:
            print()
        code = _list_minari(root, downloaded, remote)
    return code


def _list_d4rl(root: Path, downloaded: bool) -> None:
    from rbdata.datasets.d4rl import d4rl_download_path

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
        _print_table(rows, ("ID", "SIZE", "FILE", "CONVERTED"))


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
        minari = _minari("Minari datasets")
        local = dict(minari.list_local_datasets())
        if remote and not downloaded:
            try:
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
        _print_table(rows, ("ID", "SIZE", "DATA", "CONVERTED"))
    if problem is not None:
        print(f"rbdata: error: {problem}", file=sys.stderr)
        return 1
    return 0


# --- download --------------------------------------------------------------------------------
def download_command(
    root: Path, ref: DatasetRef, *, backend: str, url: str | None, sha256: str | None
) -> int:
    """``rbdata datasets download``: download and convert; print the path and a summary."""
    existed = (_entry(root, ref, backend) / DATASET_FILE).is_file()
    dataset: Any
    if ref.family == "d4rl":
        from rbdata.datasets.d4rl import D4RL

        d4rl_entry(ref.name)
        dataset = D4RL(ref.name, root, backend=backend, url=url, sha256=sha256, progress=True)
    else:
        if url is not None or sha256 is not None:
            raise ValueError("--url and --sha256 apply to D4RL ids only, not to Minari datasets")
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


# --- info ------------------------------------------------------------------------------------
def _summary(value: Any) -> str:
    """A short text for a metadata value: long lists by their shape, long text truncated."""
    shape: list[int] = []
    item: Any = value
    while isinstance(item, list):
        shape.append(len(item))
        item = item[0] if item else None
    if shape and math.prod(shape) > 16:  # never serialise a big list (policy weights...)
        return f"<list {'x'.join(map(str, shape))}>"
    text = " ".join((value if isinstance(value, str) else json.dumps(value)).split())
    return text if len(text) <= _WIDTH else text[: _WIDTH - 3] + "..."


def info_command(root: Path, ref: DatasetRef, *, backend: str | None) -> int:
    """``rbdata datasets info``: what ``dataset.json`` of a converted entry records."""
    entry = _catalog(ref, root)
    backend = _pick_backend(root, ref, backend)
    path = _entry(root, ref, backend)
    if not (path / DATASET_FILE).is_file():
        print(f"id:           {ref}")
        print(f"converted:    no ({backend}; {path})")
        if entry is not None:
            print(f"url:          {entry.url}")
            print(f"size:         {human_size(entry.size)}")
            print(f"sha256:       {entry.sha256 or '? (not in the catalog)'}")
        print(
            f"rbdata: {ref} is not converted ({backend}): run `rbdata datasets download {ref}`"
            f"{'' if backend == 'memmap' else f' --backend {backend}'}",
            file=sys.stderr,
        )
        return 1
    info = read_entry(path)
    source = dict(info.get("source") or {})
    print(f"id:           {ref}")
    print(f"backend:      {info.get('backend')}")
    print(f"path:         {path}")
    print(f"transitions:  {info.get('transitions', 0):,}")
    print(f"episodes:     {info.get('episodes', 0):,}")
    print(f"size on disk: {human_size(tree_size(path))}")
    if "url" in source:
        print(f"source:       {source.pop('url')}")
    if "sha256" in source:
        print(f"sha256:       {source.pop('sha256')} ({_verified(entry, info, source)})")
    source.pop("sha256_verified", None)
    for key, value in source.items():
        print(f"{'source.' + key + ':':<13} {_summary(value)}")
    lo, hi = info.get("ref_min_score"), info.get("ref_max_score")
    print(f"ref scores:   min {'-' if lo is None else lo}, max {'-' if hi is None else hi}")
    keys = info.get("keys") or {}
    print(f"keys ({len(keys)}):")
    _print_table(
        [(f"  {k}", f"[{', '.join(map(str, v[0]))}]", str(v[1])) for k, v in keys.items()],
        ("  KEY", "SHAPE", "DTYPE"),
    )
    metadata = info.get("metadata") or {}
    print(f"metadata ({len(metadata)}):")
    for key, value in metadata.items():
        print(f"  {key}: {_summary(value)}")
    return 0


def _verified(entry: D4RLEntry | None, info: dict[str, Any], source: dict[str, Any]) -> str:
    if not source.get("sha256_verified"):
        return "not verified: no digest was expected"
    if entry is not None and entry.sha256 == info["source"]["sha256"]:
        return "verified: the catalog's digest"
    return "verified: the digest given with --sha256"


# --- path ------------------------------------------------------------------------------------
def path_command(root: Path, ref: DatasetRef | None, *, backend: str | None) -> int:
    """``rbdata datasets path``: print the entry's directory (exit 1 if it is not converted).

    Without an ID, print the cache root.
    """
    if ref is None:
        print(root)
        return 0
    _catalog(ref, root)
    backend = _pick_backend(root, ref, backend)
    path = _entry(root, ref, backend)
    print(path)
    if not (path / DATASET_FILE).is_file():
        print(f"rbdata: {ref} is not converted ({backend})", file=sys.stderr)
        return 1
    return 0


# --- remove ----------------------------------------------------------------------------------
def _check_inside(root: Path, path: Path) -> None:
    """Refuse ``path`` unless it is below ``root``, with no ``..`` or symbolic link on the way."""
    parts = path.relative_to(root).parts if path.is_relative_to(root) else ()
    if not parts or ".." in parts:
        raise ValueError(f"refusing to remove {path}: not below the cache root {root}")
    current = root
    for part in parts:
        current = current / part
        if current.is_symlink():
            raise ValueError(f"refusing to remove {path}: {current} is a symbolic link")


def _remove_locked(root: Path, target: Path, paths: Iterable[Path]) -> list[tuple[Path, int]]:
    """Remove ``paths`` (files or trees below ``root``) under ``target``'s lock; return them."""
    _check_inside(root, target)
    if not target.parent.is_dir():  # nothing there; do not create directories for a lock
        return []
    removed = []
    with lock_for(target):
        for path in paths:
            _check_inside(root, path)
            if path.is_dir():
                removed.append((path, tree_size(path)))
                shutil.rmtree(path)
            elif path.exists():
                removed.append((path, path.stat().st_size))
                path.unlink()
    return removed


def remove_command(
    root: Path,
    ref: DatasetRef,
    *,
    backend: str | None,
    all_backends: bool,
    keep_download: bool,
) -> int:
    """``rbdata datasets remove``: remove converted entries and (D4RL) the downloaded file.

    Each entry is removed under its lock; the D4RL file under the download's lock. Nothing
    outside ``root`` is touched and symbolic links are refused.

    Raises:
        FileNotFoundError: nothing of ``ref`` was in the cache.
    """
    entry = _catalog(ref, root)
    backends = list(BACKENDS) if all_backends else [_pick_backend(root, ref, backend)]
    removed: list[tuple[Path, int]] = []
    files: set[Path] = set()
    for b in backends:
        path = _entry(root, ref, b)
        try:
            recorded = read_entry(path).get("source", {}).get("file")
            if ref.family == "d4rl" and isinstance(recorded, str):
                files.add(root / recorded)
        except (FileNotFoundError, ValueError):
            pass
        stale = list(path.parent.glob(f".{path.name}.tmp-*")) if path.parent.is_dir() else []
        removed += _remove_locked(root, path, [path, *stale])
    catalog_file = None
    if ref.family == "d4rl" and not keep_download:
        from rbdata.datasets.d4rl import d4rl_download_path

        if entry is not None:
            catalog_file = d4rl_download_path(root, entry)
            files.add(catalog_file)
        downloads = root / "d4rl" / _DOWNLOADS
        for file in sorted(files):
            if ".." in file.parts or not file.is_relative_to(downloads):
                raise ValueError(f"refusing to remove {file}: not below {downloads}")
            part = file.with_name(file.name + ".part")
            removed += _remove_locked(root, file, [file, part])
    if not removed:
        raise FileNotFoundError(f"{ref}: nothing to remove in the cache {root}")
    for path, size in removed:
        print(f"removed {path} ({human_size(size)})")
    if entry is not None and any(path == catalog_file for path, _ in removed):
        shared = [f"d4rl/{i}" for i, e in d4rl_catalog().items() if e.file == entry.file]
        if len(shared) > 1:
            others = ", ".join(i for i in shared if i != str(ref))
            print(f"note: the downloaded file was shared with {others}")
    kept = converted_backends(root, ref)
    if kept:
        print(f"kept: {ref} ({', '.join(kept)}); --all-backends removes every backend")
    return 0
