"""Distributed benchmarks: many writer processes on one machine, then Ray (when installed).

Workload 1 (one machine): aggregate ``extend(1000)`` throughput of transitions into one
shared :class:`~rbdata.storages.MemmapStorage` from 1 and 2 writer processes (spawned; the
start-up is not timed: they start together at a barrier), against the single-process floor of
the foundation benchmark (slice copies into plain tensors) and the single-process rbdata
extend (unshared: no lock; shared: the same process through the write lock). Writers of a
shared storage serialise on its lock file, so 2 writers cannot beat 1 by more than what runs
outside the lock (validation, building the batch); the scaling is reported, not targeted.

Workload 2 (one machine): readers racing overwrites of a full ring. A writer process
overwrites continuously while ``DataLoader(num_workers=2)`` reads random batches; the fraction
of torn rows (fields of two different writes) is reported, without and with reads under the
storage's write lock (``storage.write_lock()``), with the read throughput of both. Readers of
a shared storage check per-slot version words (``rbdata/storages/_versions.py``): both
fractions must be 0.

Workload 3 (one machine): the cost of those versions on a read of a shared storage
(``storage[idx]``) against the same read of the same files opened unshared. Target: <= 1.10x.
Workload 4 (Ray): ``tests/benchmarks/_bench_ray.py`` (written with the Ray work), skipped with
a note when ``ray`` is not installed.

Usage::

    .venv/bin/python tests/benchmarks/bench_distributed.py           # full run
    .venv/bin/python tests/benchmarks/bench_distributed.py --quick   # smoke run
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from typing import Any

import _timing
import torch
from _timing import Config, Report, free, measure
from bench_foundation import RingFloor, leaves, transitions
from tensordict import TensorDict
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from rbdata import MemmapStorage, ReplayBuffer

EXT = 1000
CAPACITY = 200_000


# --- workload 1: aggregate extend throughput -------------------------------------------------
def _writer(rb: ReplayBuffer, calls: int, barrier: Any, out: Any) -> None:
    torch.set_num_threads(1)
    batch = transitions(EXT)
    rb.extend(batch)  # warm-up (maps the files, first-lap pages)
    barrier.wait()
    start = time.monotonic()
    for _ in range(calls):
        rb.extend(batch)
    out.put((start, time.monotonic()))


def _aggregate(rb: ReplayBuffer, writers: int, calls: int) -> float:
    """Items per second of ``writers`` processes extending ``rb`` at once (spawned)."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(writers), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(rb, calls, barrier, out)) for _ in range(writers)]
    for p in procs:
        p.start()
    spans = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"a writer failed: exit codes {[p.exitcode for p in procs]}")
    elapsed = max(e for _, e in spans) - min(s for s, _ in spans)
    return writers * calls * EXT / elapsed


def bench_writers(cfg: Config, rep: Report) -> None:
    rep.section(
        f"1. aggregate extend({EXT}) of transitions into one MemmapStorage({CAPACITY}), "
        "1 and 2 writer processes (time per 1000 items; lower is better)",
        f"slice copies of {EXT} rows into 5 plain tensors in one process (foundation floor)",
    )
    batch = transitions(EXT)
    plain = leaves(transitions(CAPACITY))
    ring = RingFloor(plain, 0)
    storage = MemmapStorage(CAPACITY)
    rb = ReplayBuffer(storage=storage)
    try:
        rb.extend(transitions(CAPACITY))  # a full ring: every write overwrites (the journal)
        t = measure(
            {"rbdata": lambda: rb.extend(batch), "floor": lambda: ring.extend(leaves(batch))}, cfg
        )
        floor = t["floor"]
        rep.info("1 process, unshared (no lock)", t["rbdata"], floor)
        storage.share()
        t_shared = measure({"rbdata": lambda: rb.extend(batch)}, cfg)["rbdata"]
        rep.info("1 process, shared (write lock per extend)", t_shared, floor)
        calls = max(20, int(cfg.min_time * cfg.repeat * 1000))
        per_item = {}
        for writers in (1, 2):
            throughput = _aggregate(rb, writers, calls)
            per_item[writers] = EXT / throughput
            rep.info(
                f"{writers} writer process{'es' if writers > 1 else ''}, aggregate",
                per_item[writers],
                floor,
            )
        scaling = per_item[1] / per_item[2]
        rep.note(
            f"scaling 1 -> 2 writer processes: {scaling:.2f}x aggregate throughput "
            f"({EXT / per_item[1]:,.0f} -> {EXT / per_item[2]:,.0f} items/s; writers "
            "serialise on the lock file; 2 cores)"
        )
    finally:
        storage.close()
        free()


# --- workload 2: torn reads of a full ring ---------------------------------------------------
def _code_batch(n: int, start: int) -> TensorDict:
    """Rows whose every field holds the row's code: a torn row mixes two codes."""
    code = torch.arange(start, start + n, dtype=torch.float32).unsqueeze(1)
    return TensorDict(
        {
            "observation": code.expand(n, 17).clone(),
            "next": {"observation": code.expand(n, 17).clone()},
        },
        batch_size=[n],
    )


def _overwriter(rb: ReplayBuffer, stop: Any) -> None:
    torch.set_num_threads(1)
    start = 1
    while not stop.is_set():
        rb.extend(_code_batch(EXT, start))
        start += EXT


