"""Timing and reporting shared by the benchmark scripts (not a benchmark itself).

``measure`` times several functions interleaved (min over repeats of a timed loop);
``Report`` prints aligned rows and counts PASS/FAIL; ``run`` prints the header, runs the
workloads (a workload that raises is reported and the others still run) and the summary.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import os
import platform
import sys
import time
import timeit
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tensordict
import torch

import rbdata


# --- timing -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """How hard to time: repeats per function, minimum seconds per repeat, warm-up calls."""

    repeat: int
    min_time: float
    warmup: int


FULL = Config(repeat=7, min_time=0.1, warmup=20)
QUICK = Config(repeat=5, min_time=0.02, warmup=5)


def _calibrate(timer: timeit.Timer, min_time: float) -> int:
    """Smallest ``number`` in 1, 2, 5, 10, 20, ... whose loop takes at least ``min_time``."""
    number = 1
    while True:
        for step in (1, 2, 5):
            n = number * step
            if timer.timeit(n) >= min_time:
                return n
        number *= 10


def measure(fns: dict[str, Callable[[], object]], cfg: Config) -> dict[str, float]:
    """Seconds per call of each function: min over ``cfg.repeat`` repeats of a timed loop.

    The functions are warmed up, calibrated, then timed in turn within each repeat, so that
    rbdata and its floor see the same machine conditions.
    """
    timers: dict[str, tuple[timeit.Timer, int]] = {}
    for name, fn in fns.items():
        for _ in range(cfg.warmup):
            fn()
        timer = timeit.Timer(fn)
        timers[name] = (timer, _calibrate(timer, cfg.min_time))
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(cfg.repeat):
        for name, (timer, number) in timers.items():
            best[name] = min(best[name], timer.timeit(number) / number)
    return best


def free() -> None:
    """Collect garbage (between workloads, after dropping big buffers)."""
    gc.collect()


# --- reporting --------------------------------------------------------------------------------
def fmt_time(seconds: float) -> str:
    """A time as ``'12.34 us'`` or ``'1.234 ms'``, 11 characters wide."""
    us = seconds * 1e6
    if us < 1000:
        return f"{us:8.2f} us"
    return f"{us / 1000:8.3f} ms"


class Report:
    """Prints aligned rows and counts PASS/FAIL."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0
        self.errors: list[str] = []

    @staticmethod
    def columns(ref: str = "floor") -> None:
        """Print the column header; ``ref`` names the reference column (floor or a peer)."""
        print(f"  {'':<46} {'rbdata':>11} {ref:>11} {'ratio':>7}  {'target':>9}  result")

    def section(self, title: str, floor: str) -> None:
        print(f"\n{title}")
        print(f"  floor: {floor}")
        self.columns()

    def verdict(self, ok: bool) -> str:
        """Count a target as passed or failed; return ``PASS`` or ``FAIL``."""
        if ok:
            self.passed += 1
            return "PASS"
        self.failed += 1
        return "FAIL"

    def ratio(
        self, label: str, t: float, floor: float, target: float, strict: bool = False
    ) -> None:
        """A row whose target is ``t / floor <= target`` (``<`` when ``strict``)."""
        r = t / floor
        verdict = self.verdict(r < target if strict else r <= target)
        op = "< " if strict else "<= "
        print(
            f"  {label:<46} {fmt_time(t)} {fmt_time(floor)} {r:6.2f}x  "
            f"{op + f'{target:.1f}x':>9}  {verdict}"
        )

    def absolute(self, label: str, t: float, floor: float, target_us: float) -> None:
        """A row whose target is an absolute time; ``floor`` is printed for scale."""
        verdict = self.verdict(t * 1e6 <= target_us)
        print(
            f"  {label:<46} {fmt_time(t)} {fmt_time(floor)} {t / floor:6.2f}x  "
            f"{'<= ' + f'{target_us:.0f} us':>9}  {verdict}"
        )

    def peer(self, label: str, t: float, floor: float | None = None) -> None:
        floor_s = fmt_time(floor) if floor is not None else f"{'':>11}"
        ratio_s = f"{t / floor:6.2f}x" if floor is not None else f"{'':>7}"
        print(f"  {label:<46} {fmt_time(t)} {floor_s} {ratio_s}  {'(peer)':>9}")

    def info(self, label: str, t: float, floor: float) -> None:
        print(f"  {label:<46} {fmt_time(t)} {fmt_time(floor)} {t / floor:6.2f}x  {'(info)':>9}")

    def value(self, label: str, value: float, target: float, text: str = "") -> None:
        """A row of a dimensionless number (e.g. a ratio of ratios) against ``<= target``."""
        verdict = self.verdict(value <= target)
        print(f"  {label:<46} {text:>23} {value:6.2f}x  {'<= ' + f'{target:.2f}x':>9}  {verdict}")

    def note(self, text: str) -> None:
        print(f"  {text}")


# --- running ----------------------------------------------------------------------------------
def version(dist: str) -> str:
    """The installed version of distribution ``dist``, or ``'not installed'``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run(
    title: str,
    workloads: Sequence[Callable[[Config, Report], None]],
    cfg: Config,
    quick: bool,
) -> int:
    """Print the header, run ``workloads``, print the summary; exit status 1 only on errors."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(title + (" (--quick)" if quick else ""))
    print(
        f"  rbdata {rbdata.__version__}, torch {torch.__version__}, tensordict "
        f"{tensordict.__version__}, numpy {np.__version__}, cpprb {version('cpprb')}"
    )
    print(
        f"  Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
        f"torch.set_num_threads(1) for stable numbers"
    )
    print(
        f"  time per call = min over {cfg.repeat} repeats of a timed loop of >= "
        f"{cfg.min_time * 1e3:.0f} ms (after {cfg.warmup} warm-up calls); rbdata and its "
        "floor interleaved in the same run; ratio = rbdata / floor"
    )
    rep = Report()
    start = time.perf_counter()
    for workload in workloads:
        try:
            workload(cfg, rep)
        except Exception:
            rep.errors.append(workload.__name__)
            print(f"  ERROR in {workload.__name__}:")
            traceback.print_exc(file=sys.stdout)
        free()
    return summary(rep, start)


def summary(rep: Report, start: float) -> int:
    """Print a run's PASS/FAIL/ERROR counts and time since ``start``; the exit status."""
    elapsed = time.perf_counter() - start
    print(
        f"\nsummary: {rep.passed} PASS, {rep.failed} FAIL"
        + (f", {len(rep.errors)} ERROR ({', '.join(rep.errors)})" if rep.errors else "")
        + f" in {elapsed:.1f} s (targets are reported, not enforced)"
    )
    return 1 if rep.errors else 0


def main(
    title: str,
    workloads: Sequence[Callable[[Config, Report], None]],
    argv: list[str] | None,
    quick_help: str = "fewer, shorter repeats (smoke run)",
) -> int:
    """The command line of a benchmark script: ``--quick`` picks the short configuration."""
    parser = argparse.ArgumentParser(description=title)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    args = parser.parse_args(argv)
    return run(title, workloads, QUICK if args.quick else FULL, args.quick)
