"""Shared pytest set-up: local test servers are never reached through a proxy."""

from __future__ import annotations

import gc
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

# the shared helpers (``storage_contract``, ``_paths``, the data builders) live here; the test
# files, in subfolders that mirror the package, import them by name
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paths import TEST_PATHS

sys.path[:0] = [p for p in TEST_PATHS if p not in sys.path]
# ... and in every child process a test starts (they import test modules by name too)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [*TEST_PATHS, *filter(None, [os.environ.get("PYTHONPATH")])]
)

# Without a GPU, Triton kernels run in Triton's CPU interpreter (read when the kernels are
# defined, so before any test imports them): the fused tree kernels are tested that way.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _no_proxy_for_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    # requests honours http_proxy for 127.0.0.1 unless no_proxy names it; the tests' HTTP
    # servers (and subprocesses started with os.environ) must be reached directly.
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")


@pytest.fixture(autouse=True)
def _environment_restored() -> Any:
    """A test (or a docs page it runs) that sets an environment variable leaves no trace."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def collect_pipelines() -> Any:
    """Collect the pipelines a test left behind, here, in the main thread.

    torchdata's threaded iterators sit in reference cycles; collected later by a garbage
    collection that happens to run in one of their own worker threads, their ``__del__`` tries
    to join that thread ("cannot join current thread"), an unraisable error that pytest
    reports against whatever test runs then. Used by the modules that build pipelines.
    """
    yield
    gc.collect()


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every address a socket of this process tries to connect to, recorded."""
    seen: list[Any] = []
    real = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> None:
        seen.append(address)
        real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return seen


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every host name this process resolves, recorded."""
    seen: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return seen


@pytest.fixture(params=["numba", "torch"])
def tree_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run on the numba kernels and on the device path's torch kernels (set before construction).

    The device path (forced onto CPU trees) reports a refused call's error at a later call
    or at ``check_errors``, which does nothing on CPU trees (their calls raise).
    """
    from rbdata.samplers import prioritized as prioritized_module

    if request.param == "torch":
        # the device path on CPU trees, with the torch reference kernels
        monkeypatch.setattr(prioritized_module, "_DEVICE_PATH_ON_CPU", True)
        monkeypatch.setattr(prioritized_module, "_DEVICE_KERNELS", "torch")
    return str(request.param)
