"""Test helpers: D4RL-layout HDF5 files, a row-by-row reference reader, a local HTTP server."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np


def write_d4rl_file(
    path: Path,
    n: int = 500,
    *,
    seed: int = 0,
    next_observations: bool = True,
    timeouts: bool = True,
    infos: bool = True,
    obs_dim: int = 5,
    last_done: bool = False,
) -> dict[str, np.ndarray]:
    """Write a D4RL-layout file with random data; return its arrays (flat HDF5 names)."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {
        "observations": rng.standard_normal((n, obs_dim)).astype(np.float32),
        "actions": rng.uniform(-1, 1, (n, 3)).astype(np.float32),
        "rewards": rng.standard_normal(n).astype(np.float32),
        "terminals": rng.random(n) < 0.01,
    }
    if timeouts:
        to = np.zeros(n, bool)
        to[rng.choice(n, size=max(1, n // 97), replace=False)] = True
        to &= ~arrays["terminals"]
        arrays["timeouts"] = to
    if last_done:
        arrays["terminals"][-1] = True
    if next_observations:
        arrays["next_observations"] = rng.standard_normal((n, obs_dim)).astype(np.float32)
    if infos:
        arrays["infos/qpos"] = rng.standard_normal((n, 4))
        arrays["infos/goal/xy"] = rng.integers(0, 9, (n, 2)).astype(np.int32)
        arrays["infos/success"] = rng.random(n) < 0.5
    with h5py.File(path, "w") as f:
        for name, value in arrays.items():
            f.create_dataset(name, data=value)
        f["metadata/algorithm"] = np.bytes_("SAC — soft actor critic".encode())
        f["metadata/iteration"] = np.int64(1_000_000)
        f["metadata/policy/fc0/weight"] = rng.standard_normal((2, 3)).astype(np.float32)
        f["metadata/policy/nonlinearity"] = np.bytes_("relu")
        f["metadata/flag"] = np.bool_(True)
    return arrays


def reference_rows(arrays: dict[str, np.ndarray]) -> list[dict[tuple[str, ...], Any]]:
    """The expected transitions, one Python loop step per row (independent of the converter)."""
    n = len(arrays["observations"])
    rows = []
    episode = 0
    for t in range(n):
        term = bool(arrays["terminals"][t])
        trunc = bool(arrays["timeouts"][t]) if "timeouts" in arrays else False
        done = term or trunc
        row: dict[tuple[str, ...], Any] = {
            ("observation",): arrays["observations"][t],
            ("action",): arrays["actions"][t],
            ("next", "reward"): np.array([arrays["rewards"][t]]),
            ("next", "terminated"): np.array([term]),
            ("next", "truncated"): np.array([trunc]),
            ("next", "done"): np.array([done]),
            ("episode",): np.array(episode),
        }
        if "next_observations" in arrays:
            row[("next", "observation")] = arrays["next_observations"][t]
        else:
            valid = not done and t + 1 < n
            source = t + 1 if valid else t
            row[("next", "observation")] = arrays["observations"][source]
            row[("next", "valid")] = np.array([valid])
        for name, value in arrays.items():
            if name.startswith("infos/"):
                row[("info", *name.split("/")[1:])] = value[t]
        rows.append(row)
        if done:
            episode += 1
    return rows


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[tuple[str, list[str]]]:
    """Serve ``directory`` on 127.0.0.1; yield the base URL and the list of requested paths."""
    requests: list[str] = []

    class Handler(_QuietHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            super().do_GET()

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(directory))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
