"""Resumable, verified downloads of dataset files over HTTP(S), and checks of local files.

:func:`download` streams a URL into ``<dest>.part`` next to the destination, resumes an
interrupted transfer with an HTTP ``Range`` request, retries network failures with
exponential back-off, hashes the bytes while writing them, checks the size and SHA-256 and
only then renames the part onto ``dest`` (an atomic rename, followed by an fsync of the
directory). A downloaded part that fails verification is deleted: nothing corrupt is ever left
at ``dest``. A file that is already at ``dest`` is verified and returned without the network;
one that fails verification is kept and refused (:class:`ChecksumError`), never deleted.
:func:`verify_file` checks a local file the same way, and :func:`local_path` reads a
``file://`` URL. Locking against other processes is the caller's business (:func:`file_lock`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from rbdata._core.atomic import fsync_dir
from rbdata.datasets._errors import ChecksumError, DownloadError
from rbdata.datasets._lock import file_lock
from rbdata.datasets._transfer import Retry, attempt, hash_file

__all__ = [
    "ChecksumError",
    "DownloadError",
    "Downloaded",
    "download",
    "file_lock",
    "local_path",
    "resolve_mirror",
    "verify_file",
]

#: longest sleep between two attempts, in seconds
_MAX_BACKOFF = 8.0
#: attempts in all when no connection can be made (name resolution, refused): one retry
_CONNECT_ATTEMPTS = 2
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


@dataclass(frozen=True)
class Downloaded:
    """A verified file on disk.

    Attributes:
        path: the final file.
        sha256: hex digest of its bytes (always computed, even when none was expected).
        size: its length in bytes.
    """

    path: Path
    sha256: str
    size: int


def resolve_mirror(url: str, prefix: str, mirror: str | None) -> str:
    """Rewrite ``url`` to fetch it from ``mirror`` instead of from under ``prefix``.

    Args:
        url: the original location.
        prefix: the part of ``url`` that the mirror replaces.
        mirror: the mirror's base URL, with or without a trailing slash; ``None`` or ``""``
            keeps ``url``.

    Returns:
        ``url`` with ``prefix`` replaced by ``mirror``, or ``url`` unchanged when there is no
        mirror or ``url`` does not start with ``prefix``.

    Examples:
        >>> prefix = "https://data.example.org/d4rl/"
        >>> resolve_mirror(prefix + "hopper.hdf5", prefix, "https://mirror.lan/rl")
        'https://mirror.lan/rl/hopper.hdf5'
        >>> resolve_mirror(prefix + "hopper.hdf5", prefix, "https://mirror.lan/rl/")
        'https://mirror.lan/rl/hopper.hdf5'
        >>> resolve_mirror("https://elsewhere.org/x.hdf5", prefix, "https://mirror.lan/rl")
        'https://elsewhere.org/x.hdf5'
        >>> resolve_mirror(prefix + "hopper.hdf5", prefix, None)
        'https://data.example.org/d4rl/hopper.hdf5'
    """
    if not mirror or not url.startswith(prefix):
        return url
    return mirror.rstrip("/") + "/" + url[len(prefix) :].lstrip("/")


def local_path(url: str) -> Path | None:
    """The local file a ``file:`` URL names, or ``None`` for any other URL.

    Raises:
        ValueError: a ``file:`` URL with a host other than ``localhost`` (not a local file).

    Examples:
        >>> local_path("file:///data/d4rl/hopper_medium-v2.hdf5").as_posix()
        '/data/d4rl/hopper_medium-v2.hdf5'
        >>> local_path("file://localhost/data/a%20b.hdf5").as_posix()
        '/data/a b.hdf5'
        >>> local_path("http://mirror.lan/hopper.hdf5") is None
        True
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme.lower() != "file":
        return None
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(
            f"url: expected a local file:// URL (file:///path), got {url!r} "
            f"(host {parsed.netloc!r})"
        )
    return Path(urllib.request.url2pathname(parsed.path))


