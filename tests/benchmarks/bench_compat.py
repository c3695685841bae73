"""``rbdata.compat.sb3`` against Stable-Baselines3's ``ReplayBuffer``, measured in the same run.

Workload 1 is the issue's figure: a CleanRL-style DQN data path on CartPole (one ``add`` per
environment step, one ``sample(128)`` every 10 steps: 200k adds and 20k samples), run once
with SB3's buffer and once with the compat buffer, interleaved and repeated; the ratio
compat / SB3 of the total time is compared with the target (<= 1.0x). Workload 2 breaks it
down per call and adds a 4-env Box case, the memmap storage and the prioritized variant as
``(info)`` rows. The script reports and exits 0 whether targets pass or fail; it exits 1
only if a workload raised.

Usage::

    .venv/bin/python tests/benchmarks/bench_compat.py           # full run (about 1 minute)
    .venv/bin/python tests/benchmarks/bench_compat.py --quick   # smoke run (seconds)
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from typing import Any

import _timing
import numpy as np
from _timing import QUICK, Config, Report, free, measure

from rbdata.compat import sb3 as compat

try:
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
except ImportError:  # `pip install 'rbdata[bench]'`
    spaces = None
    SB3ReplayBuffer = None

CARTPOLE = ((4,), 2)  # observation shape, number of discrete actions


def _spaces(obs_shape: tuple[int, ...], actions: int | tuple[int, ...]) -> tuple[Any, Any]:
    obs = spaces.Box(-np.inf, np.inf, obs_shape, dtype=np.float32)
    if isinstance(actions, int):
        return obs, spaces.Discrete(actions)
    return obs, spaces.Box(-1.0, 1.0, actions, dtype=np.float32)


def _steps(n: int, n_envs: int, obs_shape: tuple[int, ...], act: Any) -> list[tuple[Any, ...]]:
    """``n`` distinct pre-built steps (the env's cost is not timed), cycled by the loops."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        obs = rng.standard_normal((n_envs, *obs_shape)).astype(np.float32)
        nxt = rng.standard_normal((n_envs, *obs_shape)).astype(np.float32)
        if isinstance(act, int):
            action = rng.integers(act, size=n_envs)
        else:
            action = rng.uniform(-1, 1, (n_envs, *act)).astype(np.float32)
        reward = rng.standard_normal(n_envs).astype(np.float32)
        done = rng.random(n_envs) < 0.05
        out.append((obs, nxt, action, reward, done, [{} for _ in range(n_envs)]))
    return out


def _dqn_loop(rb: Any, steps: list[tuple[Any, ...]], n_add: int, every: int, batch: int) -> float:
    """Seconds for ``n_add`` adds with one ``sample(batch)`` every ``every`` adds."""
    k = len(steps)
    start = time.perf_counter()
    for t in range(n_add):
        rb.add(*steps[t % k])
        if t % every == 0:
            rb.sample(batch)
    return time.perf_counter() - start


def bench_dqn_loop(cfg: Config, rep: Report) -> None:
    quick = cfg is QUICK
    n_add, every, batch = (20_000, 10, 128) if quick else (200_000, 10, 128)
    repeats = 1 if quick else 3
    rep.section(
        f"1. CleanRL DQN data path, CartPole: {n_add // 1000}k add + {n_add // every // 1000}k "
        f"sample({batch}), n_envs=1, handle_timeout_termination=False (total time)",
        "stable-baselines3 ReplayBuffer, same calls (the ref column is SB3)",
    )
    obs_space, act_space = _spaces(*CARTPOLE)
    steps = _steps(1000, 1, CARTPOLE[0], CARTPOLE[1])
    makers: dict[str, Callable[[], Any]] = {
        "sb3": lambda: SB3ReplayBuffer(
            n_add, obs_space, act_space, "cpu", handle_timeout_termination=False
        ),
        "tensor": lambda: compat.ReplayBuffer(
            n_add, obs_space, act_space, "cpu", handle_timeout_termination=False
        ),
        "memmap": lambda: compat.ReplayBuffer(
            n_add, obs_space, act_space, "cpu", handle_timeout_termination=False, storage="memmap"
        ),
    }
    best = dict.fromkeys(makers, float("inf"))
    for _ in range(repeats):  # interleaved: every buffer sees the same machine conditions
        for name, make in makers.items():
            rb = make()
            best[name] = min(best[name], _dqn_loop(rb, steps, n_add, every, batch))
            getattr(rb, "close", lambda: None)()
            del rb
            free()
    rep.ratio("compat ReplayBuffer (TensorStorage) vs SB3", best["tensor"], best["sb3"], 1.0)
    rep.info("compat ReplayBuffer (MemmapStorage) vs SB3", best["memmap"], best["sb3"])


def bench_per_call(cfg: Config, rep: Report) -> None:
    rep.section(
        "2. per call, 10k transitions in a 100k buffer (time per call; PER: the prioritized "
        "variant, alpha 0.6, beta 0.4)",
        "stable-baselines3 ReplayBuffer, same call (the ref column is SB3)",
    )
    cases = [
        ("CartPole, 1 env", CARTPOLE, 1),
        ("Box(17) obs, Box(6) act, 4 envs", ((17,), (6,)), 4),
    ]
    for label, (obs_shape, act), n_envs in cases:
        obs_space, act_space = _spaces(obs_shape, act)
        steps = _steps(256, n_envs, obs_shape, act)
        args = (100_000, obs_space, act_space, "cpu", n_envs, False, False)
        ours, theirs = compat.ReplayBuffer(*args), SB3ReplayBuffer(*args)
        per = compat.PrioritizedReplayBuffer(*args)
        per.warn_after_samples = None  # timed samples with no update, on purpose: no warning
        for rb in (ours, theirs, per):
            for t in range(10_000 // n_envs):
                rb.add(*steps[t % len(steps)])
        feed = itertools.cycle(steps)

        t = measure(
            {
                "ours_add": lambda rb=ours, feed=feed: rb.add(*next(feed)),
                "sb3_add": lambda rb=theirs, feed=feed: rb.add(*next(feed)),
                "per_add": lambda rb=per, feed=feed: rb.add(*next(feed)),
                "ours_sample": lambda rb=ours: rb.sample(128),
                "sb3_sample": lambda rb=theirs: rb.sample(128),
                "per_sample": lambda rb=per: rb.sample(128),
            },
            cfg,
        )
        rep.info(f"{label}: add", t["ours_add"], t["sb3_add"])
        rep.info(f"{label}: sample(128)", t["ours_sample"], t["sb3_sample"])
        rep.info(f"{label}: PER add", t["per_add"], t["sb3_add"])
        rep.info(f"{label}: PER sample(128)", t["per_sample"], t["sb3_sample"])
        del ours, theirs, per
        free()
    rep.note("SB3 sample: numpy fancy indexing, then a th.tensor copy per field; compat sample:")
    rep.note("one index_select per stored field into fresh tensors, no numpy round trip")


WORKLOADS: list[Callable[[Config, Report], None]] = [bench_dqn_loop, bench_per_call]


def main(argv: list[str] | None = None) -> int:
    """Run every workload; ``--quick`` for a smoke run."""
    if SB3ReplayBuffer is None:
        print("stable-baselines3 and gymnasium are needed: pip install 'rbdata[bench]'")
        return 0
    return _timing.main("rbdata.compat.sb3 benchmarks (vs stable-baselines3)", WORKLOADS, argv)


if __name__ == "__main__":
    sys.exit(main())
