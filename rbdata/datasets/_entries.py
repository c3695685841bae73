"""``rbdata datasets info`` and ``remove``: what a converted entry records, and removing it.

``info`` prints what ``dataset.json`` of an entry records, or how to get the entry. ``remove``
removes converted entries, downloads, and whatever a failure left. Everything is removed under the
lock of what it belongs to, below the cache root only, and never through a symbolic link. Besides
entries, downloaded files and partial downloads, a remove clears the leftovers of a killed or
failed run: stale lock files (taking a lock removes its file on release, see
:mod:`rbdata.datasets._cache`), temporary build folders and the folders left empty.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rbdata.datasets._cache import (
    BACKENDS,
    DATASET_FILE,
    d4rl_download_path,
    lock_for,
    prune_empty_dirs,
    read_entry,
)
from rbdata.datasets._catalog import D4RLEntry, OGBenchFile, d4rl_catalog, ogbench_download_path
from rbdata.datasets._commands import (
    DOWNLOADS,
    DatasetRef,
    catalog_entry,
    converted_backends,
    entry_path,
    human_size,
    pick_backend,
    print_table,
    tree_size,
)
from rbdata.datasets.atari._catalog import AtariSource, atari_download_path

__all__ = ["advice", "info_command", "remove_command"]


_WIDTH = 72  # longest metadata value shown by `info`


def advice(
    ref: DatasetRef, entry: D4RLEntry | OGBenchFile | AtariSource | None, backend: str
) -> str:
    """The commands that get ``ref`` converted, as one sentence (they work from a wheel).

    Examples:
        >>> from rbdata.datasets._catalog import d4rl_entry
        >>> ref = DatasetRef("d4rl", "cartpole-random-v0")
        >>> print(advice(ref, d4rl_entry(ref.name), "memmap"))
        it is an rbdata sample, built locally: run
        `rbdata datasets sample d4rl/cartpole-random-v0 --out cartpole-random-v0.hdf5`, then
        `rbdata datasets download d4rl/cartpole-random-v0 --file cartpole-random-v0.hdf5`
    """
    option = "" if backend == "memmap" else f" --backend {backend}"
    if entry is not None and entry.is_sample:
        out = f"{entry.id}.hdf5"
        return (
            f"it is an rbdata sample, built locally: run `rbdata datasets sample {ref} --out "
            f"{out}`, then `rbdata datasets download {ref} --file {out}{option}`"
        )
    if ref.family == "atari-dqn":
        return f"run `rbdata datasets download {ref}` (with the files in a folder: `--file DIR`)"
    if ref.family in ("d4rl", "ogbench"):
        return (
            f"run `rbdata datasets download {ref}{option}` (with a local copy of the file, "
            f"add `--file PATH`)"
        )
    return f"run `rbdata datasets download {ref}{option}`"


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
    entry = catalog_entry(ref, root)
    backend = pick_backend(root, ref, backend)
    path = entry_path(root, ref, backend)
    if not (path / DATASET_FILE).is_file():
        print(f"id:           {ref}")
        print(f"converted:    no ({backend}; {path})")
        if entry is not None:
            url = entry.url if not entry.is_sample else "- (an rbdata sample, built locally)"
            print(f"url:          {url}")
            print(f"size:         {human_size(entry.size)}")
            print(f"sha256:       {entry.sha256 or '? (not in the catalog)'}")
        print(
            f"rbdata: {ref} is not converted ({backend}): {advice(ref, entry, backend)}",
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
    for key in ("split", "layout", "checkpoints", "codec"):  # OGBench's, DQN Replay's
        if key in info:
            print(f"{key + ':':<13} {info[key]}")
    print(f"size on disk: {human_size(tree_size(path))}")
    if "url" in source:
        print(f"source:       {source.pop('url')}")
    if "sha256" in source:
        print(f"sha256:       {source.pop('sha256')} ({_verified(entry, info, source)})")
    source.pop("sha256_verified", None)
    for name, file in (source.pop("files", None) or {}).items():  # DQN Replay: one per file
        checked = "verified" if file.get("sha256_verified") else "computed"
        size = human_size(file.get("size"))
        print(f"{'source.file:':<13} {name} {size} {file.get('sha256')} ({checked})")
    for key, value in source.items():  # paths in full: they are for copying
        text = value if isinstance(value, str) else _summary(value)
        print(f"{'source.' + key + ':':<13} {text}")
    lo, hi = info.get("ref_min_score"), info.get("ref_max_score")
    print(f"ref scores:   min {'-' if lo is None else lo}, max {'-' if hi is None else hi}")
    keys = info.get("keys") or {}  # named "next/reward" in the entry's info
    print(f"keys ({len(keys)}):")
    print_table(  # named as `rbdata inspect` and Arrow's columns name them: "next.reward"
        [
            (f"  {k.replace('/', '.')}", f"[{', '.join(map(str, v[0]))}]", str(v[1]))
            for k, v in keys.items()
        ],
        ("  KEY", "SHAPE", "DTYPE"),
    )
    metadata = info.get("metadata") or {}
    print(f"metadata ({len(metadata)}):")
    for key, value in metadata.items():
        print(f"  {key}: {_summary(value)}")
    return 0


def _verified(
    entry: D4RLEntry | OGBenchFile | AtariSource | None,
    info: dict[str, Any],
    source: dict[str, Any],
) -> str:
    if not source.get("sha256_verified"):
        return "not verified: no digest was expected"
    if entry is not None and entry.sha256 == info["source"]["sha256"]:
        return "verified: the catalog's digest"
    return "verified: the digest given with --sha256"


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
    """Remove ``paths`` (files or trees below ``root``) under ``target``'s lock; return them.

    A lock file left by a killed process is listed too: taking the lock and releasing it
    removes it.
    """
    _check_inside(root, target)
    if not target.parent.is_dir():  # nothing there; do not create directories for a lock
        return []
    lock_file = target.with_name(target.name + ".lock")
    _check_inside(root, lock_file)
    leftover = lock_file.stat().st_size if lock_file.is_file() else None
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
    if leftover is not None and not os.path.lexists(lock_file):
        removed.append((lock_file, leftover))
    return removed


def remove_command(
    root: Path,
    ref: DatasetRef,
    *,
    backend: str | None,
    all_backends: bool,
    keep_download: bool,
) -> int:
    """``rbdata datasets remove``: remove converted entries and (but Minari) the downloads.

    Each entry is removed under its lock; the D4RL file under the download's lock; then the
    folders left empty. Nothing outside ``root`` is touched and symbolic links are refused.

    Raises:
        FileNotFoundError: nothing of ``ref`` was in the cache (not even a leftover).
    """
    entry = catalog_entry(ref, root)
    backends = list(BACKENDS) if all_backends else [pick_backend(root, ref, backend)]
    removed: list[tuple[Path, int]] = []
    files: set[Path] = set()
    folders: set[Path] = set()
    for b in backends:
        path = entry_path(root, ref, b)
        try:
            source = read_entry(path).get("source", {})
            recorded = [source.get("file")]  # DQN Replay: one per file
            recorded += [f.get("file") for f in (source.get("files") or {}).values()]
            if ref.family != "minari":
                files.update(root / r for r in recorded if isinstance(r, str))
        except (FileNotFoundError, ValueError):
            pass
        stale = list(path.parent.glob(f".{path.name}.tmp-*")) if path.parent.is_dir() else []
        removed += _remove_locked(root, path, [path, *stale])
        folders.add(path.parent)
    catalog_file = None
    if ref.family != "minari" and not keep_download:
        if isinstance(entry, AtariSource):
            for checkpoint in entry.checkpoints:
                names = entry.files(checkpoint).values()
                files.update(atari_download_path(root, entry, name) for name in names)
        elif isinstance(entry, OGBenchFile):
            catalog_file = ogbench_download_path(root, entry)
            files.add(catalog_file)
        elif entry is not None:
            catalog_file = d4rl_download_path(root, entry)
            files.add(catalog_file)
        downloads = root / ref.family / DOWNLOADS
        for file in sorted(files):
            if ".." in file.parts or not file.is_relative_to(downloads):
                raise ValueError(f"refusing to remove {file}: not below {downloads}")
            part = file.with_name(file.name + ".part")
            removed += _remove_locked(root, file, [file, part])
            folders.add(file.parent)
    empty = [d for folder in sorted(folders, reverse=True) for d in prune_empty_dirs(folder, root)]
    if not removed and not empty:
        raise FileNotFoundError(f"{ref}: nothing to remove in the cache {root}")
    for path, size in removed:
        what = "leftover lock file " if path.name.endswith(".lock") else ""
        print(f"removed {what}{path} ({human_size(size)})")
    for folder in empty:
        print(f"removed empty folder {folder}")
    if isinstance(entry, D4RLEntry) and any(p == catalog_file for p, _ in removed):
        shared = [f"d4rl/{i}" for i, e in d4rl_catalog().items() if e.file == entry.file]
        if len(shared) > 1:
            others = ", ".join(i for i in shared if i != str(ref))
            print(f"note: the downloaded file was shared with {others}")
    kept = converted_backends(root, ref)
    if kept:
        print(f"kept: {ref} ({', '.join(kept)}); --all-backends removes every backend")
    return 0
