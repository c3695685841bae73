"""N-step returns benchmark: what ``NStepReturn`` adds to ``sample(256)`` at 1M steps.

The same buffer (1M transitions: observation 17 floats, action 6, reward, done, next
observation 17) is sampled with and without ``NStepReturn(storage, 3, 0.99)``, interleaved in
the same run; the target row is the difference, at most 30 us (1000-step episodes). Its floor
is the plain ``sample(256)``. The ``(info)`` rows are the same with 50-step episodes, a
``("next", "truncated")`` flag (a second episode index) and ``n=5``. ``--quick``: 100k steps.

Usage::

    .venv/bin/python tests/benchmarks/bench_nstep.py           # full run
    .venv/bin/python tests/benchmarks/bench_nstep.py --quick   # smoke run
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import _timing
import torch
from _timing import Config, Report, measure
from tensordict import TensorDict

from rbdata import ReplayBuffer, TensorStorage
from rbdata.transforms import NStepReturn

BATCH, CHUNK, TARGET_US = 256, 250_000, 30.0


def _chunk(n: int, ep_len: int, cuts: bool) -> TensorDict:
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[ep_len - 1 :: ep_len] = True
    nxt = {
        "observation": torch.randn(n, 17),
        "reward": torch.randn(n, 1),
        "done": done,
    }
    if cuts:  # every third episode end is a time limit
        truncated = torch.zeros(n, 1, dtype=torch.bool)
        truncated[3 * ep_len - 1 :: 3 * ep_len] = True
        nxt["truncated"] = truncated
    return TensorDict(
        {"observation": torch.randn(n, 17), "action": torch.randn(n, 6), "next": nxt},
        batch_size=[n],
    )


def bench_nstep(cfg: Config, rep: Report) -> None:
    size = 100_000 if cfg == _timing.QUICK else 1_000_000
    rep.section(
        f"NStepReturn: ReplayBuffer.sample({BATCH}) at N={size:,} (observation 17, action 6, "
        "reward, done, next observation 17)",
        f"the same rb.sample({BATCH}) without the transform (uniform sampler); "
        "'added' = with - without, ratio column = added / floor",
    )
    cases = [
        ("n=3, gamma=0.99, 1000-step episodes", 1000, False, 3, True),
        ("n=3, 50-step episodes, with truncated", 50, True, 3, False),
        ("n=5, 50-step episodes, with truncated", 50, True, 5, False),
    ]
    for label, ep_len, cuts, n, target in cases:
        storage = TensorStorage(size)
        plain = ReplayBuffer(storage)
        for _ in range(max(1, size // CHUNK)):
            plain.extend(_chunk(min(size, CHUNK), ep_len, cuts))
        nstep = ReplayBuffer(storage, transform=NStepReturn(storage, n, 0.99))
        nstep.sample(BATCH)  # indexes the episodes once (one read of the done column)
        t = measure(
            {
                "nstep": lambda rb=nstep: rb.sample(BATCH),
                "plain": lambda rb=plain: rb.sample(BATCH),
            },
            cfg,
        )
        rep.info(f"{label}: sample + n-step", t["nstep"], t["plain"])
        if target:
            rep.absolute(f"{label}: added", t["nstep"] - t["plain"], t["plain"], TARGET_US)
        else:
            rep.info(f"{label}: added", t["nstep"] - t["plain"], t["plain"])
        del storage, plain, nstep, t
        _timing.free()


WORKLOADS: list[Callable[[Config, Report], None]] = [bench_nstep]


def main(argv: list[str] | None = None) -> int:
    """Run the workload; ``--quick`` for a smoke run (100k steps)."""
    return _timing.main("rbdata n-step returns benchmark", WORKLOADS, argv)


if __name__ == "__main__":
    sys.exit(main())
