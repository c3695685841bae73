"""``rbdata.datasets._download``: resume, retry, verification and atomicity, offline.

Files are served by small ``http.server`` handlers on 127.0.0.1 that support ``Range``,
ignore it, drop the connection mid-body, corrupt the bytes or answer errors. The expected
digest is computed here with ``hashlib`` from the served bytes, independently of the code
under test, and every handler records the requests it received.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import filelock
import numpy as np
import pytest

from rbdata.datasets._cache import file_lock
from rbdata.datasets._download import (
    Downloaded,
    download,
    local_path,
    resolve_mirror,
    verify_file,
)
from rbdata.errors import ChecksumError, DownloadError

PAYLOAD = np.random.default_rng(1234).integers(0, 256, size=300_000, dtype=np.uint8).tobytes()
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()
#: where the dropping handler cuts the body (not a multiple of any chunk size used)
DROP_AT = 123_457
FAST = {"progress": False, "backoff": 0.0, "chunk_bytes": 16 * 1024}


class Server(ThreadingHTTPServer):
    """Serves ``payload`` at every path and records each request's headers."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], payload: bytes) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.payload = payload
        self.requests: list[dict[str, str]] = []
        self.drops = 0  # how many of the first requests DroppingHandler cuts short
        self._lock = threading.Lock()

    def record(self, headers: dict[str, str]) -> int:
        """Store one request's headers; return its 0-based number."""
        with self._lock:
            self.requests.append(headers)
            return len(self.requests) - 1

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/data/file.bin"

    def range_starts(self) -> list[int | None]:
        """The first byte asked for by each request (``None``: no Range header)."""
        starts: list[int | None] = []
        for headers in self.requests:
            match = re.fullmatch(r"bytes=(\d+)-", headers.get("Range", ""))
            starts.append(int(match.group(1)) if match else None)
        return starts


class RangeHandler(BaseHTTPRequestHandler):
    """A well-behaved server: 200 for the whole file, 206 for ``Range: bytes=N-``, 416 past it."""

    server: Server

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def body(self) -> bytes:
        return self.server.payload

    def do_GET(self) -> None:
        number = self.server.record(dict(self.headers.items()))
        self.respond(number)

    def respond(self, number: int) -> None:
        body = self.body()
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        start = int(match.group(1)) if match else 0
        if match and start >= len(body):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(body)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if match:
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        self.wfile.write(body[start:])


class NoRangeHandler(RangeHandler):
    """Ignores ``Range``: always 200 with the whole file."""

    def respond(self, number: int) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body())))
        self.end_headers()
        self.wfile.write(self.body())


class DroppingHandler(RangeHandler):
    """Cuts the first ``server.drops`` responses at file offset ``DROP_AT``, then behaves."""

    def respond(self, number: int) -> None:
        if number >= self.server.drops:
            super().respond(number)
            return
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        start = int(match.group(1)) if match else 0
        body = self.body()
        self.send_response(206 if match else 200)
        if match:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.send_header("Content-Length", str(len(body) - start))  # promises the whole rest
        self.end_headers()
        self.wfile.write(body[start:DROP_AT] if start < DROP_AT else body[start : start + 1000])
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True


