"""The demo's data source: the sample file built by the catalog's recipe, served locally.

:func:`load_recipe` loads ``datasets/samples/d4rl_sample.py``, which writes the D4RL-layout
HDF5 file; :func:`serving` serves a folder on ``127.0.0.1`` (a free port) and records each
download; :func:`environ` and :func:`no_proxy_for_localhost` point ``rbdata.datasets`` at it
for the duration of the demo and restore the environment afterwards.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

from rbdata._core.resources import catalog_path

__all__ = ["Mirror", "environ", "load_recipe", "no_proxy_for_localhost", "serving"]


def load_recipe() -> ModuleType:
    """The catalog's ``samples/d4rl_sample.py`` recipe, as a module."""
    path = catalog_path("samples", "d4rl_sample.py")
    spec = importlib.util.spec_from_file_location("_rbdata_recipe_d4rl_sample", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the recipe {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Handler(SimpleHTTPRequestHandler):
    """Serves the mirror's folder quietly and records when each GET finished sending."""

    server: Mirror

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: the demo prints its own report."""

    def do_GET(self) -> None:
        """Serve the file, then record ``(path, seconds at the end)``."""
        super().do_GET()
        self.server.served.append((self.path, time.perf_counter()))


class Mirror(ThreadingHTTPServer):
    """An HTTP server of ``root`` on 127.0.0.1; ``served`` lists ``(path, end time)``."""

    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
        self.served: list[tuple[str, float]] = []

    @property
    def url(self) -> str:
        """The mirror's base URL (``RBDATA_D4RL_MIRROR``)."""
        return f"http://127.0.0.1:{self.server_address[1]}/"


@contextmanager
def serving(root: Path) -> Iterator[Mirror]:
    """A mirror of ``root`` on 127.0.0.1 (a free port) in a daemon thread, shut down on exit."""
    mirror = Mirror(root)
    thread = threading.Thread(target=mirror.serve_forever, name="rbdata-demo-mirror", daemon=True)
    thread.start()
    try:
        yield mirror
    finally:
        mirror.shutdown()
        mirror.server_close()
        thread.join()


@contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables; restore the previous values (or absence) on exit."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        os.environ.update(values)
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def no_proxy_for_localhost() -> dict[str, str]:
    """``no_proxy``/``NO_PROXY`` extended with 127.0.0.1, so a proxy setting cannot intercept."""
    out = {}
    for name in ("no_proxy", "NO_PROXY"):
        old = os.environ.get(name, "")
        out[name] = f"{old},127.0.0.1" if old else "127.0.0.1"
    return out
