"""Foundation benchmarks: rbdata against a plain-tensor floor, measured in the same run.

Each workload is timed for rbdata and for its *floor* (the same work on plain preallocated
tensors, with no buffer around it); the ratio rbdata / floor is compared with the target.
Peers (cpprb) are printed as extra lines when installed. The script reports and exits 0
whether targets pass or fail; it exits 1 only if a workload raised.

Usage::

    .venv/bin/python tests/benchmarks/bench_foundation.py           # full run (< 1 minute)
    .venv/bin/python tests/benchmarks/bench_foundation.py --quick   # smoke run (seconds)
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import os
import platform
import sys
import time
import timeit
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensordict
import torch
from tensordict import TensorDict
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

import rbdata
from rbdata import MemmapStorage, ReplayBuffer, TensorStorage
from rbdata.storages.base import Storage

try:
    import cpprb
except ImportError:  # optional peer: `pip install 'rbdata[bench]'`
    cpprb = None

# Leaf order used by every floor (matches the keys of the transitions below).
KEYS: tuple[Any, ...] = (
    "observation",
    "action",
    ("next", "reward"),
    ("next", "done"),
    ("next", "observation"),
)
TORCHRL_ADD_NOTE = "TorchRL add: 80-150 us (not installed, from DESIGN.md)"


# --- timing -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """How hard to time: repeats per function, minimum seconds per repeat, warm-up calls."""

    repeat: int
    min_time: float
    warmup: int


FULL = Config(repeat=7, min_time=0.1, warmup=20)
QUICK = Config(repeat=5, min_time=0.02, warmup=5)


def _calibrate(timer: timeit.Timer, min_time: float) -> int:
    """Smallest ``number`` in 1, 2, 5, 10, 20, ... whose loop takes at least ``min_time``."""
    number = 1
    while True:
        for step in (1, 2, 5):
            n = number * step
            if timer.timeit(n) >= min_time:
                return n
        number *= 10


def measure(fns: dict[str, Callable[[], object]], cfg: Config) -> dict[str, float]:
    """Seconds per call of each function: min over ``cfg.repeat`` repeats of a timed loop.

    The functions are warmed up, calibrated, then timed in turn within each repeat, so that
    rbdata and its floor see the same machine conditions.
    """
    timers: dict[str, tuple[timeit.Timer, int]] = {}
    for name, fn in fns.items():
        for _ in range(cfg.warmup):
            fn()
        timer = timeit.Timer(fn)
        timers[name] = (timer, _calibrate(timer, cfg.min_time))
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(cfg.repeat):
        for name, (timer, number) in timers.items():
            best[name] = min(best[name], timer.timeit(number) / number)
    return best


# --- reporting --------------------------------------------------------------------------------
def _fmt_time(seconds: float) -> str:
    us = seconds * 1e6
    if us < 1000:
        return f"{us:8.2f} us"
    return f"{us / 1000:8.3f} ms"


class Report:
    """Prints aligned rows and counts PASS/FAIL."""

    COLS = f"  {'':<46} {'rbdata':>11} {'floor':>11} {'ratio':>7}  {'target':>9}  result"

    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0
        self.errors: list[str] = []

    def section(self, title: str, floor: str) -> None:
        print(f"\n{title}")
        print(f"  floor: {floor}")
        print(self.COLS)

    def _verdict(self, ok: bool) -> str:
        if ok:
            self.passed += 1
            return "PASS"
        self.failed += 1
        return "FAIL"

    def ratio(self, label: str, t: float, floor: float, target: float) -> None:
        r = t / floor
        verdict = self._verdict(r <= target)
        print(
            f"  {label:<46} {_fmt_time(t)} {_fmt_time(floor)} {r:6.2f}x  "
            f"{'<= ' + f'{target:.1f}x':>9}  {verdict}"
        )

    def absolute(self, label: str, t: float, floor: float, target_us: float) -> None:
        verdict = self._verdict(t * 1e6 <= target_us)
        print(
            f"  {label:<46} {_fmt_time(t)} {_fmt_time(floor)} {t / floor:6.2f}x  "
            f"{'<= ' + f'{target_us:.0f} us':>9}  {verdict}"
        )

    def peer(self, label: str, t: float, floor: float | None = None) -> None:
        floor_s = _fmt_time(floor) if floor is not None else f"{'':>11}"
        ratio_s = f"{t / floor:6.2f}x" if floor is not None else f"{'':>7}"
        print(f"  {label:<46} {_fmt_time(t)} {floor_s} {ratio_s}  {'(peer)':>9}")

    def info(self, label: str, t: float, floor: float) -> None:
        print(f"  {label:<46} {_fmt_time(t)} {_fmt_time(floor)} {t / floor:6.2f}x  {'(info)':>9}")

    def note(self, text: str) -> None:
        print(f"  {text}")


# --- data -------------------------------------------------------------------------------------
def transitions(n: int, obs: int = 17, act: int = 6) -> TensorDict:
    """``n`` random transitions with the TorchRL key names."""
    return TensorDict(
        {
            "observation": torch.randn(n, obs),
            "action": torch.randn(n, act),
            "next": {
                "reward": torch.randn(n, 1),
                "done": torch.rand(n, 1) < 0.01,
                "observation": torch.randn(n, obs),
            },
        },
        batch_size=[n],
    )


def leaves(td: TensorDict) -> list[torch.Tensor]:
    """The leaves of ``td`` in ``KEYS`` order."""
    return [td[k] for k in KEYS]


def _close(storage: Storage) -> None:
    if isinstance(storage, MemmapStorage):
        storage.close()


def _storages(capacity: int) -> list[tuple[str, Callable[[], Storage]]]:
    return [
        ("TensorStorage", lambda: TensorStorage(capacity)),
        ("MemmapStorage", lambda: MemmapStorage(capacity)),
    ]


def _free() -> None:
    gc.collect()


class RingFloor:
    """Floor for ``extend``: slice copies into plain tensors at a wrapping cursor."""

    def __init__(self, buffers: list[torch.Tensor], cursor: int) -> None:
        self.buffers = buffers
        self.capacity = buffers[0].shape[0]
        self.cursor = cursor

    def extend(self, xs: list[torch.Tensor]) -> None:
        n, c, cap = xs[0].shape[0], self.cursor, self.capacity
        end = c + n
        if end <= cap:
            for buf, x in zip(self.buffers, xs, strict=True):
                buf[c:end] = x
        else:
            k = cap - c
            for buf, x in zip(self.buffers, xs, strict=True):
                buf[c:] = x[:k]
                buf[: end - cap] = x[k:]
        self.cursor = end % cap


class PlainBatches(Dataset[dict[str, torch.Tensor]]):
    """Floor dataset for the DataLoader: one batched fetch over plain tensors.

    ``index_dtype=torch.long`` converts the index list the fast way; ``None`` lets
    ``torch.as_tensor`` infer the dtype, which costs ~16 us more for 256 ints.
    """

    def __init__(
        self, tensors: dict[str, torch.Tensor], index_dtype: torch.dtype | None = torch.long
    ) -> None:
        self.tensors = tensors
        self.index_dtype = index_dtype
        self.n = next(iter(tensors.values())).shape[0]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: list[int]) -> dict[str, torch.Tensor]:
        i = torch.as_tensor(idx, dtype=self.index_dtype)
        return {k: t.index_select(0, i) for k, t in self.tensors.items()}


class NumpyRing:
    """Floor for ``add``: one row assignment per numpy array at a wrapping cursor."""

    def __init__(self, capacity: int, obs: int) -> None:
        rng = np.random.default_rng(0)  # filled, so no page is touched for the first time
        self.obs = rng.standard_normal((capacity, obs), dtype=np.float32)
        self.act = rng.standard_normal((capacity, 1), dtype=np.float32)
        self.rew = rng.standard_normal((capacity, 1), dtype=np.float32)
        self.done = np.ones((capacity, 1), dtype=np.bool_)
        self.next_obs = rng.standard_normal((capacity, obs), dtype=np.float32)
        self.capacity = capacity
        self.cursor = 0

    def add(
        self,
        obs: np.ndarray,
        act: np.ndarray,
        rew: np.ndarray,
        done: np.ndarray,
        next_obs: np.ndarray,
    ) -> None:
        i = self.cursor
        self.obs[i] = obs
        self.act[i] = act
        self.rew[i] = rew
        self.done[i] = done
        self.next_obs[i] = next_obs
        nxt = i + 1
        self.cursor = nxt if nxt < self.capacity else 0


def _cpprb_buffer(capacity: int, obs: int, act: int) -> Any:
    return cpprb.ReplayBuffer(
        capacity,
        env_dict={
            "obs": {"shape": obs},
            "act": {"shape": act},
            "rew": {},
            "next_obs": {"shape": obs},
            "done": {"dtype": np.bool_},
        },
    )


def _cpprb_fields(xs: list[torch.Tensor]) -> dict[str, np.ndarray]:
    obs, act, rew, done, next_obs = (x.numpy() for x in xs)
    return {"obs": obs, "act": act, "rew": rew, "next_obs": next_obs, "done": done}


# --- workloads --------------------------------------------------------------------------------
def bench_sample_tensor(cfg: Config, rep: Report) -> None:
    n, bs = 100_000, 128
    rep.section(
        f"1. rb.sample({bs}) of float tensors (3, 4), N=100k",
        f"torch.randint + index_select on a plain ({n}, 3, 4) tensor",
    )
    data = torch.randn(n, 3, 4)
    g = torch.Generator().manual_seed(0)

    def floor() -> torch.Tensor:
        return data.index_select(0, torch.randint(n, (bs,), generator=g))

    for name, make in _storages(n):
        storage = make()
        try:
            rb = ReplayBuffer(storage=storage, batch_size=bs)
            rb.extend(data)
            t = measure({"rbdata": rb.sample, "floor": floor}, cfg)
            rep.ratio(name, t["rbdata"], t["floor"], 1.5)
        finally:
            _close(storage)
    _free()


def bench_transitions_1m(cfg: Config, rep: Report) -> None:
    n, bs, chunk, ext = 1_000_000, 256, 100_000, 1000
    rep.section(
        f"2. TensorDict transitions (obs 17, act 6, reward, done, next obs), N=1M: "
        f"sample({bs}), extend({ext})",
        f"sample: randint + index_select on 5 plain tensors; extend: slice copies "
        f"buf[c:c+{ext}] = x per tensor, wrapping cursor split in two",
    )
    full = transitions(n)  # the floor's tensors; also the data the buffers are filled with
    plain = leaves(full)
    g = torch.Generator().manual_seed(0)

    def floor_sample() -> list[torch.Tensor]:
        idx = torch.randint(n, (bs,), generator=g)
        return [t.index_select(0, idx) for t in plain]

    batch = transitions(ext)
    batch_leaves = leaves(batch)
    offset = 337  # first write moves the cursor off a multiple of ext: writes wrap in two slices

    for name, make in _storages(n):
        storage = make()
        try:
            rb = ReplayBuffer(storage=storage, batch_size=bs)
            rb.extend(full[:offset])
            for start in range(0, n, chunk):
                rb.extend(full[start : start + chunk])
            ring = RingFloor(plain, offset)
            t = measure({"rbdata": rb.sample, "floor": floor_sample}, cfg)
            rep.ratio(f"{name} sample({bs})", t["rbdata"], t["floor"], 1.3)
            t = measure(
                {
                    "rbdata": lambda rb=rb: rb.extend(batch),
                    "floor": lambda ring=ring: ring.extend(batch_leaves),
                },
                cfg,
            )
            rep.ratio(f"{name} extend({ext}), full ring", t["rbdata"], t["floor"], 2.0)
            del rb
        finally:
            _close(storage)
        _free()

    if cpprb is None:
        rep.note("cpprb not installed: peer lines skipped (pip install 'rbdata[bench]')")
    else:
        crb = _cpprb_buffer(n, 17, 6)
        for start in range(0, n, chunk):
            crb.add(**_cpprb_fields([x[start : start + chunk] for x in plain]))
        fields = _cpprb_fields(batch_leaves)
        t = measure({"cpprb": lambda: crb.sample(bs), "floor": floor_sample}, cfg)
        rep.peer(f"cpprb ReplayBuffer.sample({bs})", t["cpprb"], t["floor"])
        ring = RingFloor(plain, 0)
        t = measure(
            {"cpprb": lambda: crb.add(**fields), "floor": lambda: ring.extend(batch_leaves)}, cfg
        )
        rep.peer(f"cpprb ReplayBuffer.add(batch of {ext})", t["cpprb"], t["floor"])
        del crb


def bench_dataloader(cfg: Config, rep: Report) -> None:
    n, bs = 100_000, 256
    rep.section(
        f"3. DataLoader(storage, batch_size={bs}, shuffle=True), N=100k transitions, "
        "num_workers=0, time per batch over one epoch",
        f"DataLoader over plain tensors, batched __getitem__(list) -> dict of "
        f"index_select(0, torch.as_tensor(idx, dtype=torch.long)), "
        f"sampler=BatchSampler(RandomSampler, {bs}), batch_size=None",
    )
    td = transitions(n)
    storage = TensorStorage(n)
    storage.set(slice(0, n), td)

    def seeded() -> torch.Generator:
        return torch.Generator().manual_seed(0)

    loader = DataLoader(storage, batch_size=bs, shuffle=True, generator=seeded())
    identity = DataLoader(
        storage, batch_size=bs, shuffle=True, generator=seeded(), collate_fn=lambda b: b
    )
    tensors = {"/".join(k) if isinstance(k, tuple) else k: td[k] for k in KEYS}
    floors = {}
    for name, dtype in (("floor", torch.long), ("floor_infer", None)):
        plain = PlainBatches(tensors, index_dtype=dtype)
        floors[name] = DataLoader(
            plain,
            sampler=BatchSampler(RandomSampler(plain, generator=seeded()), bs, drop_last=False),
            batch_size=None,
        )
    batches = len(loader)

    def epoch(dl: DataLoader[Any]) -> None:
        for _ in dl:
            pass

    t = measure(
        {
            "rbdata": lambda: epoch(loader),
            "identity": lambda: epoch(identity),
            "floor": lambda: epoch(floors["floor"]),
            "floor_infer": lambda: epoch(floors["floor_infer"]),
        },
        cfg,
    )
    per = {k: v / batches for k, v in t.items()}
    rep.ratio(f"TensorStorage ({batches} batches/epoch)", per["rbdata"], per["floor"], 1.2)
    rep.info("  collate_fn=identity (skips default_collate)", per["identity"], per["floor"])
    rep.info(
        "  vs floor with as_tensor(idx), dtype inferred",
        per["rbdata"],
        per["floor_infer"],
    )


def bench_add(cfg: Config, rep: Report) -> None:
    cap, obs = 100_000, 4
    rep.section(
        "4. rb.add(one transition): obs 4, action 1, reward, done, next obs; batch_size [], "
        "capacity 100k (absolute time per call)",
        "plain numpy row assignment into 5 preallocated arrays, wrapping cursor",
    )
    item_td = TensorDict(
        {
            "observation": torch.randn(obs),
            "action": torch.randn(1),
            "next": {
                "reward": torch.randn(1),
                "done": torch.zeros(1, dtype=torch.bool),
                "observation": torch.randn(obs),
            },
        },
        batch_size=[],
    )
    item_dict = {
        "observation": item_td["observation"],
        "action": item_td["action"],
        "next": {
            "reward": item_td["next", "reward"],
            "done": item_td["next", "done"],
            "observation": item_td["next", "observation"],
        },
    }
    np_fields = dict(zip(("obs", "act", "rew", "done", "next_obs"), leaves(item_td), strict=True))
    np_fields = {k: v.numpy() for k, v in np_fields.items()}
    ring = NumpyRing(cap, obs)

    def floor() -> None:
        ring.add(**np_fields)

    for name, make in _storages(cap):
        storage = make()
        try:
            rb = ReplayBuffer(storage=storage)
            rb.extend(item_td.expand(cap).clone())  # fill (touch every page); cursor back at 0
            t = measure(
                {
                    "td": lambda rb=rb: rb.add(item_td),
                    "dict": lambda rb=rb: rb.add(item_dict),
                    "floor": floor,
                },
                cfg,
            )
            rep.absolute(f"{name}, TensorDict item", t["td"], t["floor"], 15.0)
            rep.absolute(f"{name}, nested dict item", t["dict"], t["floor"], 15.0)
            del rb
        finally:
            _close(storage)
        _free()

    if cpprb is None:
        rep.note("cpprb not installed: peer line skipped (pip install 'rbdata[bench]')")
    else:
        crb = _cpprb_buffer(cap, obs, 1)
        crb.add(**{k: np.repeat(v[None], cap, axis=0) for k, v in np_fields.items()})
        t = measure({"cpprb": lambda: crb.add(**np_fields), "floor": floor}, cfg)
        rep.peer("cpprb ReplayBuffer.add (one transition)", t["cpprb"], t["floor"])
        del crb
    rep.note(TORCHRL_ADD_NOTE)
    _free()


WORKLOADS: list[Callable[[Config, Report], None]] = [
    bench_sample_tensor,
    bench_transitions_1m,
    bench_dataloader,
    bench_add,
]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats (smoke run)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL

    torch.set_num_threads(1)
    torch.manual_seed(0)
    print("rbdata foundation benchmarks" + (" (--quick)" if args.quick else ""))
    print(
        f"  rbdata {rbdata.__version__}, torch {torch.__version__}, tensordict "
        f"{tensordict.__version__}, numpy {np.__version__}, cpprb {_version('cpprb')}"
    )
    print(
        f"  Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
        f"torch.set_num_threads(1) for stable numbers"
    )
    print(
        f"  time per call = min over {cfg.repeat} repeats of a timed loop of >= "
        f"{cfg.min_time * 1e3:.0f} ms (after {cfg.warmup} warm-up calls); rbdata and its "
        "floor interleaved in the same run; ratio = rbdata / floor"
    )
    rep = Report()
    start = time.perf_counter()
    for workload in WORKLOADS:
        try:
            workload(cfg, rep)
        except Exception:
            rep.errors.append(workload.__name__)
            print(f"  ERROR in {workload.__name__}:")
            traceback.print_exc(file=sys.stdout)
        _free()
    elapsed = time.perf_counter() - start
    print(
        f"\nsummary: {rep.passed} PASS, {rep.failed} FAIL"
        + (f", {len(rep.errors)} ERROR ({', '.join(rep.errors)})" if rep.errors else "")
        + f" in {elapsed:.1f} s (targets are reported, not enforced)"
    )
    return 1 if rep.errors else 0


if __name__ == "__main__":
    sys.exit(main())