class CorruptHandler(RangeHandler):
    """Serves the file with one byte flipped."""

    def body(self) -> bytes:
        data = bytearray(self.server.payload)
        data[len(data) // 2] ^= 0xFF
        return bytes(data)


class NotFoundHandler(RangeHandler):
    def respond(self, number: int) -> None:
        self.send_error(404, "Not Found")


class FlakyHandler(RangeHandler):
    """503 on the first request, then well-behaved."""

    def respond(self, number: int) -> None:
        if number == 0:
            self.send_error(503, "Service Unavailable")
        else:
            super().respond(number)


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    """Factory: start a server for a handler class (and payload) in a daemon thread."""
    started: list[tuple[Server, threading.Thread]] = []

    def start(handler: type[BaseHTTPRequestHandler], payload: bytes = PAYLOAD) -> Server:
        server = Server(handler, payload)
        thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
        thread.start()
        started.append((server, thread))
        return server

    yield start
    for server, thread in started:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def part_of(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def test_fresh_download_is_verified_and_atomic(serve: Callable[..., Server], tmp_path: Path):
    server = serve(RangeHandler)
    dest = tmp_path / "sub" / "dir" / "file.bin"
    got = download(server.url, dest, name="toy", sha256=DIGEST, size=len(PAYLOAD), **FAST)
    assert got == Downloaded(dest, DIGEST, len(PAYLOAD))
    assert dest.read_bytes() == PAYLOAD
    assert sorted(p.name for p in dest.parent.iterdir()) == ["file.bin"]
    assert server.range_starts() == [None]
    assert server.requests[0].get("Accept-Encoding") == "identity"


def test_digest_computed_without_expectation_and_case_insensitive(
    serve: Callable[..., Server], tmp_path: Path
):
    server = serve(RangeHandler)
    got = download(server.url, tmp_path / "a.bin", name="toy", **FAST)
    assert (got.sha256, got.size) == (DIGEST, len(PAYLOAD))
    got = download(server.url, tmp_path / "b.bin", name="toy", sha256=DIGEST.upper(), **FAST)
    assert got.sha256 == DIGEST


def test_existing_dest_is_returned_without_network(serve: Callable[..., Server], tmp_path: Path):
    server = serve(RangeHandler)
    dest = tmp_path / "file.bin"
    dest.write_bytes(PAYLOAD)
    got = download(server.url, dest, name="toy", sha256=DIGEST, size=len(PAYLOAD), **FAST)
    assert got == Downloaded(dest, DIGEST, len(PAYLOAD))
    assert server.requests == []
    # without any expectation too, and the digest is still computed
    assert download(server.url, dest, name="toy", **FAST).sha256 == DIGEST
    assert server.requests == []


def test_existing_corrupt_dest_is_kept_and_refused(serve: Callable[..., Server], tmp_path: Path):
    server = serve(RangeHandler)
    dest = tmp_path / "file.bin"
    mine = b"x" * len(PAYLOAD)  # e.g. a user's copy, or a file the catalog no longer matches
    dest.write_bytes(mine)
    with pytest.raises(ChecksumError) as info:
        download(server.url, dest, name="toy", sha256=DIGEST, **FAST)
    message = str(info.value)
    assert repr(str(dest)) in message
    assert f"expected sha256 {DIGEST}, got {hashlib.sha256(mine).hexdigest()}" in message
    assert "the file is kept" in message
    assert dest.read_bytes() == mine  # never deleted, never overwritten
    assert server.requests == []  # and no network


def test_existing_dest_of_the_wrong_size_is_kept(serve: Callable[..., Server], tmp_path: Path):
    server = serve(RangeHandler)
    dest = tmp_path / "file.bin"
    dest.write_bytes(PAYLOAD[:1000])
    with pytest.raises(ChecksumError) as info:
        download(server.url, dest, name="toy", size=len(PAYLOAD), hint="use a mirror", **FAST)
    message = str(info.value)
    assert f"expected {len(PAYLOAD)} bytes, got 1000 bytes" in message
    assert repr(str(dest)) in message and message.endswith("; use a mirror")
    assert dest.read_bytes() == PAYLOAD[:1000]
    assert server.requests == []


def test_resumes_a_good_part_with_range(serve: Callable[..., Server], tmp_path: Path):
    server = serve(RangeHandler)
    dest = tmp_path / "file.bin"
    part_of(dest).write_bytes(PAYLOAD[:50_000])
    got = download(server.url, dest, name="toy", sha256=DIGEST, size=len(PAYLOAD), **FAST)
    assert got.sha256 == DIGEST
    assert dest.read_bytes() == PAYLOAD
    assert not part_of(dest).exists()
    assert server.range_starts() == [50_000]


def test_dropped_connection_is_resumed(serve: Callable[..., Server], tmp_path: Path):
    server = serve(DroppingHandler)
    server.drops = 1
    dest = tmp_path / "file.bin"
    got = download(server.url, dest, name="toy", sha256=DIGEST, size=len(PAYLOAD), **FAST)
    assert got == Downloaded(dest, DIGEST, len(PAYLOAD))
    assert dest.read_bytes() == PAYLOAD
    assert server.range_starts() == [None, DROP_AT]


def test_dropped_twice_without_known_size(serve: Callable[..., Server], tmp_path: Path):
    server = serve(DroppingHandler)
    server.drops = 2  # the second cut happens 1000 bytes after the resume point
    dest = tmp_path / "file.bin"
    got = download(server.url, dest, name="toy", **FAST)
    assert got.sha256 == DIGEST
    assert dest.read_bytes() == PAYLOAD
    assert server.range_starts() == [None, DROP_AT, DROP_AT + 1000]


def test_always_dropping_gives_up_after_retries(serve: Callable[..., Server], tmp_path: Path):
    server = serve(DroppingHandler)
    server.drops = 10**6
    dest = tmp_path / "file.bin"
    with pytest.raises(DownloadError) as info:
        download(
            server.url, dest, name="toy", sha256=DIGEST, progress=False, retries=3, backoff=0.01
        )
    message = str(info.value)
    assert "'toy'" in message
    assert server.url in message
    assert "3 attempts" in message
    assert len(server.requests) == 3
    assert not dest.exists()
    # what arrived is kept for a later call to resume
    assert part_of(dest).read_bytes() == PAYLOAD[: DROP_AT + 2000]


class HeadersOnlyHandler(RangeHandler):
    """Promises the whole file, then closes the connection before the first body byte."""

    def respond(self, number: int) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body())))
        self.end_headers()
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True


