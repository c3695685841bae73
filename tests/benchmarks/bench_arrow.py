"""ArrowStorage benchmarks: against MemmapStorage, measured in the same run, and a plain floor.

One workload, the 1M TensorDict transitions of ``bench_foundation.py`` (workload 2): both
storages are filled with the same data and timed interleaved with each other and with the
plain-tensor floor. Rows with a target compare ArrowStorage with MemmapStorage (ratio =
arrow / memmap); ``(info)`` rows compare each storage with the floor. ``extend`` is timed in
whole laps of the full ring: each timed lap writes every chunk exactly once, so per-chunk
costs are amortised in the time per call (a chunk file rewritten when the cursor leaves it;
with this all-fixed-shape layout ArrowStorage writes full chunks in place instead). The
script reports and exits 0 whether targets pass or fail; it exits 1 only if a workload raised.

Usage::

    .venv/bin/python tests/benchmarks/bench_arrow.py           # full run (under a minute)
    .venv/bin/python tests/benchmarks/bench_arrow.py --quick   # smoke run
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

import _timing
import torch
from _timing import Config, Report, free, measure
from bench_foundation import RingFloor, leaves, transitions

from rbdata import ArrowStorage, MemmapStorage, ReplayBuffer


def _lap(fn: Callable[[], object], calls: int) -> Callable[[], None]:
    """``fn`` called ``calls`` times: one timed unit (a whole lap of the ring)."""

    def lap() -> None:
        for _ in range(calls):
            fn()

    return lap


def bench_transitions_1m(cfg: Config, rep: Report) -> None:
    n, bs, fill, ext = 1_000_000, 256, 100_000, 1000
    laps = n // ext  # calls per lap of the ring
    rep.section(
        f"1. ArrowStorage vs MemmapStorage: TensorDict transitions (obs 17, act 6, reward, "
        f"done, next obs), N=1M: rb.sample({bs}), rb.extend({ext}) on the full ring, timed in "
        f"whole laps ({laps} calls, each chunk written once per lap)",
        f"sample: randint + index_select on 5 plain tensors; extend: slice copies "
        f"buf[c:c+{ext}] = x per tensor, wrapping cursor split in two",
    )
    full = transitions(n)
    plain = leaves(full)
    g = torch.Generator().manual_seed(0)

    def floor_sample() -> list[torch.Tensor]:
        idx = torch.randint(n, (bs,), generator=g)
        return [t.index_select(0, idx) for t in plain]

    batch = transitions(ext)
    batch_leaves = leaves(batch)
    offset = 337  # as in bench_foundation: a write wraps in two slices once per lap
    ring = RingFloor(plain, offset)

    storages: dict[str, MemmapStorage | ArrowStorage] = {}
    try:
        storages["memmap"] = MemmapStorage(n)
        storages["arrow"] = ArrowStorage(n)
        rbs = {}
        for name, storage in storages.items():
            rb = ReplayBuffer(storage=storage, batch_size=bs)
            rb.extend(full[:offset])
            for start in range(0, n, fill):
                rb.extend(full[start : start + fill])
            rbs[name] = rb
        arrow = storages["arrow"]
        assert isinstance(arrow, ArrowStorage)
        chunks = -(-n // arrow.chunk_size)

        t = measure(
            {"memmap": rbs["memmap"].sample, "arrow": rbs["arrow"].sample, "floor": floor_sample},
            cfg,
        )
        rep.info(f"MemmapStorage sample({bs})", t["memmap"], t["floor"])
        rep.info(f"ArrowStorage sample({bs})", t["arrow"], t["floor"])
        sample = t

        # one lap is hundreds of ms for ArrowStorage: a single warm-up lap is enough
        lap_cfg = dataclasses.replace(cfg, warmup=1)
        t = measure(
            {
                "memmap": _lap(lambda rb=rbs["memmap"]: rb.extend(batch), laps),
                "arrow": _lap(lambda rb=rbs["arrow"]: rb.extend(batch), laps),
                "floor": _lap(lambda: ring.extend(batch_leaves), laps),
            },
            lap_cfg,
        )
        extend = {k: v / laps for k, v in t.items()}
        rep.info(f"MemmapStorage extend({ext}), full ring", extend["memmap"], extend["floor"])
        rep.info(f"ArrowStorage extend({ext}), full ring", extend["arrow"], extend["floor"])

        rep.columns("memmap")
        rep.ratio(f"ArrowStorage sample({bs})", sample["arrow"], sample["memmap"], 2.0)
        rep.ratio(
            f"ArrowStorage extend({ext}), full ring",
            extend["arrow"],
            extend["memmap"],
            3.0,
        )
        rep.note(
            f"ArrowStorage chunk_size {arrow.chunk_size} (default): {chunks} chunk files, "
            f"each written once per lap of {laps} calls; extend timed after 1 warm-up lap"
        )
    finally:
        for storage in storages.values():
            storage.close()
    free()


WORKLOADS: list[Callable[[Config, Report], None]] = [bench_transitions_1m]


def main(argv: list[str] | None = None) -> int:
    """Run every workload; ``--quick`` for a smoke run."""
    return _timing.main("rbdata ArrowStorage benchmarks", WORKLOADS, argv)


if __name__ == "__main__":
    sys.exit(main())
