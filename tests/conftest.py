"""Shared pytest set-up: local test servers are never reached through a proxy."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_proxy_for_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    # requests honours http_proxy for 127.0.0.1 unless no_proxy names it; the tests' HTTP
    # servers (and subprocesses started with os.environ) must be reached directly.
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")
