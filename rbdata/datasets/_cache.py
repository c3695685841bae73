"""The dataset cache: where converted datasets live, and how an entry is built exactly once.

Layout of the cache root (``root=``, else ``$RBDATA_HOME``, else the user cache directory)::

    <root>/<family>/downloads/<file>                raw downloads (D4RL HDF5 files)
    <root>/<family>/<id>/<backend>/dataset.json     a converted entry: metadata, counts, source
    <root>/<family>/<id>/<backend>/storage/         the storage directory (memmap or Arrow)

An entry is built in a temporary sibling directory and renamed into place when complete, under
a file lock (``<entry>.lock``, removed on release): a failed or interrupted build leaves no
entry, and a second process asking for the same entry waits, then opens what the first built.
:func:`prune_empty_dirs` removes the folders a failed build leaves empty.

The locks are inter-process file locks that leave no lock file behind.

:func:`file_lock` guards a path with ``fcntl.flock`` on a sibling ``<path>.lock`` file and
**removes that file on release**, so a cache never fills with stale ``.lock`` files. Removing a
lock file safely needs one rule on each side:

- the holder unlinks the file *while it still holds the lock*, then unlocks;
- a process that wins the lock checks that the file it locked is still the one at the path
  (same device and inode); if not, its previous holder removed it, and it tries again (opening,
  or creating, the file now at the path).

So two processes never both hold "the" lock: whoever waits on a removed file notices it and
queues on the new one. A process killed while holding a lock leaves its file (the kernel still
drops the ``flock``); the next acquire takes and removes it, and ``rbdata datasets remove``
clears it. Where ``fcntl`` is missing (Windows) the lock is a :class:`filelock.FileLock`, which
deletes its file on release there already.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import filelock
import platformdirs

from rbdata._core.atomic import fsync_dir
from rbdata._core.files import read_meta
from rbdata.datasets._catalog import D4RLEntry

__all__ = [
    "DATASET_FILE",
    "ENTRY_FORMAT",
    "ENTRY_VERSION",
    "STORAGE_DIR",
    "VanishingLock",
    "build_entry",
    "cache_root",
    "check_name",
    "d4rl_download_path",
    "entry_dir",
    "file_lock",
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
    :mod:`rbdata.datasets._cache`).
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


try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


_POLL = 0.05  # seconds between two tries of a lock with a timeout


class VanishingLock:
    """An exclusive ``flock`` on ``<path>.lock``, whose file is removed on release.

    Not reentrant across objects (two objects on one path exclude each other, also in one
    process); one object may be acquired again while it holds the lock (a counter).

    Args:
        lock_file: the lock file's path.
        timeout: seconds to wait in :meth:`acquire`; a negative value waits forever.
    """

    def __init__(self, lock_file: str | os.PathLike[str], timeout: float = -1) -> None:
        self.lock_file = os.fspath(lock_file)
        self.timeout = timeout
        self._fd: int | None = None
        self._count = 0
        self._pid = 0  # the process that took the lock (a forked child must not remove it)

    @property
    def is_locked(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> VanishingLock:
        """Take the lock (creating the lock file and its folder if needed); return ``self``.

        Raises:
            filelock.Timeout: the lock was not free within ``timeout`` seconds.
        """
        if self._fd is not None:
            self._count += 1
            return self
        deadline = None if self.timeout < 0 else time.monotonic() + self.timeout
        while True:
            fd = self._open()
            if fd is None:  # the folder vanished between mkdir and open: again
                continue
            try:
                if not _lock(fd, blocking=deadline is None):
                    os.close(fd)
                    if deadline is not None and time.monotonic() >= deadline:
                        raise filelock.Timeout(self.lock_file)
                    time.sleep(_POLL)
                    continue
                if _is_current(fd, self.lock_file):
                    self._fd, self._count, self._pid = fd, 1, os.getpid()
                    return self
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise
            os.close(fd)  # its holder removed that file: queue on the one at the path now

    def release(self) -> None:
        """Remove the lock file, then drop the lock (nothing if this object does not hold it)."""
        if self._fd is None:
            return
        self._count -= 1
        if self._count > 0:
            return
        fd, self._fd = self._fd, None
        try:
            if self._pid == os.getpid():  # a forked copy only closes its descriptor
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.lock_file)
        finally:
            os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> VanishingLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            self._count = 1
            self.release()

    def __repr__(self) -> str:
        state = "locked" if self.is_locked else "unlocked"
        return f"VanishingLock({self.lock_file!r}, {state})"

    def _open(self) -> int | None:
        Path(self.lock_file).parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            return os.open(self.lock_file, flags, 0o644)
        except FileNotFoundError:
            return None


def _lock(fd: int, blocking: bool) -> bool:
    """``flock`` ``fd`` exclusively; ``False`` if another holds it and not ``blocking``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


def _is_current(fd: int, path: str) -> bool:
    """Whether the locked ``fd`` is still the file at ``path`` (not removed or replaced)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def file_lock(path: Path, timeout: float = -1) -> VanishingLock | filelock.BaseFileLock:
    """Return an inter-process lock guarding ``path``, held on the sibling ``<path>.lock``.

    The lock file (and its folder, if missing) is created on acquire and the file removed on
    release: a lock leaves nothing behind.

    Args:
        path: the file to guard (it need not exist).
        timeout: seconds to wait when acquiring; a negative value waits forever.

    Returns:
        A :class:`VanishingLock` (a :class:`filelock.FileLock` where ``fcntl`` is missing),
        not yet acquired; use it as a context manager. A timeout raises
        :class:`filelock.Timeout`.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     with file_lock(Path(tmp) / "hopper.hdf5") as lock:
        ...         print(Path(lock.lock_file).name, lock.is_locked)
        ...     print(sorted(p.name for p in Path(tmp).iterdir()))
        hopper.hdf5.lock True
        []
    """
    lock_file = str(path) + ".lock"
    if fcntl is None:  # pragma: no cover - Windows
        return filelock.FileLock(lock_file, timeout=timeout)
    return VanishingLock(lock_file, timeout=timeout)
