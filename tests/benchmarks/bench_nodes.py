"""Pipeline benchmark: a training loop fed by ``rbdata.nodes.BufferSource``, prefetched or not.

The training-loop stand-in draws one batch of 256 transitions (observation 17, action 6,
reward, done, next observation) from a 1M-transition ``MemmapStorage`` buffer and spends
~200 us of "compute" on it: a float32 matmul sized at start-up to take ~200 us (like a real
step, it releases the GIL, so a background thread can draw the next batches meanwhile). Each
row is a time per training step; the floor is the compute alone, timed in the same run:

- direct: ``rb.sample()`` then compute (the sampling cost is paid in the step);
- pipeline: ``next(iter(Loader(Prefetcher(BufferSource(rb), 4))))`` then compute (the
  sampling runs in the prefetch thread; the step pays the hand-over only).

The prefetch hides the sampling cost when the pipeline's ratio stays near 1. Prioritized
steps also update the priorities of the batch (through ``BufferSource.update_priority`` in
the pipeline). With CUDA, the same with ``PinMemory`` and a non-blocking copy to the GPU;
without it the rows are skipped. The script reports and exits 0 whether targets pass or fail;
it exits 1 only if a workload raised.

Usage::

    .venv/bin/python tests/benchmarks/bench_nodes.py           # full run (under a minute)
    .venv/bin/python tests/benchmarks/bench_nodes.py --quick   # smoke run
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import _timing
import torch
from _timing import Config, Report, fmt_time, free, measure
from bench_foundation import transitions
from tensordict import TensorDict
from torchdata.nodes import Loader, ParallelMapper, PinMemory, Prefetcher

from rbdata import MemmapStorage, PrioritizedSampler, ReplayBuffer, UniformSampler
from rbdata.nodes import BufferSource

N, BATCH, CHUNK, PREFETCH = 1_000_000, 256, 100_000, 4
COMPUTE_US = 200.0
#: pipeline step / compute alone: what is left of the sampling cost once prefetched
TARGET = 1.2


# --- the training-loop stand-ins ----------------------------------------------------------
class MatmulCompute:
    """CPU-bound: a float32 matmul ``(BATCH, h) @ (h, h)``, ``h`` chosen to take ~200 us.

    It releases the GIL but keeps a core busy: the prefetch thread needs a second free core.
    """

    summary = "CPU-bound: the prefetch thread needs a second free core"

    def __init__(self, cfg: Config) -> None:
        g = torch.Generator().manual_seed(0)
        best: tuple[float, int] = (float("inf"), 0)
        for h in range(32, 1025, 16):
            self._setup(h, g)
            t = measure({"mm": self.step_alone}, CALIBRATION)["mm"]
            best = min(best, (abs(t - COMPUTE_US * 1e-6), h))
            if t > 2 * COMPUTE_US * 1e-6:
                break
        self.h = best[1]
        self._setup(self.h, g)
        self.seconds = measure({"mm": self.step_alone}, cfg)["mm"]
        self.label = f"matmul ({BATCH}, {self.h}) @ ({self.h}, {self.h}) float32"

    def _setup(self, h: int, g: torch.Generator) -> None:
        self.x = torch.randn(BATCH, h, generator=g)
        self.w = torch.randn(h, h, generator=g) / h**0.5
        self.out = torch.empty(BATCH, h)

    def __call__(self, batch: TensorDict) -> torch.Tensor:
        """The step on ``batch`` (its observations feed the input); a TD error per item."""
        self.x[:, :17].copy_(batch["observation"])
        return torch.mm(self.x, self.w, out=self.out)[:, 0].abs()

    def step_alone(self) -> torch.Tensor:
        return torch.mm(self.x, self.w, out=self.out)


class WaitCompute:
    """GPU-like: the CPU waits ~200 us (``time.sleep``, calibrated), as for a GPU step.

    It releases the GIL and the core: the prefetch thread needs no second free core.
    """

    summary = "the CPU waits, as for a GPU step: no second core needed"

    def __init__(self, cfg: Config) -> None:
        best: tuple[float, float] = (float("inf"), 0.0)
        for us in range(0, int(COMPUTE_US) + 1, 10):
            self.delay = us * 1e-6
            t = measure({"wait": self.step_alone}, CALIBRATION)["wait"]
            best = min(best, (abs(t - COMPUTE_US * 1e-6), self.delay))
            if t > COMPUTE_US * 1e-6:
                break
        self.delay = best[1]
        self.seconds = measure({"wait": self.step_alone}, cfg)["wait"]
        self.label = f"time.sleep({self.delay * 1e6:.0f} us)"

    def __call__(self, batch: TensorDict) -> torch.Tensor:
        time.sleep(self.delay)
        return batch["observation"][:, 0].abs()

    def step_alone(self) -> None:
        time.sleep(self.delay)


Compute = MatmulCompute | WaitCompute
CALIBRATION = Config(repeat=5, min_time=0.01, warmup=5)


def _filled_buffer(sampler: Any) -> tuple[ReplayBuffer, MemmapStorage]:
    storage = MemmapStorage(N)  # a temporary directory, removed by close()
    rb = ReplayBuffer(storage, sampler=sampler, batch_size=BATCH)
    for _ in range(0, N, CHUNK):
        rb.extend(transitions(CHUNK))
    return rb, storage


def _normalize(batch: TensorDict) -> TensorDict:
    """A light transform for the ParallelMapper row."""
    batch["observation"] = (batch["observation"] - 0.5) * 2.0
    return batch


# --- workloads ------------------------------------------------------------------------------
def _rows(
    rep: Report,
    cfg: Config,
    compute: Compute,
    fns: dict[str, Callable[[], object]],
    labels: dict[str, str],
) -> None:
    """Time ``fns`` with the compute alone (the floor); the ``"pipeline"`` row has the target."""
    rep.note(f"-- compute: {compute.label}")
    t = measure({"compute": compute.step_alone, **fns}, cfg)
    floor = t["compute"]
    for name, label in labels.items():
        if name == "pipeline":
            rep.ratio(label, t[name], floor, TARGET)
        else:
            rep.info(label, t[name], floor)
    direct, pipeline = t["direct"], t["pipeline"]
    sampling = max(direct - floor, 1e-12)
    hidden = (direct - pipeline) / sampling
    rep.note(
        f"   sampling costs {fmt_time(sampling).strip()} per step directly; the prefetching "
        f"pipeline hides {100 * hidden:.0f}% of it (step speed-up {direct / pipeline:.2f}x)"
    )


def _step(compute: Compute, next_batch: Callable[[], Any], update: Any = None) -> Any:
    def step() -> Any:
        batch = next_batch()
        td_error = compute(batch)
        if update is not None:
            update(batch["index"], td_error)
        return td_error

    return step


def _pipeline(node: Any) -> Iterator[Any]:
    return iter(Loader(node))


def bench_uniform(cfg: Config, rep: Report, computes: list[Compute]) -> None:
    rep.section(
        f"1. UniformSampler, MemmapStorage N=1M transitions, batch {BATCH}",
        "the step's compute alone, no sampling",
    )
    rb, storage = _filled_buffer(UniformSampler(generator=torch.Generator().manual_seed(0)))
    try:
        for compute in computes:
            prefetched = _pipeline(Prefetcher(BufferSource(rb), PREFETCH))
            handover = _pipeline(Prefetcher(BufferSource(rb), PREFETCH))
            mapped = _pipeline(
                Prefetcher(ParallelMapper(BufferSource(rb), _normalize, num_workers=2), PREFETCH)
            )
            fns: dict[str, Callable[[], object]] = {
                "sample": rb.sample,
                "handover": handover.__next__,
                "direct": _step(compute, rb.sample),
                "pipeline": _step(compute, prefetched.__next__),
                "direct+transform": _step(compute, lambda: _normalize(rb.sample())),
                "mapped": _step(compute, mapped.__next__),
            }
            labels = {
                "sample": f"rb.sample({BATCH}) alone",
                "handover": f"next(Prefetcher(BufferSource, {PREFETCH})) alone",
                "direct": "step: rb.sample() + compute",
                "pipeline": f"step: Prefetcher(BufferSource, {PREFETCH}) + compute",
                "direct+transform": "step: transform(rb.sample()) + compute",
                "mapped": "step: Prefetcher(ParallelMapper(2 threads))..",
            }
            _rows(rep, cfg, compute, fns, labels)
            del prefetched, handover, mapped
            free()
    finally:
        storage.close()


def bench_prioritized(cfg: Config, rep: Report, computes: list[Compute]) -> None:
    rep.section(
        f"2. PrioritizedSampler(alpha=0.6, beta=0.4), MemmapStorage N=1M, batch {BATCH}, "
        "update_priority(index, td_error) every step",
        "the step's compute alone, no sampling or update",
    )
    sampler = PrioritizedSampler(N, 0.6, 0.4, generator=torch.Generator().manual_seed(0))
    rb, storage = _filled_buffer(sampler)
    try:
        rb.update_priority(torch.arange(N), torch.rand(N))
        for compute in computes:
            source = BufferSource(rb)
            prefetched = _pipeline(Prefetcher(source, PREFETCH))
            fns: dict[str, Callable[[], object]] = {
                "sample": rb.sample,
                "direct": _step(compute, rb.sample, rb.update_priority),
                "pipeline": _step(compute, prefetched.__next__, source.update_priority),
            }
            labels = {
                "sample": f"rb.sample({BATCH}) alone",
                "direct": "step: rb.sample() + compute + update",
                "pipeline": f"step: Prefetcher(BufferSource, {PREFETCH}) + .. + update",
            }
            _rows(rep, cfg, compute, fns, labels)
            del prefetched
            free()
    finally:
        storage.close()


def bench_pin_memory(cfg: Config, rep: Report, computes: list[Compute]) -> None:
    rep.section(
        f"3. pin_memory: UniformSampler, MemmapStorage N=1M, batch {BATCH}, and a "
        "non-blocking copy of each batch to the GPU during the compute",
        "the step's compute alone, no sampling or copy",
    )
    if not torch.cuda.is_available():
        rep.note("skipped: no CUDA device (PinMemory needs one)")
        return
    rb, storage = _filled_buffer(UniformSampler(generator=torch.Generator().manual_seed(0)))

    def sample_to_gpu() -> object:
        out = rb.sample().to("cuda", non_blocking=True)
        torch.cuda.current_stream().synchronize()
        return out

    try:
        for compute in computes:
            pinned = _pipeline(Prefetcher(PinMemory(BufferSource(rb)), PREFETCH))

            def gpu_step(
                next_batch: Callable[[], TensorDict], compute: Compute = compute
            ) -> Callable[[], object]:
                def step() -> object:
                    batch = next_batch()
                    on_gpu = batch.to("cuda", non_blocking=True)  # async only if pinned
                    out = compute(batch)
                    torch.cuda.current_stream().synchronize()
                    return on_gpu, out

                return step

            fns: dict[str, Callable[[], object]] = {
                "sample": sample_to_gpu,
                "direct": gpu_step(rb.sample),
                "pipeline": gpu_step(pinned.__next__),
            }
            labels = {
                "sample": "rb.sample() + copy to the GPU alone",
                "direct": "step: rb.sample() + copy + compute",
                "pipeline": f"step: Prefetcher(PinMemory(..), {PREFETCH}) + ..",
            }
            _rows(rep, cfg, compute, fns, labels)
            del pinned
            free()
    finally:
        storage.close()


def main(argv: list[str] | None = None) -> int:
    """Run every workload; ``--quick`` for a smoke run."""
    computes: list[Compute] = []

    def calibrate(cfg: Config, rep: Report) -> None:
        start = time.perf_counter()
        computes[:] = [MatmulCompute(cfg), WaitCompute(cfg)]
        print(
            f"\ncompute stand-ins (asked {COMPUTE_US:.0f} us per step; calibrated in "
            f"{time.perf_counter() - start:.1f} s):"
        )
        for c in computes:
            rep.note(f"{c.label:<46} {fmt_time(c.seconds)} per step  ({c.summary})")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        rep.note(
            f"load average {load:.1f} on {os.cpu_count()} CPUs: with the matmul, the prefetch "
            "thread needs a second free core"
        )

    def bind(
        fn: Callable[[Config, Report, list[Compute]], None],
    ) -> Callable[[Config, Report], None]:
        def workload(cfg: Config, rep: Report) -> None:
            fn(cfg, rep, computes)

        workload.__name__ = fn.__name__
        return workload

    workloads = [
        calibrate,
        *(bind(f) for f in (bench_uniform, bench_prioritized, bench_pin_memory)),
    ]
    return _timing.main("rbdata torchdata.nodes pipeline benchmark", workloads, argv)


if __name__ == "__main__":
    sys.exit(main())
