"""Resumable, verified downloads of dataset files over HTTP(S).

:func:`download` streams a URL into ``<dest>.part`` next to the destination, resumes an
interrupted transfer with an HTTP ``Range`` request, retries network failures with
exponential back-off, hashes the bytes while writing them, checks the size and SHA-256 and
only then renames the part onto ``dest`` (an atomic rename, followed by an fsync of the
directory). A file that fails verification is deleted: nothing corrupt is ever left at
``dest``. Locking against other processes is the caller's business (:func:`file_lock`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import filelock
import requests
import urllib3
from tqdm import tqdm

from rbdata.checkpoint._atomic import fsync_dir

__all__ = [
    "ChecksumError",
    "DownloadError",
    "Downloaded",
    "download",
    "file_lock",
    "resolve_mirror",
]

#: longest sleep between two attempts, in seconds
_MAX_BACKOFF = 8.0
#: bytes read at a time when hashing a file already on disk
_HASH_CHUNK = 1 << 20
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)")
#: client errors worth another try: request timeout and rate limiting
_RETRY_4XX = frozenset({408, 429})


class DownloadError(OSError):
    """Raised when a dataset file cannot be fetched (missing, refused, or network failures)."""


class ChecksumError(ValueError):
    """Raised when a downloaded or cached file has the wrong size or SHA-256 digest."""


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


class _Retry(Exception):
    """An attempt failed in a way that another attempt may fix."""


def file_lock(path: Path, timeout: float = -1) -> filelock.FileLock:
    """Return an inter-process lock guarding ``path``, held on the sibling ``<path>.lock``.

    Args:
        path: the file to guard (it need not exist).
        timeout: seconds to wait when acquiring; a negative value waits forever.

    Returns:
        A :class:`filelock.FileLock`, not yet acquired; use it as a context manager.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     with file_lock(Path(tmp) / "hopper.hdf5") as lock:
        ...         print(Path(lock.lock_file).name, lock.is_locked)
        hopper.hdf5.lock True
    """
    return filelock.FileLock(str(path) + ".lock", timeout=timeout)


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
) -> Downloaded:
    """Fetch ``url`` into ``dest``, resuming and retrying, and verify it.

    An existing ``dest`` that passes verification is returned without touching the network
    (one that fails it is deleted and fetched again). Otherwise the body is streamed into
    ``<dest>.part``; a part left by an interrupted attempt (or an earlier call) is resumed
    with a ``Range`` request, or restarted from zero if the server ignores the range. Server
    errors (5xx, 408, 429), dropped connections, timeouts and short bodies are retried after
    ``backoff * 2**attempt`` seconds (at most 8 s); other client errors (404...) fail at once.
    Once complete, the part is fsync'ed, checked against ``size`` and ``sha256`` (deleted if
    either differs) and atomically renamed onto ``dest``. Nothing is written outside
    ``dest.parent``, which is created if needed. The caller holds any inter-process lock
    (:func:`file_lock`).

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

    Returns:
        The verified file, with its computed SHA-256 and size.

    Raises:
        DownloadError: the server refused the request (4xx) or every attempt failed; the
            message names the dataset, the URL, the attempts and the last error.
        ChecksumError: the complete file has the wrong size or digest (it is deleted).
        ValueError: an argument is out of range.
    """
    _check_args(sha256, size, retries, backoff, timeout, chunk_bytes)
    dest = Path(dest)
    if dest.is_dir():
        raise IsADirectoryError(f"dest {str(dest)!r} of dataset {name!r} is a directory")
    if dest.exists():
        try:
            return _verify_file(dest, name, sha256, size)
        except ChecksumError:
            dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    if part.is_symlink():  # never write through a link to outside dest.parent
        part.unlink()
    elif part.is_dir():
        raise IsADirectoryError(f"partial file {str(part)!r} of dataset {name!r} is a directory")

    bar: Any = None
    last_error: BaseException | None = None
    try:
        with requests.Session() as session:
            for attempt in range(retries):
                if attempt:
                    time.sleep(min(backoff * 2 ** (attempt - 1), _MAX_BACKOFF))
                try:
                    bar, digest = _attempt(
                        session, url, part, name, size, timeout, chunk_bytes, bar, progress
                    )
                    break
                except _Retry as err:
                    last_error = err.__cause__ or err
            else:
                raise DownloadError(
                    f"could not download dataset {name!r} from {url}: {retries} attempt"
                    f"{'s' if retries != 1 else ''} failed; last error: {last_error}"
                ) from last_error
    finally:
        if bar is not None:
            bar.close()

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


def _check_args(
    sha256: str | None,
    size: int | None,
    retries: int,
    backoff: float,
    timeout: float,
    chunk_bytes: int,
) -> None:
    if sha256 is not None and not _SHA256.fullmatch(sha256):
        raise ValueError(f"sha256 must be 64 hex digits, got {sha256!r}")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise ValueError(f"size must be a non-negative int or None, got {size!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
        raise ValueError(f"retries must be an int >= 1, got {retries!r}")
    if not backoff >= 0:
        raise ValueError(f"backoff must be >= 0 seconds, got {backoff!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be an int >= 1, got {chunk_bytes!r}")


def _verify_file(path: Path, name: str, sha256: str | None, size: int | None) -> Downloaded:
    """Check an existing file's size then digest; raise :class:`ChecksumError` on mismatch."""
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        raise ChecksumError(
            f"dataset {name!r} file {str(path)!r}: expected {size} bytes, got {actual_size} bytes"
        )
    hasher = hashlib.sha256()
    _hash_file(path, hasher)
    digest = hasher.hexdigest()
    if sha256 is not None and digest != sha256.lower():
        raise ChecksumError(
            f"dataset {name!r} file {str(path)!r}: expected sha256 {sha256.lower()}, got {digest}"
        )
    return Downloaded(path, digest, actual_size)


