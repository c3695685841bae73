"""Resumable, verified downloads of dataset files over HTTP(S), and checks of local files.

:func:`download` streams a URL into ``<dest>.part`` next to the destination, resumes an interrupted
transfer with an HTTP ``Range`` request, retries network failures with exponential back-off, hashes
the bytes while writing them, checks the size and SHA-256 and only then renames the part onto
``dest`` (an atomic rename, followed by an fsync of the directory). A downloaded part that fails
verification is deleted: nothing corrupt is ever left at ``dest``. A file that is already at
``dest`` is verified and returned without the network; one that fails verification is kept and
refused (:class:`ChecksumError`), never deleted. :func:`verify_file` checks a local file the same
way, and :func:`local_path` reads a ``file://`` URL. Locking against other processes is the
caller's business (``file_lock`` of the cache).

One HTTP attempt of a download is a (resumed) GET streamed into the part file, hashed:
:func:`attempt` is the unit :func:`download` retries: it raises :class:`Retry` for failures worth
another attempt, telling apart those where no connection could be made at all
(:attr:`Retry.connect`: the name did not resolve, the connection was refused or timed out), which
:func:`download` retries at most once.

:func:`prepare_entry` builds one cache entry from a source file: local or cached/downloaded,
verified, converted. The steps every file-based dataset family (D4RL, OGBench) takes to build an
entry: a local file (``file=``, a ``file://`` URL or mirror) is verified in place; otherwise the
cache's download is verified or fetched (the family's ``cached_file``); the file is converted into
the entry's storage, and the entry's metadata records where the bytes came from. A failure leaves
nothing behind: no entry, no lock file, no empty folder (a partial download with bytes in it stays,
for the next call to resume).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import requests
import urllib3
from tqdm import tqdm

from rbdata._core.atomic import fsync_dir
from rbdata.datasets._cache import STORAGE_DIR, build_entry, prune_empty_dirs
from rbdata.errors import ChecksumError, DownloadError

__all__ = [
    "Downloaded",
    "LOCAL_HINT",
    "Retry",
    "attempt",
    "cannot_connect",
    "download",
    "hash_file",
    "hash_stream",
    "local_path",
    "prepare_entry",
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
    is created if needed. The caller holds any inter-process lock (``file_lock`` of the cache).

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


#: bytes read at a time when hashing a file already on disk
_HASH_CHUNK = 1 << 20
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)")
#: client errors worth another try: request timeout and rate limiting
_RETRY_4XX = frozenset({408, 429})


class Retry(Exception):
    """An attempt failed in a way that another attempt may fix.

    Attributes:
        connect: no connection could be made (name resolution, refused, connect timeout).
    """

    def __init__(self, message: str, connect: bool = False) -> None:
        super().__init__(message)
        self.connect = connect


def cannot_connect(err: BaseException) -> BaseException | None:
    """The error in ``err``'s chain saying no connection was made, else ``None``.

    That is a failed name resolution, a refused connection, an unreachable network or a
    connect timeout (urllib3's ``NewConnectionError``/``ConnectTimeoutError``, which requests
    wraps in ``MaxRetryError``), as opposed to a connection dropped mid-body.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(
            e,
            (
                urllib3.exceptions.NewConnectionError,
                urllib3.exceptions.ConnectTimeoutError,
                requests.exceptions.ConnectTimeout,
                ConnectionRefusedError,
            ),
        ):
            return e
        reason = getattr(e, "reason", None)
        todo += [reason if isinstance(reason, BaseException) else None, e.__cause__, e.__context__]
        todo += [a for a in e.args if isinstance(a, BaseException)]
    return None


def attempt(
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

    Raises :class:`Retry` (with the cause chained) for failures worth another attempt.
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
                hash_file(part, hasher)
                return bar, hasher.hexdigest()
            if status == 416 and offset:  # the part does not fit the file: start over
                part.unlink()
                raise Retry(f"server rejected the range of a {offset}-byte part (HTTP 416)")
            _check_status(response, url, name)
            encoded = _is_encoded(response)
            if status == 206:
                start, total = _parse_content_range(response.headers.get("Content-Range"))
                if start != offset or encoded:  # unusable: start over
                    part.unlink()
                    raise Retry(
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
                    hash_stream(file, hasher, offset)
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
                raise Retry(f"connection closed after {received} of {length} body bytes")
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
        reason = cannot_connect(err)
        raise Retry(str(reason or err), connect=reason is not None) from err
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
        raise Retry(what)
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
        raise Retry(f"partial content with a malformed Content-Range {value!r}")
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


def hash_stream(file: BinaryIO, hasher: Any, limit: int | None = None) -> None:
    """Feed ``hasher`` the rest of ``file``, or its next ``limit`` bytes at most."""
    left = limit
    while left is None or left > 0:
        block = file.read(_HASH_CHUNK if left is None else min(left, _HASH_CHUNK))
        if not block:
            return
        hasher.update(block)
        if left is not None:
            left -= len(block)


def hash_file(path: Path, hasher: Any) -> None:
    with open(path, "rb") as file:
        hash_stream(file, hasher)


#: what a refused local file's message advises
LOCAL_HINT = "the file is left as it is; pass sha256= (--sha256) with its digest to use it anyway"


def prepare_entry(
    target: Path,
    base: Path,
    cached: Path,
    *,
    name: str,
    local: tuple[Path, str] | None,
    cached_file: Callable[[], tuple[Downloaded, dict[str, Any]]],
    convert: Callable[[Path, Path], dict[str, Any]],
    fields: tuple[dict[str, Any], dict[str, Any]],
    sha256: str | None,
    size: int | None,
) -> None:
    """Build the entry ``target`` (below the cache ``base``) from the family's source file.

    Args:
        target: the entry's folder.
        base: the cache root (empty folders are pruned up to it on failure).
        cached: where the family keeps its download of the file.
        name: the dataset id, for messages.
        local: ``(path, url)`` of a local file to use instead of the cache, or ``None``.
        cached_file: verifies (or fetches) ``cached``; returns it and where it came from
            (``{"url": ...}``, possibly empty).
        convert: ``convert(source_file, storage_dir)`` writes the storage; returns metadata.
        fields: metadata entries before the conversion's and after the source's.
        sha256: the expected digest (``None``: unknown, recorded as computed).
        size: the expected size in bytes (``None``: unknown).
    """

    def build(tmp: Path) -> dict[str, Any]:
        if local is not None:
            path, href = local
            got = verify_file(path, name=name, sha256=sha256, size=size, hint=LOCAL_HINT)
            where: dict[str, Any] = {"url": href, "path": str(path)}
        else:
            got, where = cached_file()
            where = {**where, "file": got.path.relative_to(base).as_posix()}
        info = convert(got.path, tmp / STORAGE_DIR)
        head, tail = fields
        source = {
            **where,
            "size": got.size,
            "sha256": got.sha256,
            "sha256_verified": sha256 is not None,
        }
        return {**head, **info, "source": source, **tail}

    try:
        build_entry(target, build)
    except BaseException:
        prune_empty_dirs(target.parent, base)
        prune_empty_dirs(cached.parent, base)
        raise