def test_a_failure_without_bytes_leaves_no_part(serve: Callable[..., Server], tmp_path: Path):
    server = serve(HeadersOnlyHandler)
    dest = tmp_path / "file.bin"
    with pytest.raises(DownloadError, match="3 attempts failed"):
        download(server.url, dest, name="toy", progress=False, retries=3, backoff=0.0)
    assert len(server.requests) == 3
    assert list(tmp_path.iterdir()) == []  # no empty file.bin.part


def test_server_ignoring_range_restarts_a_stale_part(serve: Callable[..., Server], tmp_path: Path):
    server = serve(NoRangeHandler)
    dest = tmp_path / "file.bin"
    part_of(dest).write_bytes(b"garbage that is not the start of the file")
    got = download(server.url, dest, name="toy", sha256=DIGEST, size=len(PAYLOAD), **FAST)
    assert got.sha256 == DIGEST
    assert dest.read_bytes() == PAYLOAD
    assert not part_of(dest).exists()
    assert server.range_starts() == [len(b"garbage that is not the start of the file")]


def test_complete_part_answered_416_is_accepted(serve: Callable[..., Server], tmp_path: Path):
    server = serve(RangeHandler)
    dest = tmp_path / "file.bin"
    part_of(dest).write_bytes(PAYLOAD)
    got = download(server.url, dest, name="toy", sha256=DIGEST, size=len(PAYLOAD), **FAST)
    assert got == Downloaded(dest, DIGEST, len(PAYLOAD))
    assert server.range_starts() == [len(PAYLOAD)]
    assert dest.read_bytes() == PAYLOAD


def test_part_longer_than_unknown_size_is_restarted(serve: Callable[..., Server], tmp_path: Path):
    server = serve(RangeHandler)
    dest = tmp_path / "file.bin"
    part_of(dest).write_bytes(PAYLOAD + b"extra")
    got = download(server.url, dest, name="toy", **FAST)  # 416, then from zero
    assert got == Downloaded(dest, DIGEST, len(PAYLOAD))
    assert server.range_starts() == [len(PAYLOAD) + 5, None]


def test_symlinked_part_is_not_written_through(serve: Callable[..., Server], tmp_path: Path):
    server = serve(RangeHandler)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(PAYLOAD[:1000])
    dest = tmp_path / "data" / "file.bin"
    dest.parent.mkdir()
    part_of(dest).symlink_to(outside)
    got = download(server.url, dest, name="toy", sha256=DIGEST, **FAST)
    assert got.sha256 == DIGEST
    assert outside.read_bytes() == PAYLOAD[:1000]
    assert not dest.is_symlink()
    assert server.range_starts() == [None]


def test_oversized_part_is_restarted(serve: Callable[..., Server], tmp_path: Path):
    server = serve(RangeHandler)
    dest = tmp_path / "file.bin"
    part_of(dest).write_bytes(PAYLOAD + b"extra")
    got = download(server.url, dest, name="toy", sha256=DIGEST, size=len(PAYLOAD), **FAST)
    assert got.sha256 == DIGEST
    assert server.range_starts() == [None]


def test_server_error_is_retried(serve: Callable[..., Server], tmp_path: Path):
    server = serve(FlakyHandler)
    dest = tmp_path / "file.bin"
    got = download(server.url, dest, name="toy", sha256=DIGEST, **FAST)
    assert got.sha256 == DIGEST
    assert len(server.requests) == 2


