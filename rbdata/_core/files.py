"""File helpers shared by the on-disk storages: directories, atomic JSON, metadata checks."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

_MAX_META_BYTES = 1 << 24

__all__ = [
    "atomic_write_json",
    "check_dir",
    "inside",
    "open_nofollow",
    "preallocate",
    "read_meta",
    "remove_with",
    "start_writeback",
    "storage_dir",
]


def _libc(name: str, argtypes: list[Any]) -> Any:
    """The libc function ``name`` (Linux: ``fallocate``, ``sync_file_range``), or ``None``."""
    with contextlib.suppress(Exception):
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)  # the process's own libc
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        return fn
    return None


_OFF = ctypes.c_int64
_FALLOCATE = _libc("fallocate", [ctypes.c_int, ctypes.c_int, _OFF, _OFF])
_SYNC_FILE_RANGE = _libc("sync_file_range", [ctypes.c_int, _OFF, _OFF, ctypes.c_uint])
_FALLOC_FL_KEEP_SIZE = 1
_PAGE = 4096
_SYNC_FILE_RANGE_WRITE = 2


def preallocate(fd: int, offset: int, nbytes: int) -> None:
    """Reserve the disk blocks of bytes ``[offset, offset + nbytes)`` before writing them.

    As ``numpy.tofile`` does: one ``fallocate`` (keeping the file size) instead of one
    delayed-allocation reservation per page written, which makes large writes faster.
    The file's size and bytes are unchanged; a hint only (no error where unsupported).
    """
    start = -(-offset // _PAGE) * _PAGE  # whole pages inside the range: no block past it
    stop = (offset + nbytes) // _PAGE * _PAGE
    if _FALLOCATE is not None and stop > start:
        _FALLOCATE(fd, _FALLOC_FL_KEEP_SIZE, start, stop - start)


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing back the dirty pages of a byte range, without waiting (Linux).

    A hint only: durability still needs an fsync, which then finds less left to write.
    Unlike fdatasync, it forces no journal commit.
    """
    if _SYNC_FILE_RANGE is not None and nbytes > 0:
        _SYNC_FILE_RANGE(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def _remove_dir(path: str, owner_pid: int) -> None:
    # Forked DataLoader workers inherit the finalizer: only the creating process removes.
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)


def remove_with(owner: object, root: Path) -> weakref.finalize:
    """Remove directory ``root`` when ``owner`` is closed (call the result) or collected."""
    return weakref.finalize(owner, _remove_dir, str(root), os.getpid())


def storage_dir(
    owner: object, path: str | os.PathLike[str] | None, prefix: str
) -> tuple[Path, weakref.finalize | None]:
    """A new storage directory: temporary (removed with ``owner``) or an empty ``path``."""
    if path is None:
        root = Path(tempfile.mkdtemp(prefix=prefix))
        return root, remove_with(owner, root)
    root = Path(path)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        name = type(owner).__name__
        raise FileExistsError(
            f"path {str(root)!r} already holds data; reopen it with "
            f"{name}.open({str(root)!r}) or choose an empty directory"
        )
    root.mkdir(parents=True, exist_ok=True)
    return root, None


def check_dir(root: Path, what: str) -> Path:
    """``root`` itself, checked: an existing directory that is not a symlink.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        ValueError: ``root`` is a symlink or not a directory.
    """
    if root.is_symlink():
        raise ValueError(f"{str(root)!r}: a {what} directory may not be a symlink")
    if not root.exists():
        raise FileNotFoundError(f"{str(root)!r}: no such {what} directory")
    if not root.is_dir():
        raise ValueError(f"{str(root)!r} is not a directory")
    return root


def inside(root: Path, name: object, what: str = "file") -> Path:
    """``root / name`` for a plain file name read from metadata, never a way out of ``root``.

    ``name`` must be a non-empty string without a path separator, NUL, ``.`` or ``..``; if the
    path exists it must not be a symlink. Nothing is opened.

    Raises:
        ValueError: naming the file and what is wrong with it.

    Examples:
        >>> inside(Path("/data/st"), "leaf-000.bin").name
        'leaf-000.bin'
        >>> inside(Path("/data/st"), "../etc/passwd")
        Traceback (most recent call last):
        ...
        ValueError: '../etc/passwd': a file name in /data/st must be a plain name inside it
    """
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or (os.altsep is not None and os.altsep in name)
    ):
        raise ValueError(f"{name!r}: a {what} name in {root} must be a plain name inside it")
    path = root / name
    if path.is_symlink():
        raise ValueError(f"{str(path)!r}: a symlink; {what}s of a storage may not be symlinks")
    return path


def open_nofollow(path: Path, mode: str) -> Any:
    """``open(path, mode)`` (binary modes) that refuses a symlink at ``path`` (``O_NOFOLLOW``).

    Closes the gap between a check of ``path`` and its opening: a symlink swapped in between is
    refused by the kernel (``ValueError``), never followed.
    """
    flags = {
        "rb": os.O_RDONLY,
        "r+b": os.O_RDWR,
        "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
        "xb": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
        "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    }[mode]
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ValueError(
                f"{str(path)!r}: a symlink; storage files may not be symlinks"
            ) from err
        raise
    return os.fdopen(fd, mode)


def atomic_write_json(path: Path, obj: Any, fsync: bool = True) -> None:
    """Write JSON to a temporary file (fsync'ed if ``fsync``), then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a killed writer's leftover (a symlink is unlinked, not followed)
    with open_nofollow(tmp, "xb") as f:
        f.write(json.dumps(obj, indent=1).encode("utf-8"))
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)  # replaces a symlink at ``path`` itself, never its target


def read_meta(root: Path, name: str, fmt: str, version: int, what: str) -> dict[str, Any]:
    """Read and check the JSON metadata file ``name`` of a ``what`` directory."""
    meta_file = root / name
    if not meta_file.is_file() and not meta_file.is_symlink():
        raise FileNotFoundError(f"{str(root)!r} is not a {what}: no {name}")
    with open_nofollow(meta_file, "rb") as f:
        raw = f.read(_MAX_META_BYTES + 1)
    if len(raw) > _MAX_META_BYTES:
        raise ValueError(f"{meta_file}: metadata file larger than {_MAX_META_BYTES} bytes")
    try:
        meta = json.loads(raw.decode("utf-8"))
    except RecursionError as err:
        raise ValueError(f"{meta_file}: corrupt metadata file (nested too deeply)") from err
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{meta_file}: corrupt metadata file ({err})") from err
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        raise ValueError(f"{meta_file}: not an {fmt} directory")
    if meta.get("version") != version:
        raise ValueError(f"{meta_file}: format version {meta.get('version')!r}, expected {version}")
    return meta
