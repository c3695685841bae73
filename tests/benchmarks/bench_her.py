"""Hindsight relabeling benchmark: what ``HindsightRelabel`` adds to ``sample(256)`` at 1M steps.

The same buffer (1M goal-conditioned steps in 1000-step episodes, Fetch-like 3-float goals) is
sampled with and without the transform, interleaved in the same run; the row's target is the
difference, at most 30 us. Its floor is the plain ``sample(256)``. The target is for the
relabeling itself: its row's ``reward_fn`` returns zeros (the transform still blends them
with the stored rewards). The rows with gymnasium-robotics' Fetch reward in torch (a norm and
a threshold: the user's cost, ~15 us here) are reported beside it.

Usage::

    .venv/bin/python tests/benchmarks/bench_her.py           # full run
    .venv/bin/python tests/benchmarks/bench_her.py --quick   # smoke run
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import _timing
import torch
from _timing import Config, Report, measure
from tensordict import TensorDict

from rbdata import HindsightRelabel, ReplayBuffer, TensorStorage

N, EP_LEN, BATCH, CHUNK, TARGET_US = 1_000_000, 1000, 256, 250_000, 30.0


def fetch_reward(achieved: torch.Tensor, desired: torch.Tensor, info: Any) -> torch.Tensor:
    return -(torch.linalg.vector_norm(achieved - desired, dim=-1) > 0.05).float()


def zero_reward(achieved: torch.Tensor, desired: torch.Tensor, info: Any) -> torch.Tensor:
    return torch.zeros(achieved.shape[0])


def _chunk(n: int) -> TensorDict:
    goal = {"achieved_goal": torch.randn(n, 3), "desired_goal": torch.randn(n, 3)}
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[EP_LEN - 1 :: EP_LEN] = True
    return TensorDict(
        {
            "observation": {"observation": torch.randn(n, 10), **goal},
            "action": torch.randn(n, 4),
            "next": {
                "observation": {"observation": torch.randn(n, 10), **goal},
                "reward": torch.zeros(n, 1),
                "done": done,
            },
        },
        batch_size=[n],
    )


def bench_her(cfg: Config, rep: Report) -> None:
    storage = TensorStorage(N)
    plain = ReplayBuffer(storage)
    for _ in range(N // CHUNK):
        plain.extend(_chunk(CHUNK))
    rep.section(
        f"HindsightRelabel: ReplayBuffer.sample({BATCH}) at N={N // 1_000_000}M "
        f"({EP_LEN}-step episodes, 3-float goals, her_ratio=0.8)",
        f"the same rb.sample({BATCH}) without the transform (uniform sampler); "
        "'added' = with - without, ratio column = added / floor",
    )
    for strategy in ("future", "final", "episode", "ogbench"):
        buffers = {}
        for name, reward_fn in (("fetch", fetch_reward), ("zeros", zero_reward)):
            her = HindsightRelabel(
                storage,
                strategy=strategy,
                her_ratio=0.8,
                reward_fn=reward_fn,
                generator=torch.Generator().manual_seed(0),
            )
            buffers[name] = ReplayBuffer(storage, transform=her)
            buffers[name].sample(BATCH)  # indexes the episodes once (one read of the done column)
        t = measure(
            {
                "fetch": lambda rb=buffers["fetch"]: rb.sample(BATCH),
                "zeros": lambda rb=buffers["zeros"]: rb.sample(BATCH),
                "plain": lambda: plain.sample(BATCH),
            },
            cfg,
        )
        rep.info(f"{strategy}: sample + relabel (Fetch reward_fn)", t["fetch"], t["plain"])
        rep.info(
            f"{strategy}: added, Fetch reward_fn included", t["fetch"] - t["plain"], t["plain"]
        )
        rep.absolute(
            f"{strategy}: added by relabeling (zeros reward_fn)",
            t["zeros"] - t["plain"],
            t["plain"],
            TARGET_US,
        )


WORKLOADS: list[Callable[[Config, Report], None]] = [bench_her]


def main(argv: list[str] | None = None) -> int:
    """Run the workload; ``--quick`` for a smoke run."""
    return _timing.main("rbdata hindsight relabeling benchmark", WORKLOADS, argv)


if __name__ == "__main__":
    sys.exit(main())