def test_corrupt_bytes_raise_and_leave_nothing(serve: Callable[..., Server], tmp_path: Path):
    server = serve(CorruptHandler)
    dest = tmp_path / "file.bin"
    with pytest.raises(ChecksumError) as info:
        download(server.url, dest, name="toy", sha256=DIGEST, size=len(PAYLOAD), **FAST)
    message = str(info.value)
    bad = bytearray(PAYLOAD)
    bad[len(bad) // 2] ^= 0xFF
    assert "'toy'" in message
    assert DIGEST in message
    assert hashlib.sha256(bad).hexdigest() in message
    assert list(tmp_path.iterdir()) == []
    assert len(server.requests) == 1  # a checksum mismatch is not retried


def test_size_mismatch_names_both_counts(serve: Callable[..., Server], tmp_path: Path):
    server = serve(RangeHandler)
    dest = tmp_path / "file.bin"
    with pytest.raises(ChecksumError) as info:
        download(server.url, dest, name="toy", size=len(PAYLOAD) + 1, **FAST)
    assert f"expected {len(PAYLOAD) + 1} bytes" in str(info.value)
    assert f"got {len(PAYLOAD)} bytes" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_longer_than_expected_stops_early(serve: Callable[..., Server], tmp_path: Path):
    server = serve(RangeHandler)
    dest = tmp_path / "file.bin"
    with pytest.raises(ChecksumError, match="expected 1000 bytes, got more than 1000"):
        download(server.url, dest, name="toy", size=1000, **FAST)
    assert list(tmp_path.iterdir()) == []


def test_not_found_is_not_retried(serve: Callable[..., Server], tmp_path: Path):
    server = serve(NotFoundHandler)
    dest = tmp_path / "file.bin"
    with pytest.raises(DownloadError, match="not found at " + re.escape(server.url)) as info:
        download(server.url, dest, name="toy", retries=5, backoff=10.0, progress=False)
    assert "'toy'" in str(info.value)
    assert len(server.requests) == 1
    assert list(tmp_path.iterdir()) == []


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_connection_refused_is_retried_once(tmp_path: Path, connects: list[Any]):
    url = f"http://127.0.0.1:{closed_port()}/file.bin"
    start = time.monotonic()
    with pytest.raises(DownloadError) as info:  # default retries=5, backoff=0.5
        download(url, tmp_path / "f.bin", name="toy", progress=False, hint="use a mirror")
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert url in message and "2 attempts failed; could not connect" in message
    assert "refused" in message.lower()
    assert message.endswith("; use a mirror")
    port = int(url.split(":")[2].split("/")[0])
    assert [a for a in connects if a[1] == port] == [("127.0.0.1", port)] * 2
    assert elapsed < 5
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_name_resolution_failure_is_retried_once(tmp_path: Path, lookups: list[str]):
    url = "http://nonexistent.invalid/datasets/offline_rl/hopper.hdf5"
    start = time.monotonic()
    with pytest.raises(DownloadError) as info:
        download(url, tmp_path / "f.bin", name="toy", progress=False)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert url in message and "2 attempts failed; could not connect" in message
    assert "nonexistent.invalid" in message.split("could not connect")[1]
    assert lookups.count("nonexistent.invalid") == 2
    assert elapsed < 5
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_dropped_bodies_keep_every_retry(serve: Callable[..., Server], tmp_path: Path):
    """Only failures to connect are cut short; a dropped body keeps its retries and resumes."""
    server = serve(DroppingHandler)
    server.drops = 3
    dest = tmp_path / "file.bin"
    got = download(server.url, dest, name="toy", sha256=DIGEST, **FAST)
    assert got.sha256 == DIGEST
    assert len(server.requests) == 4


def test_progress_bar_on_stderr(
    serve: Callable[..., Server], tmp_path: Path, capfd: pytest.CaptureFixture[str]
):
    server = serve(RangeHandler)
    download(server.url, tmp_path / "f.bin", name="toy-progress", progress=True, backoff=0.0)
    out, err = capfd.readouterr()
    assert out == ""
    assert "toy-progress" in err


def test_progress_false_is_silent(
    serve: Callable[..., Server], tmp_path: Path, capfd: pytest.CaptureFixture[str]
):
    server = serve(RangeHandler)
    download(server.url, tmp_path / "f.bin", name="toy-quiet", **FAST)
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"sha256": "abc"}, "sha256 must be 64 hex digits, got 'abc'"),
        ({"size": -1}, "size must be a non-negative int or None, got -1"),
        ({"retries": 0}, "retries must be an int >= 1, got 0"),
        ({"backoff": -1.0}, "backoff must be >= 0 seconds, got -1.0"),
        ({"timeout": 0}, "timeout must be > 0 seconds, got 0"),
        ({"chunk_bytes": 0}, "chunk_bytes must be an int >= 1, got 0"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], pattern: str, tmp_path: Path):
    with pytest.raises(ValueError, match=re.escape(pattern)):
        download("http://127.0.0.1:9/x", tmp_path / "x", name="toy", **kwargs)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mirror", ["https://mirror.lan/rl", "https://mirror.lan/rl/"])
