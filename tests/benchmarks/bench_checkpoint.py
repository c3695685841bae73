"""Checkpoint benchmarks: ``ReplayBuffer.dumps``/``loads`` against file-copy floors, same run.

The buffer holds the 1M TensorDict transitions of ``bench_foundation.py`` (workload 2) with a
``PrioritizedSampler``. ``dumps`` is timed against the floor of copying the same payload
bytes (``shutil.copytree`` of the buffer's ``MemmapStorage`` directory; numpy ``tofile`` of
the leaves of an in-memory ``TensorStorage``), ``loads`` against an absolute target (it maps
the files, it does not read them). Every call is timed once per repeat, the cases
interleaved; outputs are removed and ``os.sync()`` runs between calls, outside the timing,
so no call pays for another's writeback. The script reports and exits 0 whether targets pass
or fail; it exits 1 only if a workload raised.

Usage::

    .venv/bin/python tests/benchmarks/bench_checkpoint.py           # full run (about 25 s)
    .venv/bin/python tests/benchmarks/bench_checkpoint.py --quick   # smoke run, N=100k
"""

from __future__ import annotations

import gc
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _timing
import numpy as np
import torch
from _timing import Config, Report, fmt_time, free
from bench_foundation import transitions

from rbdata import MemmapStorage, PrioritizedSampler, ReplayBuffer, TensorStorage

FULL_N = 1_000_000
QUICK_N = 100_000
FILL = 100_000  # rows per extend when filling
BS = 256
UPDATES = 100_000  # priorities set to random values before dumping
DUMPS_TARGET = 1.5  # dumps / floor
LOADS_TARGET_S = 0.5  # ReplayBuffer.loads, seconds (absolute)


