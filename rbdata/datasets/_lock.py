"""Inter-process file locks that leave no lock file behind.

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
import os
import time
from pathlib import Path
from types import TracebackType

import filelock

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["VanishingLock", "file_lock"]

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