def verify_file(
    path: Path,
    *,
    name: str,
    sha256: str | None = None,
    size: int | None = None,
    hint: str | None = None,
) -> Downloaded:
    """Check an existing file's size, then its SHA-256; never modify or delete it.

    Args:
        path: the file.
        name: the dataset's name, for messages.
        sha256: the expected hex digest (any case), or ``None`` not to check it.
        size: the expected length in bytes, or ``None`` not to check it.
        hint: appended to the message of a :class:`ChecksumError` (what to do about it).

    Returns:
        The file, with its computed SHA-256 (always) and size.

    Raises:
        ChecksumError: the size or digest differs; the message names the file, the expected
            and the actual value.
        FileNotFoundError: ``path`` is not a file.
        ValueError: ``sha256`` or ``size`` is malformed.
    """
    _check_expected(sha256, size)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"file: {str(path)!r} of dataset {name!r} is not a file")
    actual_size = path.stat().st_size
    where = f"dataset {name!r} file {str(path)!r}"
    tail = f"; {hint}" if hint else ""
    if size is not None and actual_size != size:
        raise ChecksumError(f"{where}: expected {size} bytes, got {actual_size} bytes{tail}")
    hasher = hashlib.sha256()
    hash_file(path, hasher)
    digest = hasher.hexdigest()
    if sha256 is not None and digest != sha256.lower():
        raise ChecksumError(f"{where}: expected sha256 {sha256.lower()}, got {digest}{tail}")
    return Downloaded(path, digest, actual_size)


def download(
    url: str,
    dest: Path,
    *,
    name: str,
    sha256: str | None = None,
    size: int | None = None,
    progress: bool = True,
    retries: int = 5,
    backoff: float = 0.5,
    timeout: float = 30.0,
    chunk_bytes: int = 1 << 20,
    hint: str | None = None,
) -> Downloaded:
    """Fetch ``url`` into ``dest``, resuming and retrying, and verify it.

    An existing ``dest`` is verified and returned without touching the network; one that fails
    verification raises :class:`ChecksumError` and is kept (never deleted: it may be a user's
    file). Otherwise the body is streamed into ``<dest>.part``; a part left by an interrupted
    attempt (or an earlier call) is resumed with a ``Range`` request, or restarted from zero if
    the server ignores the range. Server errors (5xx, 408, 429), dropped connections, timeouts
    and short bodies are retried after ``backoff * 2**attempt`` seconds (at most 8 s); when no
    connection can be made at all (the name does not resolve, the connection is refused or
    times out) it is retried once at most; other client errors (404...) fail at once. Once
    complete, the part is fsync'ed, checked against ``size`` and ``sha256`` (deleted if either
    differs) and atomically renamed onto ``dest``. A failure leaves no empty part; a part with
    bytes is kept for a later call to resume. Nothing is written outside ``dest.parent``, which
    is created if needed. The caller holds any inter-process lock (:func:`file_lock`).

    Args:
        url: the HTTP(S) URL to fetch.
        dest: the final path of the file.
        name: the dataset's name, for messages and the progress bar.
        sha256: the expected hex digest (any case), or ``None`` not to check it.
        size: the expected length in bytes, or ``None`` not to check it.
        progress: show a ``tqdm`` progress bar on stderr.
        retries: attempts in all (at least 1) before giving up.
        backoff: seconds to sleep after the first failed attempt, doubling after each.
        timeout: seconds to wait for the connection and for each read of the body.
        chunk_bytes: bytes read from the network at a time.
        hint: appended to the message of a :class:`DownloadError` or of a
            :class:`ChecksumError` of an existing ``dest`` (the ways out: a mirror, a local
            file...).

    Returns:
        The verified file, with its computed SHA-256 and size.

    Raises:
        DownloadError: the server refused the request (4xx) or every attempt failed; the
            message names the dataset, the URL, the attempts and the last error, then ``hint``.
        ChecksumError: the complete file has the wrong size or digest (a downloaded part is
            deleted, an existing ``dest`` kept).
        ValueError: an argument is out of range.
    """
    _check_args(sha256, size, retries, backoff, timeout, chunk_bytes)
    dest = Path(dest)
    if dest.is_dir():
        raise IsADirectoryError(f"dest {str(dest)!r} of dataset {name!r} is a directory")
    if dest.exists():
        kept = "the file is kept: remove it to download it again" + (f"; {hint}" if hint else "")
        return verify_file(dest, name=name, sha256=sha256, size=size, hint=kept)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    if part.is_symlink():  # never write through a link to outside dest.parent
        part.unlink()
    elif part.is_dir():
        raise IsADirectoryError(f"partial file {str(part)!r} of dataset {name!r} is a directory")
    tail = f"; {hint}" if hint else ""
    try:
        digest = _attempts(
            url, part, name, size, retries, backoff, timeout, chunk_bytes, tail, progress
        )
    except BaseException:
        if part.is_file() and not part.is_symlink() and part.stat().st_size == 0:
            part.unlink()  # nothing to resume: leave nothing behind
        raise

    _fsync_file(part)
    actual_size = part.stat().st_size
    if size is not None and actual_size != size:
        part.unlink()
        raise ChecksumError(
            f"dataset {name!r} from {url}: expected {size} bytes, got {actual_size} bytes"
        )
    if sha256 is not None and digest != sha256.lower():
        part.unlink()
        raise ChecksumError(
            f"dataset {name!r} from {url}: expected sha256 {sha256.lower()}, got {digest}"
        )
    os.replace(part, dest)
    _fsync_dir(dest.parent)
    return Downloaded(dest, digest, actual_size)


