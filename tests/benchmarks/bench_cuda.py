"""GPU benchmark of the prioritized sampler (issues 12, 23): CUDA trees against floors, same run.

Two cases, each on CUDA trees (``PrioritizedSampler`` following a CUDA ``TensorStorage``),
float32 priorities, alpha=0.6, beta=0.4, every slot filled with a random priority:

- capacity 10M, batch 65,536 (throughput): ``sampler.draw`` (indices + weights) and
  ``update_priority`` (fresh random indices and priorities on the GPU, a pool cycled), each
  against its floor: ``torch.searchsorted`` on a precomputed CDF of the same size (plus the
  uniforms and the weights, the draw's whole output) and one ``index_put_`` of the leaves of
  a plain vector; then a full PER step: ``rb.sample`` (draw + gather of 65,536 rows of 32
  floats from a CUDA ``TensorStorage``) + ``rb.update_priority`` of the batch;
- capacity 1M, batch 256 (latency): the same rows.

Targets (issue 23, H100/H200): 10M / 65,536: draw and update <= 80 us each, step <= 250 us;
1M / 256: draw and update <= 30 us each, step <= 100 us. The sampler runs the fused Triton
kernels where Triton is installed (``kernels`` in the header says which); ``(info)`` rows: the
torch reference kernels (``_DEVICE_KERNELS = "torch"``, the path before the fused kernels)
and the CPU (numba) sampler on the same sizes (the default placement follows the storage: the
device path should be at least as fast as the CPU one).

GPU times come from ``torch.cuda.Event`` pairs around a loop of calls (min over repeats, the
loop long enough to dominate launch jitter): a loop's time per call is what a training loop
sees, launch overhead included. Without CUDA the script says so and exits 0; ``--device cpu``
runs the same code (the sampler's device path, forced onto CPU trees) at small sizes as a
smoke run -- its numbers are not GPU figures.

Usage::

    .venv/bin/python tests/benchmarks/bench_cuda.py                 # on a GPU (make bench-cuda)
    .venv/bin/python tests/benchmarks/bench_cuda.py --quick         # fewer, shorter repeats
    .venv/bin/python tests/benchmarks/bench_cuda.py --device cpu    # smoke run without a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator

import numpy as np
import tensordict
import torch
from _timing import FULL, QUICK, Config, Report, free, summary

import rbdata
from rbdata import PrioritizedSampler, ReplayBuffer, TensorStorage
from rbdata.samplers import prioritized as prioritized_module

ALPHA, BETA = 0.6, 0.4
#: (capacity, batch) of the two cases: on a GPU, and for the CPU smoke run
GPU_CASES = ((10_000_000, 65_536), (1_000_000, 256))
SMOKE_CASES = ((100_000, 4096), (10_000, 256))
ROW_FLOATS = 32  # floats per stored row in the PER step
#: per case: draw, update and step targets in microseconds (issue 23)
TARGETS_US = {(10_000_000, 65_536): (80.0, 80.0, 250.0), (1_000_000, 256): (30.0, 30.0, 100.0)}


# --- timing -------------------------------------------------------------------------------------
class Clock:
    """Seconds per call of a loop: CUDA events on a GPU, ``perf_counter`` on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def loop(self, fn: Callable[[], object], number: int) -> float:
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(number):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / number
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number


def measure(clock: Clock, fns: dict[str, Callable[[], object]], cfg: Config) -> dict[str, float]:
    """Seconds per call of each function: min over repeats, the functions interleaved."""
    numbers = {}
    for name, fn in fns.items():
        for _ in range(cfg.warmup):
            fn()
        clock.sync()
        number = 1
        while clock.loop(fn, number) * number < cfg.min_time and number < 100_000:
            number *= 2
        numbers[name] = number
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(cfg.repeat):
        for name, fn in fns.items():
            clock.sync()
            best[name] = min(best[name], clock.loop(fn, numbers[name]))
    return best


