"""The plain files of a :class:`~rbdata.storages.MemmapStorage` directory, torch-free.

Only plain files are used, never symlinks (``O_NOFOLLOW``): :func:`open_fd` refuses a symlink
with a ``ValueError`` naming the file, :func:`regular_size` anything but a regular file. A
data file of a version-2 directory ends with a 32-byte trailer after its rows
(:func:`trailer`, :mod:`rbdata._core.ids`): the storage's id and the leaf's index, checked
by :func:`check_trailer`. ``_rawfile`` maps these files; ``_header`` and ``_meta`` read
them without torch (``rbdata inspect``).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from rbdata._core.ids import id_trailer, read_trailer

__all__ = ["check_trailer", "open_fd", "regular_size", "trailer"]

#: the kind of the trailer after a data file's rows (:mod:`rbdata._core.ids`): the storage's id
#: and the leaf's index
_TRAILER_MAGIC = b"RBDLEAF2"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_fd(path: Path, flags: int, what: str) -> int:
    try:
        return os.open(path, flags | _NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ValueError(f"{str(path)!r}: a symlink; {what} may not be a symlink") from err
        raise


def regular_size(fd: int, path: Path) -> int:
    st = os.fstat(fd)
    if not (st.st_mode & 0o170000) == 0o100000:
        raise ValueError(f"{path}: not a regular file")
    return st.st_size


def trailer(ident: str | None, index: int) -> bytes:
    """The bytes after the rows of leaf ``index``'s file (none without an id)."""
    if ident is None:
        return b""
    return id_trailer(_TRAILER_MAGIC, ident, index)


def check_trailer(found: bytes, ident: str | None, index: int, path: Path) -> None:
    """Check a data file's trailer (the bytes after its rows) against ``layout.json``'s id.

    Raises:
        ValueError: naming the file, if the trailer is not this storage's leaf ``index``'s
            (a file swapped in from another storage, checkpoint or leaf, or corrupt).
    """
    expected = trailer(ident, index)
    if found == expected:
        return
    read = read_trailer(found, _TRAILER_MAGIC)
    if read is not None:
        other, leaf = read
        if other != ident:
            raise ValueError(
                f"{path}: belongs to another storage (id {other}, layout.json says {ident}); "
                "a file swapped in from another storage directory or checkpoint"
            )
        raise ValueError(
            f"{path}: holds leaf {leaf} of this storage, layout.json names it for leaf {index}; "
            "files swapped or renamed"
        )
    raise ValueError(f"{path}: no valid storage id after the rows (corrupt trailer)")
