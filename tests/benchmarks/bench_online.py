"""Online-RL hot path: one ``add`` per environment step, against SB3's ``add`` in the same run.

An agent writes one transition per step, as numpy arrays and Python numbers (what a
gymnasium env returns). Workloads:

1. ``rb.add(transition)`` of a CartPole transition (5 leaves: observation float32 [4],
   action int64, reward float32, done bool, next observation float32 [4]) given as a nested
   dict of numpy values and Python numbers, and as a TensorDict item, on TensorStorage and
   MemmapStorage with a RoundRobinWriter, on a full ring of 100k (every add overwrites);
   stable-baselines3's ``ReplayBuffer.add`` of the same transition and a numpy floor (five
   row assignments at a wrapping cursor) timed in the same run. Target: <= 5 us.
2. the cost of an extra leaf: the same item with 5 more leaves. Target: <= 1 us per leaf.
3. ``extend`` of small batches (1, 4, 8 items, dict of numpy): target <= 10 us.
4. ``add`` with a PrioritizedSampler / SliceSampler (their ``on_write``): target within
   ~2 us of the uniform buffer.

Run: ``python tests/benchmarks/bench_online.py [--quick]`` (part of ``make bench``).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _timing import Config, Report, measure
from _timing import main as timing_main
from tensordict import TensorDict

from rbdata import ReplayBuffer
from rbdata.samplers import PrioritizedSampler, SliceSampler
from rbdata.storages import MemmapStorage, Storage, TensorStorage

try:
    import gymnasium as gym
    from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer
except ImportError:  # pragma: no cover - the bench extra installs them
    SB3Buffer = None

CAP = 100_000
OBS = 4
ADD_TARGET_US = 5.0
LEAF_TARGET_US = 1.0
EXTEND_TARGET_US = 10.0
ON_WRITE_TARGET_US = 2.0


def transition(k: int, extra: int = 0) -> dict[str, Any]:
    """A CartPole step as gymnasium gives it (plus ``extra`` more leaves)."""
    obs = np.full(OBS, k % 97, dtype=np.float32)
    item: dict[str, Any] = {
        "observation": obs,
        "action": np.int64(k % 2),
        "next": {"reward": 1.0, "done": False, "observation": obs + 1},
    }
    for i in range(extra):
        item[f"extra{i}"] = np.float32(i) if i % 2 else np.zeros(2, dtype=np.float32)
    return item


def as_tensordict(item: dict[str, Any]) -> TensorDict:
    def leaf(v: Any) -> torch.Tensor:
        if isinstance(v, np.ndarray):
            return torch.from_numpy(v)
        if isinstance(v, float):
            return torch.tensor(v, dtype=torch.float32)
        return torch.tensor(v)

    def tree(d: dict[str, Any]) -> dict[str, Any]:
        return {k: tree(v) if isinstance(v, dict) else leaf(v) for k, v in d.items()}

    return TensorDict(tree(item), [])


class NumpyFloor:
    """Row assignments into one preallocated numpy array per leaf, at a wrapping cursor."""

    def __init__(self, item: dict[str, Any]) -> None:
        self.values: list[Any] = []

        def walk(d: dict[str, Any]) -> None:
            for v in d.values():
                if isinstance(v, dict):
                    walk(v)
                else:
                    self.values.append(v)

        walk(item)
        self.arrays = [
            np.zeros((CAP, *np.shape(v)), dtype=np.asarray(v).dtype) for v in self.values
        ]
        self.cursor = 0

    def add(self) -> None:
        c = self.cursor
        for arr, v in zip(self.arrays, self.values, strict=True):
            arr[c] = v
        self.cursor = c + 1 if c + 1 < CAP else 0


def filled(make: Callable[[], Storage], item: Any, sampler: Any = None) -> ReplayBuffer:
    rb = ReplayBuffer(make(), sampler) if sampler is not None else ReplayBuffer(make())
    rb.add(item)
    batch = {}

    def stack(d: dict[str, Any], out: dict[str, Any]) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                out[k] = {}
                stack(v, out[k])
            else:
                out[k] = np.repeat(np.asarray(v)[None], CAP - 1, axis=0)

    stack(item if isinstance(item, dict) else item.to_dict(), batch)
    rb.extend(batch)  # full: every timed add overwrites a live item (memmap: journaled)
    return rb


def storages(tmp: Path) -> list[tuple[str, Callable[[], Storage]]]:
    counter = iter(range(1_000_000))
    return [
        ("TensorStorage", lambda: TensorStorage(CAP)),
        ("MemmapStorage", lambda: MemmapStorage(CAP, path=tmp / f"m{next(counter)}")),
    ]


def sb3_add() -> Callable[[], None] | None:
    if SB3Buffer is None:
        return None
    buf = SB3Buffer(
        CAP,
        gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32),
        gym.spaces.Discrete(2),
        device="cpu",
        handle_timeout_termination=False,
    )
    obs = np.zeros((1, OBS), dtype=np.float32)
    action, reward, done = np.array([[1]]), np.array([1.0]), np.array([False])
    infos: list[dict[str, Any]] = [{}]
    return lambda: buf.add(obs, obs, action, reward, done, infos)


def bench_add(cfg: Config, rep: Report) -> None:
    rep.section(
        f"1. rb.add(one CartPole transition), full ring of {CAP // 1000}k, 5 leaves "
        "(absolute time per call; ratio to the floor)",
        "numpy: five row assignments into preallocated arrays at a wrapping cursor",
    )
    item = transition(3)
    floor = NumpyFloor(item)
    peer = sb3_add()
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in storages(Path(tmp)):
            rb_np = filled(make, item)
            rb_td = filled(make, as_tensordict(item))
            td = as_tensordict(item)
            fns: dict[str, Callable[[], object]] = {
                "dict": lambda rb=rb_np: rb.add(item),
                "td": lambda rb=rb_td, td=td: rb.add(td),
                "floor": floor.add,
            }
            if peer is not None:
                fns["sb3"] = peer
            t = measure(fns, cfg)
            rep.absolute(f"{name}, dict of numpy + Python numbers", t["dict"], t["floor"], 5.0)
            rep.absolute(f"{name}, TensorDict item", t["td"], t["floor"], 5.0)
            if peer is not None:
                rep.info(f"  {name} dict item / SB3 add", t["dict"], t["sb3"])
        if peer is not None:
            t = measure({"sb3": peer, "floor": floor.add}, cfg)
            rep.peer("stable-baselines3 ReplayBuffer.add", t["sb3"], t["floor"])


def bench_extra_leaves(cfg: Config, rep: Report) -> None:
    rep.section(
        "2. cost of an extra leaf: the transition with 5 more leaves (scalars and [2] arrays)",
        "the same add with 5 leaves; (t10 - t5) / 5 per extra leaf",
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in storages(Path(tmp)):
            five, ten = transition(3), transition(3, extra=5)
            rb5, rb10 = filled(make, five), filled(make, ten)
            t = measure(
                {
                    "5": lambda rb=rb5, x=five: rb.add(x),
                    "10": lambda rb=rb10, x=ten: rb.add(x),
                },
                cfg,
            )
            per_leaf = (t["10"] - t["5"]) / 5
            rep.absolute(f"{name}, per extra leaf", per_leaf, t["5"], LEAF_TARGET_US)


def bench_extend_small(cfg: Config, rep: Report) -> None:
    rep.section(
        "3. rb.extend(small batch) of dict-of-numpy transitions, full ring",
        "numpy: one slice assignment per leaf at a wrapping cursor",
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in storages(Path(tmp)):
            rb = filled(make, transition(3))
            for n in (1, 4, 8):
                batch = {
                    "observation": np.zeros((n, OBS), np.float32),
                    "action": np.zeros(n, np.int64),
                    "next": {
                        "reward": np.ones(n, np.float32),
                        "done": np.zeros(n, bool),
                        "observation": np.zeros((n, OBS), np.float32),
                    },
                }
                arrays = [np.zeros((CAP, *v.shape[1:]), v.dtype) for v in _leaves(batch)]
                values = _leaves(batch)
                cursor = [0]

                def floor(
                    arrays: list[np.ndarray] = arrays,
                    values: list[Any] = values,
                    cursor: list[int] = cursor,
                ) -> None:
                    c = cursor[0]
                    for arr, v in zip(arrays, values, strict=True):
                        arr[c : c + len(v)] = v
                    cursor[0] = (c + 8) % (CAP - 8)

                t = measure({"rb": lambda rb=rb, b=batch: rb.extend(b), "floor": floor}, cfg)
                rep.absolute(f"{name}, extend({n})", t["rb"], t["floor"], EXTEND_TARGET_US)


def _leaves(d: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for v in d.values():
        out.extend(_leaves(v) if isinstance(v, dict) else [v])
    return out


def bench_on_write(cfg: Config, rep: Report) -> None:
    rep.section(
        "4. rb.add with a sampler that tracks writes (on_write), TensorStorage, full ring",
        "the same add with the uniform sampler; difference in us",
    )
    item = transition(3)
    uniform = filled(lambda: TensorStorage(CAP), item)
    prioritized = filled(lambda: TensorStorage(CAP), item, PrioritizedSampler(CAP, 0.6, 0.4))
    sliced = filled(lambda: TensorStorage(CAP), item, SliceSampler(num_slices=4))
    t = measure(
        {
            "uniform": lambda: uniform.add(item),
            "prioritized": lambda: prioritized.add(item),
            "slice": lambda: sliced.add(item),
        },
        cfg,
    )
    for name in ("prioritized", "slice"):
        extra = t[name] - t["uniform"]
        rep.absolute(f"{name} on_write: extra per add", extra, t["uniform"], ON_WRITE_TARGET_US)


WORKLOADS = [bench_add, bench_extra_leaves, bench_extend_small, bench_on_write]


def main(argv: list[str] | None = None) -> int:
    """Run every workload; ``--quick`` for a smoke run."""
    return timing_main("rbdata online (per-step) benchmarks", WORKLOADS, argv)


if __name__ == "__main__":
    sys.exit(main())