@pytest.mark.parametrize("prefix", ["https://data.org/d4rl/", "https://data.org/d4rl"])
def test_resolve_mirror(mirror: str, prefix: str):
    url = "https://data.org/d4rl/hopper/medium-v2.hdf5"
    assert resolve_mirror(url, prefix, mirror) == "https://mirror.lan/rl/hopper/medium-v2.hdf5"


def test_resolve_mirror_keeps_url():
    url = "https://data.org/d4rl/hopper.hdf5"
    assert resolve_mirror(url, "https://data.org/d4rl/", None) == url
    assert resolve_mirror(url, "https://data.org/d4rl/", "") == url
    assert resolve_mirror(url, "https://other.org/", "https://mirror.lan/") == url


def test_file_lock_leaves_no_file(tmp_path: Path):
    lock = file_lock(tmp_path / "sub" / "file.bin", timeout=0.1)
    assert lock.lock_file == str(tmp_path / "sub" / "file.bin.lock")
    with lock:
        assert lock.is_locked
        assert os.path.isfile(lock.lock_file)
    assert not lock.is_locked
    assert os.listdir(tmp_path / "sub") == []


def test_file_lock_excludes_and_times_out(tmp_path: Path):
    holder = file_lock(tmp_path / "file.bin")
    with holder:
        other = file_lock(tmp_path / "file.bin", timeout=0.2)
        start = time.monotonic()
        with pytest.raises(filelock.Timeout):
            other.acquire()
        assert time.monotonic() - start >= 0.2
        assert not other.is_locked and holder.is_locked
    with file_lock(tmp_path / "file.bin", timeout=0):  # free again at once
        pass


def test_file_lock_takes_a_stale_lock_file(tmp_path: Path):
    """A lock file left by a killed process is taken, and removed on release."""
    (tmp_path / "file.bin.lock").write_bytes(b"")
    with file_lock(tmp_path / "file.bin", timeout=0):
        pass
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_file_lock_forked_copy_leaves_the_parents_lock(tmp_path: Path):
    lock = file_lock(tmp_path / "file.bin")
    with lock:
        pid = os.fork()
        if pid == 0:  # the child drops its copy of the held lock
            try:
                lock.release()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert os.path.isfile(lock.lock_file)  # still the parent's
        with pytest.raises(filelock.Timeout):
            file_lock(tmp_path / "file.bin", timeout=0.1).acquire()
    assert os.listdir(tmp_path) == []


def test_file_lock_mutual_exclusion_while_files_vanish(tmp_path: Path):
    """Read-modify-write under the lock from many threads: no update lost.

    Each release removes the lock file while others wait on it; a waiter that wins the
    removed file must notice and queue again, or two threads would hold the lock at once.
    """
    counter = tmp_path / "counter"
    counter.write_text("0")
    inside: list[int] = []
    overlaps: list[int] = []

    def work() -> None:
        for _ in range(40):
            with file_lock(tmp_path / "counter"):
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(len(inside))
                value = int(counter.read_text())
                time.sleep(0.0005)
                counter.write_text(str(value + 1))
                inside.pop()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [], "two holders at once"
    assert counter.read_text() == "160"
    assert sorted(os.listdir(tmp_path)) == ["counter"]


# --- local files ------------------------------------------------------------------------------
def test_verify_file_never_deletes(tmp_path: Path):
    file = tmp_path / "mine.hdf5"
    file.write_bytes(PAYLOAD)
    assert verify_file(file, name="toy", sha256=DIGEST, size=len(PAYLOAD)) == Downloaded(
        file, DIGEST, len(PAYLOAD)
    )
    with pytest.raises(ChecksumError) as info:
        verify_file(file, name="toy", sha256="ab" * 32, hint="pass sha256=")
    assert f"expected sha256 {'ab' * 32}, got {DIGEST}; pass sha256=" in str(info.value)
    assert repr(str(file)) in str(info.value)
    with pytest.raises(ChecksumError, match=f"expected 5 bytes, got {len(PAYLOAD)} bytes"):
        verify_file(file, name="toy", size=5)
    assert file.read_bytes() == PAYLOAD
    with pytest.raises(FileNotFoundError, match="is not a file"):
        verify_file(tmp_path / "missing.hdf5", name="toy")


def test_local_path(tmp_path: Path):
    file = tmp_path / "a b" / "x.hdf5"
    assert local_path(file.as_uri()) == file
    assert local_path("https://example.org/x.hdf5") is None
    with pytest.raises(ValueError, match=r"url: expected a local file:// URL"):
        local_path("file://server/share/x.hdf5")
