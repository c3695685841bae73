"""Mixture benchmarks: ``MixedBuffer.sample(256)`` against its sources sampled alone, same run.

Workloads (RLPD's two sources, 50/50):

1. the D4RL sample (``cartpole-random-v0``, memory-mapped, 9 leaves of which the 7 shared
   ones are kept) + an online ``ReplayBuffer`` on a ``TensorStorage`` (100k slots, 20k
   filled), both uniform. The floor is the sum of each source's own ``sample(128)`` (its
   share of the batch), timed interleaved with the mixture. Target: <= 1.2x.
2. the same with a prioritized online buffer (``"weight"`` filled for the offline rows).
3. for scale: the sum of the sources' ``sample(256)`` each (a looser reference).

Run: ``python tests/benchmarks/bench_mixed.py [--quick]`` (part of ``make bench``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from _timing import Config, Report, measure
from _timing import main as timing_main

from rbdata import MixedBuffer, PrioritizedSampler, ReplayBuffer, TensorStorage
from rbdata.datasets import D4RL, write_sample

TARGET = 1.2
BATCH = 256
KEYS = ["observation", "action", ("next", "observation"), ("next", "reward")]
KEYS += [("next", "done"), ("next", "terminated"), ("next", "truncated")]


def _sources(tmp: Path, prioritized: bool) -> tuple[D4RL, ReplayBuffer]:
    file = tmp / "cartpole.hdf5"
    if not file.exists():
        write_sample("cartpole-random-v0", file)
    ds = D4RL("cartpole-random-v0", root=tmp / "cache", file=file, progress=False)
    sampler = PrioritizedSampler(100_000, alpha=0.6, beta=0.4) if prioritized else None
    online = ReplayBuffer(TensorStorage(100_000), sampler)
    online.extend(ds.storage[torch.arange(20_000)].select(*KEYS))
    return ds, online


def _workload(cfg: Config, rep: Report, prioritized: bool) -> None:
    kind = "prioritized" if prioritized else "uniform"
    with tempfile.TemporaryDirectory() as tmp:
        ds, online = _sources(Path(tmp), prioritized)
        # each source alone, selecting the same keys as the mixture (a TensorDict select)
        mixed = MixedBuffer(
            {"offline": ds, "online": online}, {"offline": 0.5, "online": 0.5}, keys=KEYS
        )
        half = BATCH // 2
        t = measure(
            {
                "mixed": lambda: mixed.sample(BATCH),
                "offline": lambda: ds.sample(half),
                "online": lambda: online.sample(half),
                "offline_full": lambda: ds.sample(BATCH),
                "online_full": lambda: online.sample(BATCH),
            },
            cfg,
        )
        floor = t["offline"] + t["online"]
        rep.ratio(f"D4RL + {kind} online, sample({BATCH}) 50/50", t["mixed"], floor, TARGET)
        full = t["offline_full"] + t["online_full"]
        rep.info(f"  vs the sources' sample({BATCH}) each", t["mixed"], full)
        ds.close()


def bench_uniform(cfg: Config, rep: Report) -> None:
    rep.section(
        "MixedBuffer.sample: RLPD's 50/50 batch of 256",
        "offline ds.sample(128) + online rb.sample(128), timed in the same run",
    )
    _workload(cfg, rep, prioritized=False)


def bench_prioritized(cfg: Config, rep: Report) -> None:
    rep.section(
        "MixedBuffer.sample with a prioritized online buffer",
        "offline ds.sample(128) + prioritized rb.sample(128), timed in the same run",
    )
    _workload(cfg, rep, prioritized=True)


WORKLOADS = [bench_uniform, bench_prioritized]


def main(argv: list[str] | None = None) -> int:
    """Run every workload; ``--quick`` for a smoke run."""
    return timing_main("rbdata mixture benchmarks", WORKLOADS, argv)


if __name__ == "__main__":
    sys.exit(main())
