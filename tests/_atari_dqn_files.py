"""Test helpers: files in the format of Dopamine's replay-buffer checkpoints, and a reference.

:class:`ToyDopamineBuffer` writes what ``OutOfGraphReplayBuffer.add`` and ``save`` write
(written here from Dopamine's documented behaviour, not copied): a circular buffer of single
frames, ``stack - 1`` zero padding records before each episode's first record, ``add_count``
and ``invalid_range`` after every record, and one gzipped ``np.save`` file per array named
``<name>_ckpt.<N>.gz``. Unwritten rows hold random bytes (Dopamine allocates with
``np.empty``), so reading one shows. :func:`reference` is the per-index loop of Dopamine's
rules (``is_valid_transition``, ``get_observation_stack``, ``sample_transition_batch`` with
``update_horizon`` 1), reading the files back with ``np.load``. :func:`serve_ranges` serves a
folder on 127.0.0.1 with HTTP ``Range`` support (and can drop a file's first response).
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

NAMES = {
    "observation": "$store$_observation",
    "action": "$store$_action",
    "reward": "$store$_reward",
    "terminal": "$store$_terminal",
}


class ToyDopamineBuffer:
    """A small circular replay buffer that writes checkpoints in Dopamine's format."""

    def __init__(self, capacity: int, frame: tuple[int, ...] = (6, 5), stack: int = 4, seed=0):
        self.rng = np.random.default_rng(seed)
        self.capacity, self.stack = capacity, stack
        self.store = {  # np.empty in Dopamine: garbage until written
            "observation": self.rng.integers(0, 256, (capacity, *frame), dtype=np.uint8),
            "action": self.rng.integers(0, 99, capacity).astype(np.int32),
            "reward": self.rng.standard_normal(capacity).astype(np.float32),
            "terminal": self.rng.integers(0, 2, capacity).astype(np.uint8),
        }
        self.add_count = 0
        self.invalid_range: np.ndarray = np.zeros(stack)  # Dopamine's initial value
        self.frame = frame

    @property
    def cursor(self) -> int:
        return self.add_count % self.capacity

    def _write(self, obs: np.ndarray, action: int, reward: float, terminal: int) -> None:
        c = self.cursor
        self.store["observation"][c] = obs
        self.store["action"][c] = action
        self.store["reward"][c] = reward
        self.store["terminal"][c] = terminal
        self.add_count += 1
        # update_horizon 1: cursor - 1 .. cursor + stack - 1
        self.invalid_range = np.array(
            [(self.cursor - 1 + i) % self.capacity for i in range(self.stack + 1)]
        )

    def add(self, obs: np.ndarray, action: int, reward: float, terminal: int) -> None:
        if self.add_count == 0 or self.store["terminal"][self.cursor - 1] == 1:
            for _ in range(self.stack - 1):
                self._write(np.zeros(self.frame, np.uint8), 0, 0.0, 0)
        self._write(obs, action, reward, terminal)

    def step(self, terminal: bool) -> None:
        """Add one random record."""
        obs = self.rng.integers(0, 256, self.frame, dtype=np.uint8)
        reward = float(self.rng.choice([-1.0, 0.0, 1.0, 0.25]))
        self.add(obs, int(self.rng.integers(0, 18)), reward, int(terminal))

    def save(self, folder: Path, suffix: int, add_count: int | None = None) -> None:
        """Write checkpoint ``suffix`` (``add_count=``: what ``log_final_buffer`` writes)."""
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {NAMES[k]: v for k, v in self.store.items()}
        arrays["add_count"] = np.array(self.add_count if add_count is None else add_count)
        arrays["invalid_range"] = self.invalid_range
        for name, value in arrays.items():
            path = folder / f"{name}_ckpt.{suffix}.gz"
            with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb") as out:
                np.save(out, value, allow_pickle=False)