@contextlib.contextmanager
def kernels(name: str | None) -> Iterator[None]:
    """Samplers built inside use the device trees' ``name`` kernels (``None``: the default)."""
    saved = prioritized_module._DEVICE_KERNELS
    prioritized_module._DEVICE_KERNELS = name
    try:
        yield
    finally:
        prioritized_module._DEVICE_KERNELS = saved


def size(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


# --- one case -----------------------------------------------------------------------------------
def timed_sampler(
    n: int,
    bs: int,
    storage: TensorStorage,
    priority: torch.Tensor,
    pool: list,
    clock: Clock,
    cfg: Config,
) -> tuple[dict[str, float], PrioritizedSampler]:
    """Draw, update and PER-step times of a sampler (built with the current kernels)."""
    sampler = PrioritizedSampler(n, ALPHA, BETA)  # device=None: follows the storage
    rb = ReplayBuffer(storage, sampler)
    rb.update_priority(torch.arange(n, device=priority.device), priority)
    sampler.check_errors()
    cycle = itertools.cycle(pool)

    def update() -> None:
        rb.update_priority(*next(cycle))

    def step() -> None:
        batch = rb.sample(bs)
        rb.update_priority(batch["index"], batch["obs"][:, 0].abs() * batch["weight"])

    t = measure(clock, {"draw": lambda: sampler.draw(bs), "update": update, "step": step}, cfg)
    sampler.check_errors()
    return t, sampler


def bench_case(n: int, bs: int, device: torch.device, cfg: Config, rep: Report) -> None:
    clock = Clock(device)
    pool_size = 8 if bs >= 65_536 else 256
    rep.section(
        f"PrioritizedSampler on {device.type}: capacity {size(n)}, batch {bs:,}, float32, "
        f"alpha={ALPHA}, beta={BETA}, random priorities; updates cycle a pool of "
        f"{pool_size} fresh random batches",
        f"draw: rand({bs}) * total, torch.searchsorted on a precomputed float64 CDF of {n:,} "
        "values, weights (v[idx] / v_min)**-beta; update: one index_put_ of the new values "
        f"into a plain vector of {n:,} leaves; step: the draw floor + index_select of "
        f"{bs:,} x {ROW_FLOATS} floats + the update floor",
    )
    g = torch.Generator(device=device).manual_seed(0)
    # the buffer: a TensorStorage of n rows of 32 floats on the device, every slot filled
    storage = TensorStorage(n, device=device)
    chunk = 1_000_000
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        rows = torch.randn(stop - start, ROW_FLOATS, generator=g, device=device)
        storage.set(slice(start, stop), {"obs": rows})
    priority = torch.rand(n, generator=g, device=device) + 0.01
    pool = [
        (
            torch.randint(n, (bs,), generator=g, device=device),
            torch.rand(bs, generator=g, device=device) + 0.01,
        )
        for _ in range(pool_size)
    ]
    t, sampler = timed_sampler(n, bs, storage, priority, pool, clock, cfg)
    kind = getattr(sampler._trees, "kernels", "numba")
    rep.note(f"kernels: {kind}")

    # floors on plain tensors of the same size
    values = sampler.priority_values()
    cdf = values.double().cumsum(0)
    total, v_min = cdf[-1], values.min()
    leaves = values.clone()
    obs = storage.buffers[0]
    cycle = itertools.cycle(pool)

    def floor_draw() -> tuple[torch.Tensor, torch.Tensor]:
        u = torch.rand(bs, generator=g, dtype=torch.float64, device=device).mul_(total)
        idx = torch.searchsorted(cdf, u, right=True).clamp_(max=n - 1)
        return idx, (values[idx].double() / v_min).pow_(-BETA).to(torch.float32)

    def floor_update() -> None:
        idx, p = next(cycle)
        leaves.index_put_((idx,), p)

    def floor_step() -> None:
        idx, weight = floor_draw()
        rows = obs.index_select(0, idx)
        leaves.index_put_((idx,), rows[:, 0].abs() * weight)

    f = measure(clock, {"draw": floor_draw, "update": floor_update, "step": floor_step}, cfg)
    draw_us, update_us, step_us = TARGETS_US.get((n, bs), (80.0, 80.0, 250.0))
    rep.absolute("sampler.draw (indices + weights)", t["draw"], f["draw"], draw_us)
    rep.absolute("update_priority (fresh random batch)", t["update"], f["update"], update_us)
    rep.absolute(
        f"PER step: sample + gather {ROW_FLOATS} floats + update", t["step"], f["step"], step_us
    )
    if kind == "triton":  # the torch reference kernels, the path before the fused ones
        del sampler
        with kernels("torch"):
            ref, _ = timed_sampler(n, bs, storage, priority, pool, clock, cfg)
        rep.info("(torch reference kernels) sampler.draw", ref["draw"], f["draw"])
        rep.info("(torch reference kernels) update_priority", ref["update"], f["update"])
        rep.info("(torch reference kernels) PER step", ref["step"], f["step"])

    # the CPU (numba) sampler on the same sizes: the placement a CPU storage gets
    forced = prioritized_module._DEVICE_PATH_ON_CPU  # (the smoke run forces the device path)
    prioritized_module._DEVICE_PATH_ON_CPU = False
    try:
        cpu = PrioritizedSampler(n, ALPHA, BETA, device="cpu", data_source=range(n))
    finally:
        prioritized_module._DEVICE_PATH_ON_CPU = forced
    cpu.update_priority(torch.arange(n), priority.cpu())
    cpu_pool = [(i.cpu(), p.cpu()) for i, p in pool]
    cpu_cycle = itertools.cycle(cpu_pool)
    cpu_clock = Clock(torch.device("cpu"))
    tcpu = measure(
        cpu_clock,
        {
            "draw": lambda: cpu.draw(bs),
            "update": lambda: cpu.update_priority(*next(cpu_cycle)),
        },
        cfg,
    )
    rep.info("CPU (numba) sampler.draw, vs this draw", tcpu["draw"], t["draw"])
    rep.info("CPU (numba) update_priority, vs this update", tcpu["update"], t["update"])
    rep.note("the device path is the faster placement where both CPU rows read >= 1.00x")


def main(argv: list[str] | None = None) -> int:
    """Run both cases; exit 0 whatever the targets (1 only if a case raised)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats")
    args = parser.parse_args(argv)
    title = "rbdata CUDA prioritized sampler benchmark"
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"{title}: CUDA is not available (torch {torch.__version__}); nothing timed. "
            "Run it on a GPU machine (make bench-cuda), or with --device cpu for a smoke run "
            "of the same code at small sizes (no GPU figures)."
        )
        return 0
    device = torch.device(args.device)
    cfg = QUICK if args.quick else FULL
    cases = GPU_CASES if device.type == "cuda" else SMOKE_CASES
    if device.type == "cpu":  # the code that runs on CUDA, on CPU trees
        prioritized_module._DEVICE_PATH_ON_CPU = True
        cfg = Config(repeat=3, min_time=0.02, warmup=2)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the CPU sampler rows: one thread, as bench_samplers.py
    print(title + (" (--quick)" if args.quick else ""))
    print(
        f"  rbdata {rbdata.__version__}, torch {torch.__version__}, tensordict "
        f"{tensordict.__version__}, numpy {np.__version__}; Python "
        f"{platform.python_version()}, {platform.machine()}"
    )
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        print(
            f"  GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA "
            f"{torch.version.cuda}; time per call = min over {cfg.repeat} repeats of a loop "
            f"of >= {cfg.min_time * 1e3:.0f} ms between two CUDA events"
        )
    else:
        print(
            "  SMOKE RUN on CPU (--device cpu): the sampler's device path on CPU trees at "
            "small sizes; the targets below are for a GPU and these are not GPU figures"
        )
    rep = Report()
    start = time.perf_counter()
    for n, bs in cases:
        try:
            bench_case(n, bs, device, cfg, rep)
        except Exception:
            rep.errors.append(f"{size(n)}/{bs}")
            print(f"  ERROR in the case {size(n)}/{bs}:")
            traceback.print_exc(file=sys.stdout)
        free()  # the case's buffers went with its frame
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return summary(rep, start)


if __name__ == "__main__":
    sys.exit(main())
