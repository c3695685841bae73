"""GPU benchmark of the prioritized sampler (issue 12): CUDA trees against floors in the same run.

Two cases, each on CUDA trees (``PrioritizedSampler(device="cuda")``), float32 priorities,
alpha=0.6, beta=0.4, every slot filled with a random priority:

- capacity 10M, batch 65,536 (throughput): ``sampler.draw`` (indices + weights) and
  ``update_priority`` (fresh random indices and priorities on the GPU, a pool cycled), each
  against its floor: ``torch.searchsorted`` on a precomputed CDF of the same size (plus the
  uniforms and the weights, the draw's whole output) and one ``index_put_`` of the leaves of
  a plain vector; then a full PER step: ``rb.sample`` (draw + gather of 65,536 rows of 32
  floats from a CUDA ``TensorStorage``) + ``rb.update_priority`` of the batch;
- capacity 1M, batch 256 (latency): the same rows.

Targets (H100-class GPU): ``sample`` and ``update_priority`` each <= 0.5 ms and <= 3x their
floor; the PER step <= 1.5 ms. ``(info)`` rows: the CPU (numba) sampler on the same sizes, and
the tree ops under ``torch.compile`` (the sampler keeps the plain torch ops unless a run shows
that compiling helps; ``--compile off`` skips these rows, ``--compile on`` adds them on CPU).

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
from rbdata.samplers import _torch_tree
from rbdata.samplers import prioritized as prioritized_module

ALPHA, BETA = 0.6, 0.4
#: (capacity, batch) of the two cases: on a GPU, and for the CPU smoke run
GPU_CASES = ((10_000_000, 65_536), (1_000_000, 256))
SMOKE_CASES = ((100_000, 4096), (10_000, 256))
ROW_FLOATS = 32  # floats per stored row in the PER step
SAMPLE_US, STEP_US, FLOOR_RATIO = 500.0, 1500.0, 3.0


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
def compiled_tree_ops() -> Iterator[None]:
    """The sampler's batched tree ops under ``torch.compile`` for the duration (then plain)."""
    draw, set_values = _torch_tree.draw, _torch_tree.set_values
    _torch_tree.draw = torch.compile(draw)  # type: ignore[assignment]
    _torch_tree.set_values = torch.compile(set_values)  # type: ignore[assignment]
    try:
        yield
    finally:
        _torch_tree.draw, _torch_tree.set_values = draw, set_values


def size(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


# --- one case -----------------------------------------------------------------------------------
def bench_case(
    n: int, bs: int, device: torch.device, cfg: Config, rep: Report, compile_rows: bool
) -> None:
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
    # the buffer: a CUDA TensorStorage of n rows of 32 floats, every slot filled
    storage = TensorStorage(n, device=device)
    chunk = 1_000_000
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        rows = torch.randn(stop - start, ROW_FLOATS, generator=g, device=device)
        storage.set(slice(start, stop), {"obs": rows})
    sampler = PrioritizedSampler(n, ALPHA, BETA)  # device=None: follows the storage
    rb = ReplayBuffer(storage, sampler)
    assert sampler.device.type == device.type and not sampler._fast
    priority = torch.rand(n, generator=g, device=device) + 0.01
    rb.update_priority(torch.arange(n, device=device), priority)
    pool = [
        (
            torch.randint(n, (bs,), generator=g, device=device),
            torch.rand(bs, generator=g, device=device) + 0.01,
        )
        for _ in range(pool_size)
    ]
    sampler.check_errors()

    # floors on plain tensors of the same size
    values = sampler.priority_values()
    cdf = values.double().cumsum(0)
    total, v_min = cdf[-1], values.min()
    leaves = values.clone()
    obs = storage.buffers[0]

    def floor_draw() -> tuple[torch.Tensor, torch.Tensor]:
        u = torch.rand(bs, generator=g, dtype=torch.float64, device=device).mul_(total)
        idx = torch.searchsorted(cdf, u, right=True).clamp_(max=n - 1)
        return idx, (values[idx].double() / v_min).pow_(-BETA).to(torch.float32)

    cycle = itertools.cycle(pool)

    def floor_update() -> None:
        idx, p = next(cycle)
        leaves.index_put_((idx,), p)

    def floor_step() -> None:
        idx, weight = floor_draw()
        rows = obs.index_select(0, idx)
        leaves.index_put_((idx,), rows[:, 0].abs() * weight)

    def update() -> None:
        rb.update_priority(*next(cycle))

    def step() -> None:
        batch = rb.sample(bs)
        rb.update_priority(batch["index"], batch["obs"][:, 0].abs() * batch["weight"])

    t = measure(
        clock,
        {
            "draw": lambda: sampler.draw(bs),
            "floor_draw": floor_draw,
            "update": update,
            "floor_update": floor_update,
            "step": step,
            "floor_step": floor_step,
        },
        cfg,
    )
    sampler.check_errors()
    rep.absolute("sampler.draw (indices + weights)", t["draw"], t["floor_draw"], SAMPLE_US)
    rep.ratio("  vs the searchsorted floor", t["draw"], t["floor_draw"], FLOOR_RATIO)
    rep.absolute("update_priority (fresh random batch)", t["update"], t["floor_update"], SAMPLE_US)
    rep.ratio("  vs the index_put_ floor", t["update"], t["floor_update"], FLOOR_RATIO)
    rep.absolute(
        f"PER step: sample + gather {ROW_FLOATS} floats + update",
        t["step"],
        t["floor_step"],
        STEP_US,
    )

    if compile_rows:
        plain = sampler.draw  # same generator state for both: compare the outputs once
        state = sampler.generator.get_state()
        want = plain(bs)
        with compiled_tree_ops():
            sampler.generator.set_state(state)
            got = sampler.draw(bs)
            same = torch.equal(want[0], got[0]) and torch.equal(want[1]["weight"], got[1]["weight"])
            tc = measure(clock, {"draw": lambda: sampler.draw(bs), "update": update}, cfg)
        sampler.check_errors()
        rep.info("(torch.compile) sampler.draw", tc["draw"], t["floor_draw"])
        rep.info("(torch.compile) update_priority", tc["update"], t["floor_update"])
        rep.note(f"torch.compile'd draw gives the plain path's indices and weights: {same}")

    # the CPU (numba) sampler on the same sizes, for comparison
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
    kind = "numba" if cpu._fast else "torch"
    rep.info(f"CPU ({kind}) sampler.draw, vs this draw", tcpu["draw"], t["draw"])
    rep.info(f"CPU ({kind}) update_priority, vs this update", tcpu["update"], t["update"])


def main(argv: list[str] | None = None) -> int:
    """Run both cases; exit 0 whatever the targets (1 only if a case raised)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats")
    parser.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="the torch.compile rows (auto: on a GPU only; compiling on CPU takes a minute)",
    )
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
    compile_rows = args.compile == "on" or (args.compile == "auto" and device.type == "cuda")
    for n, bs in cases:
        try:
            bench_case(n, bs, device, cfg, rep, compile_rows)
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