# --- helpers ----------------------------------------------------------------------------------
def _size(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def _n(cfg: Config) -> int:
    """The buffer size: ``QUICK_N`` under ``--quick``, else ``FULL_N``."""
    return QUICK_N if cfg == _timing.QUICK else FULL_N


def _time(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _repeats(cfg: Config) -> int:
    return cfg.repeat


def _tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in a nested state (dicts, lists, tuples)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _files(root: Path) -> Iterator[Path]:
    for dirpath, _, names in os.walk(root):
        for name in names:
            yield Path(dirpath) / name


def _disk_bytes(root: Path) -> tuple[int, int]:
    """(apparent size = sum of st_size, allocated = sum of st_blocks * 512) of a tree."""
    apparent = allocated = 0
    for file in _files(root):
        st = file.stat()
        apparent += st.st_size
        allocated += st.st_blocks * 512
    return apparent, allocated


def _fsync_path(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then every directory (as ``dumps`` does)."""
    for file in _files(root):
        _fsync_path(file)
    for dirpath, _, _ in os.walk(root):
        _fsync_path(Path(dirpath), os.O_RDONLY | os.O_DIRECTORY)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _peak_rss() -> str:
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"  # KiB on Linux


def measure_io(
    cases: dict[str, Callable[[Path], object]],
    root: Path,
    repeat: int,
    keep: tuple[str, ...] = (),
    warmup: int = 1,
) -> dict[str, float]:
    """Seconds per call of each case: min over ``repeat`` repeats of one timed call each.

    A case writes to the path it is given: a fresh one under ``root`` per call, removed
    after the call, or the same ``root / name`` every time for the names in ``keep`` (the
    output then replaces the previous one). After every call, outside the timing, the output
    is removed and ``os.sync()`` flushes dirty pages, so the next call pays for no other's
    writeback. The cases are timed in turn within each repeat (same machine conditions).
    """
    calls = 0

    def one(name: str, fn: Callable[[Path], object]) -> float:
        nonlocal calls
        calls += 1
        dest = root / (name if name in keep else f"{name}-{calls}")
        start = time.perf_counter()
        fn(dest)
        elapsed = time.perf_counter() - start
        if name not in keep:
            _remove(dest)
        os.sync()
        return elapsed

    for name, fn in cases.items():
        for _ in range(warmup):
            one(name, fn)
    best = dict.fromkeys(cases, float("inf"))
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            for name, fn in cases.items():
                best[name] = min(best[name], one(name, fn))
    finally:
        if enabled:
            gc.enable()
    return best


def absolute_s(rep: Report, label: str, t: float, floor: float, target_s: float) -> None:
    """A row whose target is an absolute time in seconds; ``floor`` is printed for scale."""
    verdict = rep.verdict(t <= target_s)
    print(
        f"  {label:<46} {fmt_time(t)} {fmt_time(floor)} {t / floor:6.2f}x  "
        f"{'<= ' + f'{target_s:g} s':>9}  {verdict}"
    )


def _buffer(storage: TensorStorage, n: int, data: Any, filled: int) -> ReplayBuffer:
    """A prioritized buffer over ``storage`` holding ``data[:filled]``, priorities updated."""
    rb = ReplayBuffer(storage=storage, sampler=PrioritizedSampler(n, 0.7, 0.5), batch_size=BS)
    for start in range(0, filled, FILL):
        rb.extend(data[start : min(filled, start + FILL)])
    g = torch.Generator().manual_seed(0)
    k = min(UPDATES, filled)
    rb.update_priority(torch.randint(filled, (k,), generator=g), torch.rand(k, generator=g))
    return rb


def _payload(rb: ReplayBuffer) -> tuple[int, int]:
    """(bytes of the filled rows of every leaf, bytes of the sampler state's tensors)."""
    n = len(rb)
    leaves = sum(b[:n].numel() * b.element_size() for b in rb.storage.buffers)
    return leaves, _tensor_bytes(rb.sampler.state_dict())


def _bytes_note(rep: Report, what: str, rb: ReplayBuffer, ckpt: Path) -> None:
    leaves, state = _payload(rb)
    raw = leaves + state
    apparent, allocated = _disk_bytes(ckpt)
    rep.note(
        f"bytes, {what}: raw payload {_mb(raw)} (leaf rows {_mb(leaves)} + sampler state "
        f"{_mb(state)}); checkpoint apparent {_mb(apparent)} ({apparent / raw:.2f}x raw), "
        f"allocated on disk {_mb(allocated)} ({allocated / raw:.2f}x raw)"
    )


# --- workloads --------------------------------------------------------------------------------
def bench_memmap(cfg: Config, rep: Report) -> None:
    n = _n(cfg)
    size = _size(n)
    repeat = _repeats(cfg)
    rep.section(
        f"1. rb.dumps / ReplayBuffer.loads: MemmapStorage, {size} TensorDict transitions "
        f"(obs 17, act 6, reward, done, next obs), PrioritizedSampler({size}, 0.7, 0.5), "
        f"{min(UPDATES, n) // 1000}k priorities updated; one call per repeat, min over "
        f"{repeat} repeats after 1 warm-up call, outputs removed + os.sync() between calls",
        "dumps: shutil.copytree of the buffer's MemmapStorage directory (the same leaf "
        "bytes, no fsync, no sampler state) to a fresh directory; loads: np.fromfile of the "
        "checkpoint's storage files (an eager read, page cache warm), for scale",
    )
    data = transitions(n)
    root = Path(tempfile.mkdtemp(prefix="rbdata-bench-ckpt-"))
    storage = MemmapStorage(n)
    try:
        rb = _buffer(storage, n, data, n)
        os.sync()  # the fill's dirty pages reach the disk before any timing
        src = storage.path

        def dumps(dest: Path) -> None:
            rb.dumps(dest)

        def dumps_nosync(dest: Path) -> None:
            rb.dumps(dest, fsync=False)

        def torch_save(dest: Path) -> None:
            torch.save(rb.state_dict(), dest)

        def copytree_fsync(dest: Path) -> None:
            shutil.copytree(src, dest)
            _fsync_tree(dest)

        t = measure_io(
            {
                "floor": lambda dest: shutil.copytree(src, dest),
                "dumps": dumps,
                "dumps_nosync": dumps_nosync,
                "dumps_same": dumps,
                "copytree_fsync": copytree_fsync,
                "torch_save": torch_save,
            },
            root,
            repeat,
            keep=("dumps_same",),
        )
        floor, synced = t["floor"], t["copytree_fsync"]
        rep.ratio(
            f"rb.dumps(new path, fsync=False), N={size}", t["dumps_nosync"], floor, DUMPS_TARGET
        )
        rep.info("copytree + fsync of every file and directory", synced, floor)
        rep.note("durable dumps (the default, fsync=True) against the durable copy:")
        rep.ratio(f"rb.dumps(new path), N={size}", t["dumps"], synced, DUMPS_TARGET)
        rep.ratio(
            "rb.dumps(same path): replaces the previous", t["dumps_same"], synced, DUMPS_TARGET
        )
        rep.info("  rb.dumps(new path) vs copytree (no fsync)", t["dumps"], floor)
        rep.info("torch.save(rb.state_dict()), no fsync vs copytree", t["torch_save"], floor)

        # --- bytes -------------------------------------------------------------------------
        ckpt = root / "dumps_same"
        _bytes_note(rep, f"full buffer ({size} of {size})", rb, ckpt)

        # --- loads -------------------------------------------------------------------------
        files = [f for f in _files(ckpt) if f.parent.name == "storage"]

        def eager() -> None:
            for f in files:
                np.fromfile(f, dtype=np.uint8)

        warm = min(
            _time(lambda: rb.sample(BS), 20)
            for _ in range(repeat)  # sample(256) on the dumped buffer, pages resident
        )
        best = {"loads": float("inf"), "sample": float("inf"), "eager": float("inf")}
        for i in range(repeat + 1):  # the first round is a warm-up
            start = time.perf_counter()
            loaded = ReplayBuffer.loads(ckpt)
            t_loads = time.perf_counter() - start
            start = time.perf_counter()
            loaded.sample(BS)
            t_sample = time.perf_counter() - start
            assert len(loaded) == n
            loaded.storage.close()
            del loaded
            t_eager = _time(eager, 1)
            if i:
                best["loads"] = min(best["loads"], t_loads)
                best["sample"] = min(best["sample"], t_sample)
                best["eager"] = min(best["eager"], t_eager)
        absolute_s(
            rep, f"ReplayBuffer.loads, N={size}", best["loads"], best["eager"], LOADS_TARGET_S
        )
        rep.info(f"  first sample({BS}) after loads vs warm sample", best["sample"], warm)
        rep.note(
            "loads and the eager read find the checkpoint in the page cache (no cold-cache "
            f"numbers: dropping caches needs root); the first sample faults in up to {BS} pages "
            "of each mapped leaf file"
        )

        # --- a half-full buffer: the leaf files have a sparse tail ---------------------------
        half = n // 2
        storage.close()
        storage = MemmapStorage(n)
        rb = _buffer(storage, n, data, half)
        ckpt_half = root / "half"
        rb.dumps(ckpt_half)
        _bytes_note(rep, f"half-full buffer ({_size(half)} of {size})", rb, ckpt_half)
        rep.note(f"peak RSS so far {_peak_rss()}")
    finally:
        storage.close()
        shutil.rmtree(root, ignore_errors=True)
    free()


def bench_tensor(cfg: Config, rep: Report) -> None:
    n = _n(cfg)
    size = _size(n)
    repeat = _repeats(cfg)
    rep.section(
        f"2. rb.dumps: TensorStorage (in memory), the same {size} transitions and sampler; "
        f"one call per repeat, min over {repeat} repeats after 1 warm-up call",
        "numpy tofile of each leaf tensor (the same leaf bytes, no fsync, no sampler state) "
        "into a fresh directory",
    )
    data = transitions(n)
    root = Path(tempfile.mkdtemp(prefix="rbdata-bench-ckpt-"))
    try:
        rb = _buffer(TensorStorage(n), n, data, n)
        del data  # the storage holds its own copy
        arrays = [b.numpy() for b in rb.storage.buffers]

        def tofile(dest: Path, sync: bool = False) -> None:
            dest.mkdir()
            for i, a in enumerate(arrays):
                a.tofile(dest / f"{i:03d}.bin")
            if sync:
                _fsync_tree(dest)

        t = measure_io(
            {
                "floor": tofile,
                "dumps": lambda dest: rb.dumps(dest),
                "dumps_nosync": lambda dest: rb.dumps(dest, fsync=False),
                "tofile_fsync": lambda dest: tofile(dest, sync=True),
            },
            root,
            repeat,
        )
        floor, synced = t["floor"], t["tofile_fsync"]
        rep.ratio(
            f"rb.dumps(new path, fsync=False), N={size}", t["dumps_nosync"], floor, DUMPS_TARGET
        )
        rep.info("tofile + fsync of every file and directory", synced, floor)
        rep.ratio(
            f"rb.dumps(new path) vs tofile + fsync, N={size}", t["dumps"], synced, DUMPS_TARGET
        )
        rep.note(f"peak RSS so far {_peak_rss()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    free()


WORKLOADS: list[Callable[[Config, Report], None]] = [bench_memmap, bench_tensor]


def main(argv: list[str] | None = None) -> int:
    """Run every workload; ``--quick`` for a smoke run (N=100k)."""
    return _timing.main(
        "rbdata checkpoint benchmarks",
        WORKLOADS,
        argv,
        quick_help=f"N={_size(QUICK_N)} instead of {_size(FULL_N)}, fewer repeats (smoke run)",
    )


if __name__ == "__main__":
    sys.exit(main())