def _attempt(
    session: requests.Session,
    url: str,
    part: Path,
    name: str,
    size: int | None,
    timeout: float,
    chunk_bytes: int,
    bar: Any,
    progress: bool,
) -> tuple[Any, str]:
    """One GET, resuming ``part``; return the progress bar and the hex digest of the part.

    Raises :class:`_Retry` (with the cause chained) for failures worth another attempt.
    """
    offset = part.stat().st_size if part.exists() else 0
    if size is not None and offset > size:  # cannot be a prefix of the file: start over
        part.unlink()
        offset = 0
    try:
        with _get(session, url, offset, timeout) as response:
            status = response.status_code
            if status == 416 and offset and _range_is_complete(response, offset, size):
                hasher = hashlib.sha256()
                _hash_file(part, hasher)
                return bar, hasher.hexdigest()
            if status == 416 and offset:  # the part does not fit the file: start over
                part.unlink()
                raise _Retry(f"server rejected the range of a {offset}-byte part (HTTP 416)")
            _check_status(response, url, name)
            encoded = _is_encoded(response)
            if status == 206:
                start, total = _parse_content_range(response.headers.get("Content-Range"))
                if start != offset or encoded:  # unusable: start over
                    part.unlink()
                    raise _Retry(
                        f"server resumed at byte {start} of a compressed body"
                        if encoded
                        else f"server resumed at byte {start}, not {offset} as asked"
                    )
            else:  # 200: the whole file, whether or not a range was asked for
                offset, total = 0, None
            length = _content_length(response)
            if total is None and length is not None:
                total = offset + length
            bar = _progress_bar(bar, name, size if size is not None else total, offset, progress)

            hasher = hashlib.sha256()
            received = 0
            with open(part, "r+b" if offset else "wb") as file:
                if offset:  # append to the part, hashing what it already holds
                    _hash_stream(file, hasher, offset)
                    file.seek(offset)
                    file.truncate()
                # urllib3 itself, not iter_content: with decoding on, it drops the bytes it
                # has buffered when the connection breaks, and resuming would lose them
                for chunk in response.raw.stream(chunk_bytes, decode_content=encoded):
                    file.write(chunk)
                    hasher.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
                    if size is not None and offset + received > size:
                        break
            if size is not None and offset + received > size:
                part.unlink()
                raise ChecksumError(
                    f"dataset {name!r} from {url}: expected {size} bytes, got more than "
                    f"{size} bytes (at least {offset + received})"
                )
            if length is not None and received < length and not encoded:
                raise _Retry(f"connection closed after {received} of {length} body bytes")
            return bar, hasher.hexdigest()
    except (
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        requests.exceptions.ChunkedEncodingError,
        requests.exceptions.ContentDecodingError,
        urllib3.exceptions.HTTPError,
        ConnectionError,
        TimeoutError,
    ) as err:
        raise _Retry(str(err)) from err
    except requests.exceptions.RequestException as err:  # invalid URL, too many redirects...
        raise DownloadError(f"could not download dataset {name!r} from {url}: {err}") from err