def _attempts(
    url: str,
    part: Path,
    name: str,
    size: int | None,
    retries: int,
    backoff: float,
    timeout: float,
    chunk_bytes: int,
    tail: str,
    progress: bool,
) -> str:
    """Run attempts until one completes the part; return its digest, else raise."""
    bar: Any = None
    last_error: BaseException | None = None
    failed = connect_failures = 0
    try:
        with requests.Session() as session:
            while failed < retries and connect_failures < _CONNECT_ATTEMPTS:
                if failed:
                    time.sleep(min(backoff * 2 ** (failed - 1), _MAX_BACKOFF))
                try:
                    bar, digest = attempt(
                        session, url, part, name, size, timeout, chunk_bytes, bar, progress
                    )
                    return digest
                except Retry as err:
                    failed += 1
                    connect_failures = connect_failures + 1 if err.connect else 0
                    last_error = err
                except DownloadError as err:  # refused (4xx), a malformed URL...
                    raise DownloadError(f"{err}{tail}") from err
    finally:
        if bar is not None:
            bar.close()
    what = "could not connect" if connect_failures else "last error"
    raise DownloadError(
        f"could not download dataset {name!r} from {url}: {failed} attempt"
        f"{'s' if failed != 1 else ''} failed; {what}: {last_error}{tail}"
    ) from (last_error.__cause__ if last_error is not None else None)


def _check_expected(sha256: str | None, size: int | None) -> None:
    if sha256 is not None and not _SHA256.fullmatch(sha256):
        raise ValueError(f"sha256 must be 64 hex digits, got {sha256!r}")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise ValueError(f"size must be a non-negative int or None, got {size!r}")


def _check_args(
    sha256: str | None,
    size: int | None,
    retries: int,
    backoff: float,
    timeout: float,
    chunk_bytes: int,
) -> None:
    _check_expected(sha256, size)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
        raise ValueError(f"retries must be an int >= 1, got {retries!r}")
    if not backoff >= 0:
        raise ValueError(f"backoff must be >= 0 seconds, got {backoff!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be an int >= 1, got {chunk_bytes!r}")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot fsync a directory
        fsync_dir(path)