def write_run(
    folder: Path, capacity: int = 64, frame: tuple[int, ...] = (6, 5), seed: int = 0
) -> dict[int, str]:
    """Play random episodes and save checkpoints 0 to 4 of every kind; return what each is.

    0: not full yet. 1: wrapped, cursor in the middle. 2: saved when the cursor reached
    ``capacity - 1`` (batch_rl's logged buffers). 3: ``log_final_buffer`` (wrapped, saved with
    ``add_count`` set to the cursor). 4: wrapped, a terminal just before the cursor.
    Episodes last 1 to 20 records (one of exactly 1 record early on).
    """
    buf = ToyDopamineBuffer(capacity, frame, seed=seed)
    rng = np.random.default_rng(seed + 100)
    left = 1  # the first episode has one record
    plan: list[tuple[int, Callable[[], bool], str]] = [
        (0, lambda: buf.add_count >= capacity // 2 + 3, "not full"),
        (1, lambda: buf.add_count >= 2 * capacity + capacity // 3, "wrapped"),
        (2, lambda: buf.add_count > 3 * capacity and buf.cursor == capacity - 1, "logged"),
        (3, lambda: buf.add_count >= 4 * capacity + capacity // 4, "final"),
    ]
    kinds = {}
    while plan:
        left -= 1
        buf.step(terminal=left == 0)
        if left == 0:
            left = int(rng.integers(1, 21))
        suffix, ready, kind = plan[0]
        if ready():
            buf.save(folder, suffix, buf.cursor if kind == "final" else None)
            kinds[suffix] = kind
            plan.pop(0)
    while left:  # end the episode: the newest record of checkpoint 4 is a terminal
        left -= 1
        buf.step(terminal=left == 0)
    buf.save(folder, 4)
    kinds[4] = "terminal at the cursor"
    return kinds


def load(folder: Path, suffix: int) -> dict[str, np.ndarray]:
    """Checkpoint ``suffix``'s arrays, read whole with ``np.load`` (as Dopamine's ``load``)."""
    out = {}
    for key, name in [*NAMES.items(), ("add_count", "add_count"), ("invalid_range",) * 2]:
        with gzip.open(folder / f"{name}_ckpt.{suffix}.gz", "rb") as f:
            out[key] = np.load(f, allow_pickle=False)
    return out


def reference(folder: Path, suffixes: list[int], stack: int = 4) -> list[dict[str, Any]]:
    """Every transition of the checkpoints, in order, one loop step per buffer index."""
    rows: list[dict[str, Any]] = []
    episode = 0
    for suffix in suffixes:
        a = load(folder, suffix)
        cap = len(a["terminal"])
        add_count = int(a["add_count"])
        cursor = add_count % cap
        full = add_count >= cap
        invalid = {int(i) for i in a["invalid_range"]}

        def frames(first: int, end: int, a: dict[str, np.ndarray] = a, cap: int = cap):
            return np.stack([a["observation"][k % cap] for k in range(first, end)])

        def is_valid(i: int, a: dict[str, np.ndarray] = a, cap: int = cap, **rules: Any) -> bool:
            if not rules["full"] and (i >= rules["cursor"] - 1 or i < stack - 1):
                return False
            if i in rules["invalid"]:
                return False
            return not any(a["terminal"][(i - back) % cap] for back in range(1, stack))

        order = [(cursor + k) % cap for k in range(cap)] if full else list(range(cursor))
        start = len(rows)
        for i in order:
            if not is_valid(i, full=full, cursor=cursor, invalid=invalid):
                continue
            done = bool(a["terminal"][i])
            rows.append(
                {
                    "index": i,
                    "observation": frames(i - stack + 1, i + 1),
                    "next_observation": frames(i - stack + 2, i + 2),
                    "action": a["action"][i],
                    "reward": a["reward"][i],
                    "done": done,
                    "episode": episode,
                }
            )
            if done:
                episode += 1
        if len(rows) > start and not rows[-1]["done"]:
            episode += 1  # each checkpoint starts a new episode
    return rows


@contextlib.contextmanager
def serve_ranges(
    directory: Path, drop: dict[str, int] | None = None
) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """Serve ``directory`` with ``Range`` support; yield the URL and (path, Range) requests.

    ``drop``: file name -> bytes: the first response for that file sends only that many bytes
    of its body, then closes the connection (a dropped download).
    """
    requests: list[tuple[str, str | None]] = []
    dropping = dict(drop or {})

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            requests.append((self.path, self.headers.get("Range")))
            path = Path(self.translate_path(self.path))
            if not path.is_file():
                self.send_error(404)
                return
            body = path.read_bytes()
            match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
            start = int(match.group(1)) if match else 0
            if start >= len(body) and match:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.end_headers()
                return
            self.send_response(206 if match else 200)
            if match:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            cut = dropping.pop(path.name, None)
            self.wfile.write(body[start:] if cut is None else body[start : start + cut])
            if cut is not None:
                self.close_connection = True

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: Handler(*a, directory=str(directory))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