def _get(session: requests.Session, url: str, offset: int, timeout: float) -> requests.Response:
    headers = {"Accept-Encoding": "identity"}  # byte offsets must be offsets in the file
    if offset:
        headers["Range"] = f"bytes={offset}-"
    return session.get(url, headers=headers, stream=True, timeout=timeout)


def _check_status(response: requests.Response, url: str, name: str) -> None:
    status = response.status_code
    if status in (200, 206):
        return
    what = f"HTTP {status} {response.reason or ''}".rstrip()
    if status >= 500 or status in _RETRY_4XX:
        raise _Retry(what)
    if status == 404:
        raise DownloadError(f"dataset {name!r}: file not found at {url} ({what})")
    raise DownloadError(f"could not download dataset {name!r} from {url}: {what}")


def _is_encoded(response: requests.Response) -> bool:
    """Whether the body is compressed (despite ``Accept-Encoding: identity``)."""
    return response.headers.get("Content-Encoding", "identity").strip().lower() not in (
        "",
        "identity",
    )


def _range_is_complete(response: requests.Response, offset: int, size: int | None) -> bool:
    """Whether a 416 answer to ``Range: bytes=<offset>-`` means the part is already whole."""
    if size is not None:
        return offset == size
    match = _UNSATISFIED_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
    return match is not None and int(match.group(1)) == offset


def _parse_content_range(value: str | None) -> tuple[int, int | None]:
    """Return the first byte and the total length (``None`` if ``*``) of a Content-Range."""
    match = _CONTENT_RANGE.fullmatch((value or "").strip())
    if match is None:
        raise _Retry(f"partial content with a malformed Content-Range {value!r}")
    total = match.group(3)
    return int(match.group(1)), None if total == "*" else int(total)


def _content_length(response: requests.Response) -> int | None:
    value = response.headers.get("Content-Length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _progress_bar(bar: Any, name: str, total: int | None, initial: int, progress: bool) -> Any:
    """Create the bar on the first attempt; rewind it to ``initial`` on later ones."""
    if bar is None:
        return tqdm(
            total=total,
            initial=initial,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=name,
            disable=not progress,
        )
    bar.reset(total=total)
    bar.update(initial)
    return bar


def _hash_stream(file: BinaryIO, hasher: Any, limit: int | None = None) -> None:
    """Feed ``hasher`` the rest of ``file``, or its next ``limit`` bytes at most."""
    left = limit
    while left is None or left > 0:
        block = file.read(_HASH_CHUNK if left is None else min(left, _HASH_CHUNK))
        if not block:
            return
        hasher.update(block)
        if left is not None:
            left -= len(block)


def _hash_file(path: Path, hasher: Any) -> None:
    with open(path, "rb") as file:
        _hash_stream(file, hasher)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot fsync a directory
        fsync_dir(path)