class LockedReads(Dataset[Any]):
    """The storage read under its write lock: no writer changes the rows being read."""

    def __init__(self, storage: MemmapStorage) -> None:
        self.storage = storage

    def __len__(self) -> int:
        return len(self.storage)

    def __getitems__(self, idx: list[int]) -> Any:
        with self.storage.write_lock():
            return self.storage.__getitems__(idx)


def _torn(batch: TensorDict) -> int:
    obs, nxt = batch["observation"], batch["next", "observation"]
    whole = (obs == obs[:, :1]).all(1) & (nxt == obs[:, :1]).all(1)
    return int((~whole).sum())


def bench_torn_reads(cfg: Config, rep: Report) -> None:
    cap, bs = 20_000, 256
    seconds = max(1.0, cfg.min_time * cfg.repeat * 3)
    rep.section(
        f"2. DataLoader(num_workers=2) reading random batches of {bs} from a full ring of {cap} "
        f"while a writer process overwrites it (extend({EXT}) in a loop), {seconds:.1f} s each",
        "reads without the lock (time per batch); the ratio is the locked read's cost",
    )
    storage = MemmapStorage(cap)
    rb = ReplayBuffer(storage=storage)
    rb.extend(_code_batch(cap, 1))
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    writer = ctx.Process(target=_overwriter, args=(rb, stop))
    writer.start()
    results: dict[str, tuple[float, int, int]] = {}
    try:
        time.sleep(0.5)  # the writer is writing
        for name, dataset in (("plain", storage), ("locked", LockedReads(storage))):
            sampler = BatchSampler(
                RandomSampler(range(cap), replacement=True, num_samples=10**9), bs, False
            )
            loader = DataLoader(
                dataset, batch_sampler=sampler, num_workers=2, collate_fn=lambda b: b
            )
            rows = torn = 0
            it = iter(loader)
            next(it)  # the workers are up
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                batch = next(it)
                rows += batch.shape[0]
                torn += _torn(batch)
            elapsed = time.perf_counter() - start
            del it
            results[name] = (elapsed / (rows / bs), rows, torn)
    finally:
        stop.set()
        writer.join()
        storage.close()
        free()
    t_plain, rows, torn = results["plain"]
    t_locked, rows_l, torn_l = results["locked"]
    rep.info("batch without the lock", t_plain, t_plain)
    rep.info("batch under storage.write_lock()", t_locked, t_plain)
    rep.note(f"torn rows without the lock: {torn} of {rows} ({100 * torn / max(rows, 1):.3f}%)")
    rep.note(
        f"torn rows under the lock:   {torn_l} of {rows_l} ({100 * torn_l / max(rows_l, 1):.3f}%)"
    )
    rep.value("torn fraction under the lock (must be 0)", torn_l / max(rows_l, 1), 0.0)
    rep.value("torn fraction without the lock (must be 0)", torn / max(rows, 1), 0.0)


def bench_version_check(cfg: Config, rep: Report) -> None:
    """What the per-slot versions cost a read of a shared storage, with no writer racing."""
    cap, bs = 20_000, 256
    rep.section(
        f"3. storage[idx] of {bs} random rows of a MemmapStorage({cap}), shared (versions "
        "checked around the gather) vs the same files opened unshared, no writer",
        "the same gather of the same files without the version words (unshared)",
    )
    storage = MemmapStorage(cap)
    rb = ReplayBuffer(storage=storage)
    rb.extend(_code_batch(cap, 1))
    storage.share()
    # the same files, no versions: a second read/write open here would join the shared
    # holder (rbdata._core.holders), a read-only one maps them privately and checks nothing
    plain = MemmapStorage.open(storage.path, read_only=True)
    gen = torch.Generator().manual_seed(0)
    idx = [torch.randint(cap, (bs,), generator=gen) for _ in range(64)]
    state = {"i": 0}

    def pick() -> torch.Tensor:
        state["i"] = (state["i"] + 1) % len(idx)
        return idx[state["i"]]

    try:
        assert (storage[idx[0]] == plain[idx[0]]).all()
        t = measure({"shared": lambda: storage[pick()], "plain": lambda: plain[pick()]}, cfg)
        rep.ratio("shared read (versions checked)", t["shared"], t["plain"], 1.10)
    finally:
        plain.close()
        storage.close()
        free()


# --- workload 3: Ray (written by the Ray work in tests/benchmarks/_bench_ray.py) -----------
def _ray_workloads() -> list[Callable[[Config, Report], None]]:
    try:
        import ray  # noqa: F401
        from _bench_ray import bench_ray
    except ImportError as err:
        reason = str(err)

        def ray_skipped(cfg: Config, rep: Report) -> None:
            rep.note(f"\n3. Ray workloads skipped: {reason} (pip install 'rbdata[ray]')")

        return [ray_skipped]
    return [bench_ray]


WORKLOADS: list[Callable[[Config, Report], None]] = [
    bench_writers,
    bench_torn_reads,
    bench_version_check,
    *_ray_workloads(),  # the Ray work's benchmarks
]


def main(argv: list[str] | None = None) -> int:
    """Run every workload; ``--quick`` for a smoke run."""
    return _timing.main("rbdata distributed benchmarks", WORKLOADS, argv)


if __name__ == "__main__":
    sys.exit(main())
