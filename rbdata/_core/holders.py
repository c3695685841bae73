"""Who holds a storage directory, and whether they share it: ``holders.bin``.

A storage held by one process writes without a lock and reads without a version check (its
fastest path). Once several processes hold it, every writer must take the shared write lock
and mark the slots it changes, and every reader re-read what a write overlapped. So a process
that opens a directory must learn whether another one holds it, and how:

- Every process that holds a storage directory keeps ``holders.bin`` open with a *shared*
  ``flock``. The lock belongs to the open file description: a forked child holds what its
  parent holds, and the lock goes when the last descriptor of a holder closes (or its process
  dies: a killed holder never blocks anyone).
- The file's words say how the current holders write: ``mode`` 0 (one holder, unshared) or 1
  (shared: every holder takes the lock and marks versions), and the pid of the one holder.
- :class:`Holders` joins under an exclusive ``flock`` of the directory itself (joins one at a
  time). If an exclusive try-lock of ``holders.bin`` succeeds, nobody else holds it: this
  process is the one holder (``mode`` 0; a mode left by holders that are gone is reset). If
  others hold it shared, this process joins them shared. If one process holds it unshared,
  the join is refused with :class:`~rbdata.errors.StorageInUseError`, which says how to
  share, unless that holder is in this very process and agrees to share (``adopt``).

A holder that becomes shared (pickled, forked, ``share()``) sets ``mode`` 1 first, so that a
later join sees it. A directory this process may not write (a read-only file system, another
user's files) has no holders here: nothing is locked and nobody can write it through this
process.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
from collections.abc import Callable
from pathlib import Path

from rbdata.errors import StorageInUseError

__all__ = ["HOLDERS_FILE", "Holders"]

HOLDERS_FILE = "holders.bin"
_BYTES = 64
_MAGIC = int.from_bytes(b"RBDHLD01", "little")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
_MAGIC_WORD, _MODE, _PID = 0, 1, 2


class Holders:
    """This process's hold on a storage directory (see the module docstring).

    Args:
        root: the storage directory.
        what: the storage class's name, for messages (``"MemmapStorage"``).
        adopt: called with no argument when one process holds the directory unshared and
            that process is this one: it shares that holder (its writes take the lock from
            now on) and returns ``True``, or returns ``False`` (no such holder here).
        advice: what the refusal tells the user to do (default: share the storage there).
        name: the file's name in ``root`` (:data:`HOLDERS_FILE`; a storage whose directory
            other tools list may hide it, e.g. ``_holders.bin`` beside Arrow files).

    Raises:
        StorageInUseError: another process holds the directory and does not share it.
        ValueError: ``holders.bin`` is not a regular file of the expected size.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> root = Path(tempfile.mkdtemp())
        >>> first = Holders(root, "MemmapStorage")
        >>> first.shared
        False
        >>> first.share()
        >>> second = Holders(root, "MemmapStorage")  # the holders share it: join them
        >>> second.shared
        True
        >>> second.close(); first.close()
    """

    def __init__(
        self,
        root: Path,
        what: str,
        adopt: Callable[[], bool] | None = None,
        advice: str | None = None,
        name: str = HOLDERS_FILE,
    ) -> None:
        self.path = root / name
        self._mmap: mmap.mmap | None = None
        self._fd = -1
        #: whether the holders write shared (lock + versions); ``False`` for the one holder
        self.shared = False
        dir_fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)  # joins one at a time
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise ValueError(f"{self.path}: a symlink; refused") from err
                if err.errno in _READ_ONLY:
                    return  # nobody writes this directory through this process
                raise
            try:
                self._join(what, adopt, advice)
            except BaseException:
                self.close()
                raise
        finally:
            os.close(dir_fd)  # releases the directory's lock

    def _join(self, what: str, adopt: Callable[[], bool] | None, advice: str | None) -> None:
        st = os.fstat(self._fd)
        if (st.st_mode & 0o170000) != 0o100000:
            raise ValueError(f"{self.path}: not a regular file")
        if st.st_size == 0:
            os.ftruncate(self._fd, _BYTES)
        elif st.st_size != _BYTES:
            raise ValueError(f"{self.path}: {st.st_size} bytes, expected {_BYTES}; corrupt")
        self._mmap = mmap.mmap(self._fd, _BYTES)
        words = memoryview(self._mmap).cast("q")
        try:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                alone = False
            else:
                alone = True
            if alone or words[_MAGIC_WORD] != _MAGIC:  # nobody else: the one holder
                words[_MODE], words[_PID], words[_MAGIC_WORD] = 0, os.getpid(), _MAGIC
            elif words[_MODE] == 1 or (
                words[_PID] == os.getpid() and adopt is not None and adopt()
            ):
                self.shared = True
            else:
                pid = words[_PID]
                if advice is None:
                    advice = (
                        f"Call storage.share() on the {what} in process {pid} first (then "
                        "every process that opens the path shares it), or send that storage "
                        "object to this process (pickling and forking share it), or close it "
                        "there"
                    )
                where = "this process" if pid == os.getpid() else f"process {pid}"
                raise StorageInUseError(
                    f"{str(self.path.parent)!r}: this {what} is held by {where}, which "
                    "writes it unshared (no lock, no versions): opening it here too could "
                    f"tear reads and lose writes. {advice}; nothing was opened"
                )
            fcntl.flock(self._fd, fcntl.LOCK_SH)  # held while this process holds it
        finally:
            words.release()

    def share(self) -> None:
        """Record that the holders write shared: later joins join shared, never refused."""
        self.shared = True
        if self._mmap is not None:
            words = memoryview(self._mmap).cast("q")
            words[_MODE] = 1
            words.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit too: the lock goes anyway
            self.close()

    def close(self) -> None:
        """Drop this hold (the file's lock goes with the last descriptor of it)."""
        if self._mmap is not None:
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
