"""One HTTP attempt of a download: a (resumed) GET streamed into the part file, hashed.

:func:`attempt` is the unit :func:`rbdata.datasets._download.download` retries: it raises
:class:`Retry` for failures worth another attempt, telling apart those where no connection
could be made at all (:attr:`Retry.connect`: the name did not resolve, the connection was
refused or timed out), which :func:`~rbdata.datasets._download.download` retries at most once.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, BinaryIO

import requests
import urllib3
from tqdm import tqdm

from rbdata.datasets._errors import ChecksumError, DownloadError

__all__ = ["Retry", "attempt", "cannot_connect", "hash_file", "hash_stream"]

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
