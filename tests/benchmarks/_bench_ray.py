"""Ray workload of the distributed benchmark: ``RayReplayBuffer`` vs local and a plain actor.

Not a script: ``bench_distributed.py`` imports :func:`bench_ray` (run it alone with
``python -c "import sys; sys.path.insert(0, 'tests/benchmarks'); import _timing, _bench_ray;
_timing.run('ray', [_bench_ray.bench_ray], _timing.QUICK, True)"``).

Floor: a plain Ray actor holding preallocated numpy arrays (one per field) that writes a batch
with slice copies and answers ``sample(n)`` with one fancy-index gather per field: the least a
Ray round trip can cost for the same bytes. The local buffer is printed for scale (Ray adds
a round trip through another process and the object store).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from _timing import Config, Report, measure
from bench_foundation import leaves, transitions
from tensordict import TensorDict

from rbdata import PrioritizedSampler, ReplayBuffer, TensorStorage

CAPACITY = 100_000
OBS, ACT = 17, 6  # the shapes of bench_foundation.transitions


class NumpyActor:
    """The floor: a ring of numpy arrays in an actor (no validation, no TensorDict)."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.cursor, self.size = capacity, 0, 0
        self.arrays: list[np.ndarray] | None = None
        self.rng = np.random.default_rng(0)

    def extend(self, leaves: list[np.ndarray]) -> int:
        n = len(leaves[0])
        if self.arrays is None:
            self.arrays = [np.empty((self.capacity, *a.shape[1:]), a.dtype) for a in leaves]
        end = self.cursor + n  # benchmark batches never wrap mid-batch (capacity % n == 0)
        for buf, a in zip(self.arrays, leaves, strict=True):
            buf[self.cursor : end] = a
        self.cursor = end % self.capacity
        self.size = min(self.size + n, self.capacity)
        return self.cursor

    def sample(self, n: int) -> list[np.ndarray]:
        assert self.arrays is not None
        idx = self.rng.integers(self.size, size=n)
        return [buf[idx] for buf in self.arrays]


def _leaves(td: TensorDict) -> list[np.ndarray]:
    return [t.numpy() for t in leaves(td)]


def bench_ray(cfg: Config, rep: Report) -> None:
    """Ray ``sample(256)`` latency and ``extend(1000)`` throughput, 1 and 2 shards."""
    try:
        import ray
    except ImportError:
        rep.section("Ray: RayReplayBuffer", "(skipped)")
        rep.note("ray not installed: pip install 'rbdata[ray]'")
        return
    from rbdata.distributed import RayReplayBuffer

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        _run(cfg, rep, ray, RayReplayBuffer)
    finally:
        if started:
            ray.shutdown()


def _run(cfg: Config, rep: Report, ray: Any, RayReplayBuffer: Any) -> None:
    fill, ext, bs = 20_000, 1000, 256
    data = transitions(ext)
    leaves = _leaves(data)
    floor = ray.remote(NumpyActor).remote(CAPACITY)
    local = ReplayBuffer(TensorStorage(CAPACITY))
    one = RayReplayBuffer(TensorStorage(CAPACITY))
    two = RayReplayBuffer(TensorStorage(CAPACITY), num_shards=2)
    per = RayReplayBuffer(
        TensorStorage(CAPACITY), PrioritizedSampler(CAPACITY, 0.6, 0.4), num_shards=2
    )
    for _ in range(fill // ext):
        ray.get(floor.extend.remote(leaves))
        local.extend(data)
        for rb in (one, two, per):
            rb.extend(data)

    rep.section(
        f"Ray: sample({bs}) round trip, {fill} transitions of 5 fields (obs {OBS}, act {ACT})",
        "plain Ray actor with numpy arrays: rng.integers + one gather per field",
    )
    t = measure(
        {
            "floor": lambda: ray.get(floor.sample.remote(bs)),
            "one": lambda: one.sample(bs),
            "two": lambda: two.sample(bs),
            "per": lambda: per.sample(bs),
            "local": lambda: local.sample(bs),
        },
        cfg,
    )
    rep.ratio("RayReplayBuffer sample, 1 shard", t["one"], t["floor"], 1.5)
    rep.ratio("RayReplayBuffer sample, 2 shards (2 round trips)", t["two"], t["floor"], 3.0)
    rep.info("  prioritized, 2 shards (global weights)", t["per"], t["floor"])
    rep.info("local ReplayBuffer.sample (no Ray)", t["local"], t["floor"])

    rep.section(
        f"Ray: extend({ext}) round trip (returns when written)",
        "plain Ray actor with numpy arrays: slice copies into preallocated arrays",
    )
    t = measure(
        {
            "floor": lambda: ray.get(floor.extend.remote(leaves)),
            "one": lambda: one.extend(data),
            "two": lambda: two.extend(data),
            "local": lambda: local.extend(data),
        },
        cfg,
    )
    rep.ratio("RayReplayBuffer extend, 1 shard", t["one"], t["floor"], 1.5)
    rep.ratio("RayReplayBuffer extend, 2 shards", t["two"], t["floor"], 1.5)
    rep.info("local ReplayBuffer.extend (no Ray)", t["local"], t["floor"])
    rep.note(
        f"throughput: Ray {ext / t['one']:,.0f} items/s, floor {ext / t['floor']:,.0f} "
        f"items/s, local {ext / t['local']:,.0f} items/s"
    )

    # pipelined writes: a collector that does not wait for each batch
    def pipelined() -> None:
        ray.get([two.extend_async(data) for _ in range(8)])

    def pipelined_floor() -> None:
        ray.get([floor.extend.remote(leaves) for _ in range(8)])

    t = measure({"floor": pipelined_floor, "two": pipelined}, cfg)
    rep.info("extend_async x8, 2 shards, one ray.get", t["two"] / 8, t["floor"] / 8)
    for rb in (one, two, per):
        rb.close()
    ray.kill(floor)
