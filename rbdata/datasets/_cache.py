"""The dataset cache: where converted datasets live, and how an entry is built exactly once.

Layout of the cache root (``root=``, else ``$RBDATA_HOME``, else the user cache directory)::

    <root>/<family>/downloads/<file>                raw downloads (D4RL HDF5 files)
    <root>/<family>/<id>/<backend>/dataset.json     a converted entry: metadata, counts, source
    <root>/<family>/<id>/<backend>/storage/         the storage directory (memmap or Arrow)

An entry is built in a temporary sibling directory and renamed into place when complete, under
a file lock (``<entry>.lock``, removed on release): a failed or interrupted build leaves no
entry, and a second process asking for the same entry waits, then opens what the first built.
:func:`prune_empty_dirs` removes the folders a failed build leaves empty.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import filelock
import platformdirs

from rbdata._core.atomic import fsync_dir
from rbdata._core.files import read_meta
from rbdata.datasets._catalog import D4RLEntry
from rbdata.datasets._lock import VanishingLock, file_lock

__all__ = [
    "DATASET_FILE",
    "ENTRY_FORMAT",
    "ENTRY_VERSION",
    "STORAGE_DIR",
    "build_entry",
    "cache_root",
    "check_name",
    "d4rl_download_path",
    "entry_dir",
    "lock_for",
    "prune_empty_dirs",
    "read_entry",
]

DATASET_FILE = "dataset.json"
STORAGE_DIR = "storage"
ENTRY_FORMAT = "rbdata.dataset"
ENTRY_VERSION = 1
#: Storage kinds of converted entries: ``memmap`` and ``arrow`` for D4RL, Minari and OGBench,
#: ``frames`` (a :class:`~rbdata.storages.FrameStackStorage`) for the DQN Replay Dataset.
BACKENDS = ("memmap", "arrow", "frames")


def family_backend(family: str) -> str:
    """The backend a family converts to by default: ``frames`` for pixels, else ``memmap``."""
    return "frames" if family == "atari-dqn" else "memmap"


_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+=-]*$")


def cache_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The cache root: ``root``, else ``$RBDATA_HOME``, else the user cache directory.

    Examples:
        >>> cache_root("/tmp/rbdata-cache").as_posix()
        '/tmp/rbdata-cache'
    """
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get("RBDATA_HOME")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir("rbdata"))


def check_name(name: str, what: str = "name") -> list[str]:
    """Split a dataset id into path segments that stay inside their directory.

    Raises:
        ValueError: an empty id, or a segment that is ``.``/``..``, absolute or has characters
            outside ``[A-Za-z0-9_.+=-]`` (the message names the argument).

    Examples:
        >>> check_name("mujoco/hopper/medium-v0")
        ['mujoco', 'hopper', 'medium-v0']
        >>> check_name("../etc")
        Traceback (most recent call last):
        ...
        ValueError: name: '../etc' is not a dataset id (segment '..')
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what}: expected a non-empty dataset id, got {name!r}")
    parts = name.split("/")
    for part in parts:
        if not _SEGMENT.match(part) or part in (".", ".."):
            raise ValueError(f"{what}: {name!r} is not a dataset id (segment {part!r})")
    return parts


def entry_dir(root: Path, family: str, name: str, backend: str) -> Path:
    """The directory of a converted entry (checked to stay below ``root``)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return root.joinpath(family, *check_name(name), backend)


def d4rl_download_path(root: Path, entry: D4RLEntry, url: str | None = None) -> Path:
    """Where the HDF5 file of ``entry`` is downloaded (ids sharing a file share the path)."""
    base = root / "d4rl" / "downloads"
    if url is None:
        parts = [p for p in entry.file.split("/") if p not in ("", ".", "..")]
        return base.joinpath(*parts)
    tag = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    name = url.rstrip("/").rsplit("/", 1)[-1] or "data.hdf5"
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name).lstrip(".") or "data"
    return base / f"url-{tag}" / name


def lock_for(path: Path) -> VanishingLock | filelock.BaseFileLock:
    """The inter-process lock guarding ``path`` (a sibling ``<name>.lock`` file).

    Acquiring it creates the folder and the lock file; releasing it removes the file (see
    :mod:`rbdata.datasets._lock`).
    """
    return file_lock(path)


def prune_empty_dirs(path: Path, root: Path) -> list[Path]:
    """Remove ``path`` and its parents while they are empty folders strictly below ``root``.

    ``os.rmdir`` removes only an empty folder, so a folder another process is filling stays.
    Nothing outside ``root`` is touched; symbolic links are not followed.

    Returns:
        The folders removed, deepest first.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     root = Path(tmp)
        ...     (root / "d4rl" / "hopper" / "memmap").mkdir(parents=True)
        ...     (root / "d4rl" / "kept.txt").touch()
        ...     gone = prune_empty_dirs(root / "d4rl" / "hopper" / "memmap", root)
        ...     [p.relative_to(root).as_posix() for p in gone], sorted(os.listdir(root / "d4rl"))
        (['d4rl/hopper/memmap', 'd4rl/hopper'], ['kept.txt'])
    """
    removed: list[Path] = []
    if not path.is_relative_to(root) or ".." in path.relative_to(root).parts:
        return removed
    current = path
    while current != root and current.is_relative_to(root):
        if current.is_symlink() or not current.is_dir():
            if current.exists() or current.is_symlink():
                break
            current = current.parent  # already gone: look at its parent
            continue
        try:
            current.rmdir()
        except OSError:  # not empty (or not ours to remove): stop here
            break
        removed.append(current)
        current = current.parent
    return removed


def read_entry(entry: Path) -> dict[str, Any]:
    """Read and check ``dataset.json`` of a complete entry.

    Raises:
        FileNotFoundError: ``entry`` is not a complete cache entry.
        ValueError: the metadata is corrupt or of another format version.
    """
    file = entry / DATASET_FILE
    if entry.is_symlink() or file.is_symlink():
        raise FileNotFoundError(f"{str(entry)!r} is not a converted dataset: a symlink")
    return read_meta(entry, DATASET_FILE, ENTRY_FORMAT, ENTRY_VERSION, "converted dataset")


def build_entry(entry: Path, build: Callable[[Path], dict[str, Any]]) -> bool:
    """Build ``entry`` once: ``build(tmp)`` fills a temporary sibling, then it is renamed.

    ``build`` writes the storage below ``tmp`` and returns the metadata, which is written to
    ``tmp/dataset.json`` last. Runs under :func:`lock_for` ``(entry)``; an entry that exists
    when the lock is taken is kept (another process built it).

    Returns:
        ``True`` if this call built the entry, ``False`` if it already existed.
    """
    with lock_for(entry):
        if (entry / DATASET_FILE).is_file():
            return False
        # under the lock, any temporary sibling is a leftover of a killed build
        for stale in entry.parent.glob(f".{entry.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if entry.exists():  # an incomplete entry (no dataset.json): never opened, replaced
            shutil.rmtree(entry)
        tmp = entry.with_name(f".{entry.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        try:
            meta = build(tmp)
            meta = {"format": ENTRY_FORMAT, "version": ENTRY_VERSION, **meta}
            with open(tmp / DATASET_FILE, "w", encoding="utf-8") as f:
                json.dump(meta, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(tmp)
            os.replace(tmp, entry)
            fsync_dir(entry.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return True
