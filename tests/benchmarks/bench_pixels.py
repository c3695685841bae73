"""A pixel replay buffer on real Atari frames: TensorStorage and FrameStackStorage (issue 35).

Frames from ``tests/_atari_frames.py`` (ALE Pong and Seaquest, 84x84 gray, 4-stacks, a seeded
random policy; synthetic frames, said in every header, without ``ale-py``). For each storage
-- ``TensorStorage`` (every stack stored whole) and ``FrameStackStorage(capacity, 4,
codec=...)`` with ``codec=None``, ``"lz4"`` and ``"zstd"`` -- in a ``ReplayBuffer`` of 10,000
steps (2,000 with ``--quick``) filled by 20,000 consecutive steps (the ring wrapped), timed
interleaved with its floor:

1. ``rb.add(step)`` of one transition as an env gives it (numpy ``observation`` and
   ``("next", "observation")`` stacks ``[4, 84, 84]`` uint8, ``action``, ``("next",
   "reward")``, ``("next", "done")``), consecutive steps. Floor: numpy row assignment of the
   same five leaves into preallocated arrays. Targets (issue 35): <= 10 us without a codec,
   <= 15 us with lz4. The steps cycle through 1,000 (56 MB of stacks): every input is read
   from memory, not cache, by rbdata and the floor alike. Row 1b (info) cycles 16 steps, whose
   inputs stay in cache as an env's freshly made arrays do.
2. ``rb.extend(batch)`` of 256 consecutive steps (a TensorDict). Floor: slice copies of the
   five leaves into plain tensors at a wrapping cursor. Info only.
3. ``rb.sample(32)``: observation and next observation stacks, action, reward, done. Floor:
   ``randint`` + two ``index_select`` of 32 pre-stacked rows ``[4, 84, 84]`` (the other
   leaves are not gathered). Targets: <= 2x the floor without a codec, <= 0.4 ms with lz4.
4. Bytes per step: the resident memory a fresh child process gains creating a storage of
   20,000 steps (2,000 with ``--quick``) and filling it (capacity = steps: nothing is
   overwritten), divided by the steps (the imports and compiled kernels are not counted: a
   small storage of the same kind is used once before), and the memory gained after the
   first 1,000 steps divided by the steps after them: the growth per step, which a 1M-step
   buffer costs once its set-up is amortised, judged against the targets (no codec <= 1.03 x
   7,056 B + the other fields; lz4 <= 1/8 of that on Seaquest, <= 1/20 on Pong). All three
   games. A storage's own ``nbytes()``, where it has one, is printed beside.

Until ``rbdata.storages.FrameStackStorage`` exists, its rows are skipped with a message and
the TensorStorage rows still run. TorchRL is not needed.

Run: ``python tests/benchmarks/bench_pixels.py [--quick]`` (part of ``make bench``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _timing import QUICK, Config, Report, free, measure
from _timing import main as timing_main
from tensordict import TensorDict

import rbdata.storages
from rbdata import ReplayBuffer
from rbdata.storages import Storage, TensorStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the frames
from _atari_frames import GAMES, STACK, atari_steps

HERE = Path(__file__).resolve().parent
FRAME = 84 * 84
OTHER = 8 + 4 + 1  #: bytes per step of action (int64), reward (float32), done (bool)
TIMED = ("Pong", "Seaquest")  #: the least and the most detailed game
SETUP = 1_000  #: steps of the bytes workload counted as the storage's set-up
CODECS = (None, "lz4", "zstd")
ADD_TARGET_US = {None: 10.0, "lz4": 15.0}
SAMPLE_LZ4_TARGET_US = 400.0
SAMPLE_RATIO_TARGET = 2.0
HOT = 16  #: steps cycled by the cache-hot add row (one in 16 starts a new stack)


def _sizes(cfg: Config) -> tuple[int, int]:
    """(steps recorded per game, buffer capacity)."""
    return (2_000, 2_000) if cfg is QUICK else (20_000, 10_000)


_SAID: list[bool] = []  #: the skip message is printed once


def frame_storage() -> Any:
    """``rbdata.storages.FrameStackStorage``, or ``None`` (printed) until it lands."""
    cls = getattr(rbdata.storages, "FrameStackStorage", None)
    if cls is None and not _SAID:
        _SAID.append(True)
        print(
            "  FrameStackStorage rows SKIPPED: rbdata.storages.FrameStackStorage does not exist "
            "yet (issue 35); only the TensorStorage rows run"
        )
    return cls


def storages(capacity: int) -> dict[str, Callable[[], Storage]]:
    """Label -> a new storage of ``capacity`` steps, for every storage that exists here."""
    out: dict[str, Callable[[], Storage]] = {"TensorStorage": lambda: TensorStorage(capacity)}
    cls = frame_storage()
    for codec in CODECS if cls is not None else ():
        out[f"FrameStackStorage codec={codec}"] = lambda c=codec: cls(capacity, STACK, codec=c)
    return out


def codec_of(label: str) -> str | None:
    value = label.rpartition("codec=")[2]
    return None if value in ("", "None") else value


# --- data -------------------------------------------------------------------------------------
def batch(steps: Any, start: int, stop: int) -> TensorDict:
    """Steps ``[start, stop)`` as a TensorDict of the five leaves."""
    t = steps.transitions(start, stop)
    nxt = t["next"]
    return TensorDict(
        {
            "observation": torch.from_numpy(t["observation"]),
            "action": torch.from_numpy(t["action"]),
            "next": {
                "observation": torch.from_numpy(nxt["observation"]),
                "reward": torch.from_numpy(nxt["reward"]),
                "done": torch.from_numpy(nxt["done"]),
            },
        },
        [stop - start],
    )


def items(steps: Any, n: int) -> list[dict[str, Any]]:
    """The first ``n`` steps one by one, as a gymnasium env gives them (numpy, Python numbers)."""
    t = steps.transitions(0, n)
    obs, nxt = t["observation"], t["next"]
    return [
        {
            "observation": obs[i],
            "action": np.int64(t["action"][i]),
            "next": {
                "observation": nxt["observation"][i],
                "reward": float(nxt["reward"][i]),
                "done": bool(nxt["done"][i]),
            },
        }
        for i in range(n)
    ]


class Plain:
    """The floors: the five leaves as plain preallocated tensors (and numpy views of them)."""

    def __init__(self, steps: Any, capacity: int) -> None:
        full = batch(steps, len(steps) - capacity, len(steps))
        self.leaves = [
            full["observation"].clone(),
            full["action"].clone(),
            full["next", "observation"].clone(),
            full["next", "reward"].clone(),
            full["next", "done"].clone(),
        ]
        self.arrays = [t.numpy() for t in self.leaves]
        self.capacity, self.cursor = capacity, 0

    def add(self, item: dict[str, Any]) -> None:
        c, a = self.cursor, self.arrays
        nxt = item["next"]
        a[0][c] = item["observation"]
        a[1][c] = item["action"]
        a[2][c] = nxt["observation"]
        a[3][c] = nxt["reward"]
        a[4][c] = nxt["done"]
        self.cursor = (c + 1) % self.capacity

    def extend(self, td: TensorDict) -> None:
        n, c = td.batch_size[0], self.cursor
        src = [td["observation"], td["action"], td["next", "observation"]]
        src += [td["next", "reward"], td["next", "done"]]
        first = min(n, self.capacity - c)
        for dst, s in zip(self.leaves, src, strict=True):
            dst[c : c + first].copy_(s[:first])
            if first < n:
                dst[: n - first].copy_(s[first:])
        self.cursor = (c + n) % self.capacity

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(self.capacity, (n,))
        return self.leaves[0].index_select(0, idx), self.leaves[2].index_select(0, idx)


def _cycler(pool: list[Any], fn: Callable[[Any], object]) -> Callable[[], object]:
    state = {"i": -1}

    def call() -> object:
        state["i"] = (state["i"] + 1) % len(pool)
        return fn(pool[state["i"]])

    return call


# --- workloads 1-3 ----------------------------------------------------------------------------
def timed(cfg: Config, rep: Report) -> None:
    """``add``, ``extend(256)`` and ``sample(32)`` on each storage, against the floors."""
    n, capacity = _sizes(cfg)
    for game in TIMED:
        steps = atari_steps(game, n)
        print(f"\n{game}, a ReplayBuffer of {capacity} steps: add, extend(256), sample(32)")
        print(f"  frames: {steps.describe()}")
        makers = storages(capacity)
        plain = Plain(steps, capacity)
        adds = items(steps, 1_000 if cfg is not QUICK else 300)
        batches = [batch(steps, s, s + 256) for s in range(0, min(len(steps) - 255, 2_048), 256)]
        hot = adds[:HOT]
        rows: dict[str, dict[str, tuple[float, float]]] = {
            "add": {},
            "add_hot": {},
            "extend": {},
            "sample": {},
        }
        for label, make in makers.items():
            try:
                rb = ReplayBuffer(make())
            except Exception as err:  # e.g. a codec whose library is missing
                print(f"  {label}: SKIPPED, {type(err).__name__}: {err}")
                continue
            for s in range(0, len(steps), 1_000):
                rb.extend(batch(steps, s, min(s + 1_000, len(steps))))
            for name, mine, floor in (
                ("add", _cycler(adds, rb.add), _cycler(adds, plain.add)),
                ("add_hot", _cycler(hot, rb.add), _cycler(hot, plain.add)),
                ("extend", _cycler(batches, rb.extend), _cycler(batches, plain.extend)),
                ("sample", lambda rb=rb: rb.sample(32), lambda p=plain: p.sample(32)),
            ):
                t = measure({"floor": floor, label: mine}, cfg)
                rows[name][label] = (t[label], t["floor"])
            del rb
            free()
        _print_rows(rep, rows)
        del plain, adds, batches
        free()


def _print_rows(rep: Report, rows: dict[str, dict[str, tuple[float, float]]]) -> None:
    rep.section("1. rb.add(step), one transition", "numpy row assignment of the five leaves")
    for label, (t, floor) in rows["add"].items():
        codec = codec_of(label)
        if label.startswith("FrameStack") and codec in ADD_TARGET_US:
            rep.absolute(label, t, floor, ADD_TARGET_US[codec])
        else:
            rep.info(label, t, floor)
    rep.section(
        f"1b. rb.add(step), the same {HOT} steps cycled (inputs in cache, as an env's new arrays)",
        "numpy row assignment of the five leaves",
    )
    for label, (t, floor) in rows["add_hot"].items():
        rep.info(label, t, floor)
    rep.section("2. rb.extend(256 steps)", "slice copies of the five leaves, wrapping cursor")
    for label, (t, floor) in rows["extend"].items():
        rep.info(label, t, floor)
    rep.section("3. rb.sample(32)", "randint + 2 index_select of 32 rows [4, 84, 84]")
    for label, (t, floor) in rows["sample"].items():
        codec = codec_of(label)
        if not label.startswith("FrameStack"):
            rep.info(label, t, floor)
        elif codec is None:
            rep.ratio(label, t, floor, SAMPLE_RATIO_TARGET)
        elif codec == "lz4":
            rep.absolute(label, t, floor, SAMPLE_LZ4_TARGET_US)
        else:
            rep.info(label, t, floor)


# --- workload 4 -------------------------------------------------------------------------------
def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def rss_child(label: str, game: str, n: int) -> None:
    """In a fresh process: the resident bytes per step of ``label`` filled with ``n`` steps."""
    steps = atari_steps(game, n)
    warm = ReplayBuffer(storages(300)[label]())  # imports, compiled kernels, the allocator's
    warm.extend(batch(steps, 0, 300))  # pools: all ready before the baseline
    warm.sample(32)
    del warm
    batch(steps, 0, min(n, 1_000))  # the same allocations as the loop's, made and freed once
    free()
    before = _rss()
    rb = ReplayBuffer(storages(n)[label]())
    gained = []  # after the first 1,000 steps (the set-up) and at the end
    for start, stop in ((0, SETUP), (SETUP, n)):
        for s in range(start, stop, 1_000):
            rb.extend(batch(steps, s, min(s + 1_000, stop)))
        free()
        gained.append(_rss() - before)
    own = getattr(rb.storage, "nbytes", None)
    print("BYTES", gained[1], gained[0], n, own() if callable(own) else -1)


def bytes_per_step(cfg: Config, rep: Report) -> None:
    """Resident bytes per step of each storage, in a child process each (Linux only)."""
    n, _ = _sizes(cfg)
    print(f"\n4. bytes per step: resident memory gained filling {n} steps, in a child process")
    if not sys.platform.startswith("linux"):
        print("  skipped: reads VmRSS from /proc/self/status")
        return
    plain = STACK * FRAME * 2 + OTHER
    frames_once = int(1.03 * FRAME) + OTHER
    print(
        f"  for scale: stacks stored whole {plain:,} B; each frame once (+3%) {frames_once:,} B "
        f"(the target without a codec); the other fields {OTHER} B"
    )
    print(
        f"  B/step: all the memory gained / steps; growth: gained after the first {SETUP:,} "
        "steps / the steps\n  after them (the cost per step of a large buffer, judged against "
        "the target); nbytes: the storage's own count"
    )
    print(
        f"  {'':<36} {'game':>9} {'B/step':>9} {'growth':>9} {'nbytes':>9} {'vs whole':>9} "
        f"{'target':>10}  result"
    )
    # the child imports the rbdata imported here; glibc returns every freed batch to the
    # system at once (no heap growth from the input batches in the resident figure)
    root = str(Path(rbdata.__file__).resolve().parents[1])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 16)}
    for game in GAMES:
        atari_steps(game, n)  # recorded (and cached) here, not in each child
        for label in storages(n):
            code = (
                f"import sys; sys.path[:0] = [{root!r}, {str(HERE)!r}]; "
                f"import bench_pixels as b; b.rss_child({label!r}, {game!r}, {n})"
            )
            done = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                env=env,
                cwd=HERE,
                check=False,
            )
            if done.returncode != 0 or "BYTES" not in done.stdout:
                print(f"  {label:<36} {game:>9} FAILED: {done.stderr.strip()[-300:]}")
                continue
            total, setup, steps, own = (int(w) for w in done.stdout.split("BYTES")[1].split())
            per, growth = total / steps, (total - setup) / (steps - SETUP)
            target = _bytes_target(label, game, frames_once)
            verdict = "" if target is None else rep.verdict(growth <= target)
            target_s = "(info)" if target is None else f"<= {target:,.0f}"
            own_s = f"{own / steps:>9,.0f}" if own >= 0 else f"{'-':>9}"
            vs_whole = f"{plain / growth:.1f}x" if growth > 0 else "-"  # committed up front
            print(
                f"  {label:<36} {game:>9} {per:>9,.0f} {growth:>9,.0f} {own_s} "
                f"{vs_whole:>9} {target_s:>10}  {verdict}"
            )


def _bytes_target(label: str, game: str, frames_once: int) -> float | None:
    if not label.startswith("FrameStack"):
        return None
    codec = codec_of(label)
    if codec is None:
        return frames_once
    if codec == "lz4" and game in ("Pong", "Seaquest"):
        return frames_once / (20 if game == "Pong" else 8)
    return None


def main(argv: list[str] | None = None) -> int:
    """Run every workload; ``--quick`` for a smoke run."""
    return timing_main(
        "bench_pixels: Atari frame stacks in a replay buffer, TensorStorage and FrameStackStorage",
        [timed, bytes_per_step],
        argv,
        quick_help="2,000 steps per game, a 2,000-step buffer, fewer repeats",
    )


if __name__ == "__main__":
    sys.exit(main())
