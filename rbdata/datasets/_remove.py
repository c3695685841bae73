"""``rbdata datasets remove``: converted entries, downloads, and whatever a failure left.

Everything is removed under the lock of what it belongs to, below the cache root only, and
never through a symbolic link. Besides entries, downloaded files and partial downloads, a
remove clears the leftovers of a killed or failed run: stale lock files (taking a lock removes
its file on release, see :mod:`rbdata.datasets._cache`), temporary build folders and the folders
left empty.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from rbdata.datasets._cache import (
    BACKENDS,
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
    tree_size,
)
from rbdata.datasets.atari._catalog import AtariSource, atari_download_path

__all__ = ["remove_command"]


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
