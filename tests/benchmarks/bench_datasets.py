"""Offline-dataset benchmarks: D4RL conversion, its memory, reopen and DataLoader, same run.

A D4RL-layout HDF5 file (halfcheetah shapes, 1M rows, 310 MB; ``--quick``: 100k rows) is
generated in a temporary directory, then:

1. ``convert_d4rl(file, out, "memmap")`` is timed against the floor of reading every dataset
   whole with h5py and ``np.save``-ing it (outputs removed and ``os.sync()`` between calls);
2. the peak resident memory of the conversion above its baseline is measured in a fresh
   child process (the high-water mark reset after the imports), against an absolute target;
3. ``OfflineDataset.open`` of a complete cache entry is timed (absolute target);
4. one epoch of ``DataLoader(ds, batch_size=256, shuffle=True)`` over the cache is timed
   against the plain-tensor DataLoader floor of ``bench_foundation.py`` (workload 3).

The script reports and exits 0 whether targets pass or fail; it exits 1 only if a workload
raised.

Usage::

    .venv/bin/python tests/benchmarks/bench_datasets.py           # full run, 1M rows
    .venv/bin/python tests/benchmarks/bench_datasets.py --quick   # smoke run, 100k rows
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _timing
import h5py
import numpy as np
import torch
from _timing import Config, Report, fmt_time, free, measure
from bench_checkpoint import absolute_s, measure_io
from bench_foundation import PlainBatches
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from rbdata import MemmapStorage
from rbdata.datasets._cache import STORAGE_DIR, build_entry
from rbdata.datasets.base import OfflineDataset
from rbdata.datasets.d4rl import convert_d4rl

FULL_N = 1_000_000
QUICK_N = 100_000
OBS, ACT, QPOS, QVEL = 17, 6, 9, 9  # halfcheetah
EPISODE = 1000  # steps per episode: a timeout every 1000 rows unless it terminated earlier
BS = 256
GEN_ROWS = 100_000  # rows per write while generating the file (bounded generator memory)
CONVERT_TARGET = 2.0  # convert_d4rl / floor
RSS_TARGET_MB = 100.0  # peak RSS of the conversion above the baseline
OPEN_TARGET_S = 0.2  # OfflineDataset.open
LOADER_TARGET = 1.3  # DataLoader epoch / plain-tensor floor
CASES = ("memmap", "arrow", "floor")  # conversions whose peak memory is measured

_ROOT: Path | None = None  # one temporary directory for the whole run (the file is reused)
_FILE: Path | None = None


# --- helpers ----------------------------------------------------------------------------------
def _size(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def _n(cfg: Config) -> int:
    """The rows of the file: ``QUICK_N`` under ``--quick``, else ``FULL_N``."""
    return QUICK_N if cfg == _timing.QUICK else FULL_N


def _repeats(cfg: Config) -> int:
    """Timed calls per case of the I/O workloads (each call writes hundreds of MB)."""
    return 2 if cfg == _timing.QUICK else 3


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def _tree_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def _fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then every directory."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for dirpath, _, _ in os.walk(root):
        fd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _root() -> Path:
    global _ROOT
    if _ROOT is None:
        _ROOT = Path(tempfile.mkdtemp(prefix="rbdata-bench-datasets-"))
        atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)
    return _ROOT


def write_file(path: Path, n: int, seed: int = 0) -> None:
    """A D4RL-layout HDF5 file of ``n`` rows with halfcheetah shapes and random data.

    float32 observations, actions, rewards and next observations; bool terminals (0.1% of the
    rows) and timeouts (every ``EPISODE``-th row since the last episode end); float64
    ``infos/qpos`` and ``infos/qvel`` as in the real files; a few ``metadata/*`` entries.
    Contiguous (unchunked, uncompressed) datasets, written ``GEN_ROWS`` rows at a time.
    """
    rng = np.random.default_rng(seed)
    terminals = rng.random(n) < 0.001
    timeouts = np.zeros(n, bool)
    since = 0
    for t in [*np.flatnonzero(terminals).tolist(), n]:
        timeouts[np.arange(since + EPISODE - 1, t, EPISODE)] = True  # full-length episodes
        since = t + 1
    specs: dict[str, tuple[tuple[int, ...], Any]] = {
        "observations": ((OBS,), np.float32),
        "actions": ((ACT,), np.float32),
        "next_observations": ((OBS,), np.float32),
        "rewards": ((), np.float32),
        "infos/qpos": ((QPOS,), np.float64),
        "infos/qvel": ((QVEL,), np.float64),
    }
    with h5py.File(path, "w") as f:
        out = {
            name: f.create_dataset(name, (n, *shape), dtype)
            for name, (shape, dtype) in specs.items()
        }
        for start in range(0, n, GEN_ROWS):
            stop = min(n, start + GEN_ROWS)
            for name, (shape, dtype) in specs.items():
                out[name][start:stop] = rng.standard_normal((stop - start, *shape), dtype=dtype)
        f.create_dataset("terminals", data=terminals)
        f.create_dataset("timeouts", data=timeouts)
        f["metadata/algorithm"] = np.bytes_("SAC")
        f["metadata/iteration"] = np.int64(1_000_000)
        f["metadata/policy/nonlinearity"] = np.bytes_("relu")
        f["metadata/policy/fc0/weight"] = rng.standard_normal((256, OBS)).astype(np.float32)


def _file(cfg: Config) -> Path:
    """The generated file (made once per run)."""
    global _FILE
    if _FILE is None:
        path = _root() / "halfcheetah-bench.hdf5"
        start = time.perf_counter()
        write_file(path, _n(cfg))
        os.sync()
        _FILE = path
        print(
            f"\n(generated {path.name}: {_size(_n(cfg))} rows, {_mb(path.stat().st_size)}, "
            f"in {time.perf_counter() - start:.1f} s)"
        )
    return _FILE


def floor_copy(file: Path, out: Path) -> None:
    """The conversion floor: every dataset read whole with h5py, ``np.save``-d to ``out``."""
    out.mkdir()
    with h5py.File(file, "r") as h5:
        names: list[str] = []
        h5.visititems(
            lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None
        )
        for name in names:
            np.save(out / (name.replace("/", "_") + ".npy"), h5[name][()])


def build(file: Path, entry: Path, backend: str) -> None:
    """A complete cache entry at ``entry``: the D4RL machinery without the download."""

    def fill(tmp: Path) -> dict[str, Any]:
        info = convert_d4rl(file, tmp / STORAGE_DIR, backend, progress=False)
        return {"family": "d4rl", "id": "bench", "backend": backend, **info}

    build_entry(entry, fill)


def _identity(batch: Any) -> Any:
    return batch


# --- child processes (fresh interpreters) -----------------------------------------------------
_CHILD_RSS = r"""
import json, shutil, sys, time
from pathlib import Path
import h5py, numpy as np, torch
sys.path.insert(0, sys.argv[2])
from bench_datasets import floor_copy
from rbdata.datasets.d4rl import convert_d4rl

torch.set_num_threads(1)

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # kB
    raise KeyError(field)

def reset_peak():  # the high-water mark back to the current RSS (Linux >= 4.0)
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False

file, out, what = Path(sys.argv[1]), Path(sys.argv[3]), sys.argv[4]
reset = reset_peak()
base_rss, base_hwm = status("VmRSS"), status("VmHWM")
start = time.perf_counter()
if what == "floor":
    floor_copy(file, out)
else:
    convert_d4rl(file, out, what, progress=False)
elapsed = time.perf_counter() - start
peak = status("VmHWM")
shutil.rmtree(out)
print(json.dumps({"what": what, "reset": reset, "base_rss": base_rss, "base_hwm": base_hwm,
                  "peak": peak, "seconds": elapsed}))
"""

_CHILD_OPEN = r"""
import json, sys, time
import torch
from rbdata.datasets.base import OfflineDataset

torch.set_num_threads(1)
start = time.perf_counter()
ds = OfflineDataset.open(sys.argv[1])
opened = time.perf_counter() - start
idx = torch.randint(len(ds), (256,), generator=torch.Generator().manual_seed(0)).tolist()
start = time.perf_counter()
ds.__getitems__(idx)
first = time.perf_counter() - start
start = time.perf_counter()
ds.__getitems__(idx)
second = time.perf_counter() - start
ds.close()
print(json.dumps({"open": opened, "first": first, "second": second}))
"""


def _child(script: str, *args: str) -> list[dict[str, Any]]:
    """Run ``script`` in a fresh interpreter; it prints one JSON object per line."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child process failed ({proc.returncode}):\n{proc.stderr}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _rss_row(rep: Report, label: str, res: dict[str, Any], target_mb: float | None) -> None:
    extra = (res["peak"] - res["base_rss"]) / 1e6
    text = f"{extra:8.1f} MB (peak {res['peak'] / 1e6:.0f} MB, base {res['base_rss'] / 1e6:.0f} MB)"
    if target_mb is None:
        print(f"  {label:<46} {text:>42}  {'(info)':>9}")
        return
    verdict = rep.verdict(extra <= target_mb)
    print(f"  {label:<46} {text:>42}  {'<= ' + f'{target_mb:.0f} MB':>9}  {verdict}")


# --- workloads --------------------------------------------------------------------------------
def bench_convert(cfg: Config, rep: Report) -> None:
    file = _file(cfg)
    n, repeat = _n(cfg), _repeats(cfg)
    size = _size(n)
    rep.section(
        f"1. convert_d4rl(file, out, backend, progress=False): {size}-row D4RL-layout file "
        f"(halfcheetah shapes: obs {OBS}, action {ACT}, next obs, reward, terminals, timeouts, "
        f"infos/qpos {QPOS} and infos/qvel {QVEL} float64); one call per repeat, min over "
        f"{repeat} repeats after 1 warm-up call, cases interleaved, outputs removed + "
        "os.sync() between calls; the HDF5 file is in the page cache for every case",
        "h5py reads every dataset whole into numpy, np.save of each to a .npy file in a fresh "
        "directory (no fsync); convert_d4rl fsyncs its files (atomic, durable)",
    )
    nbytes = file.stat().st_size
    out = Path(tempfile.mkdtemp(prefix="convert-", dir=_root()))

    def floor_sync(dest: Path) -> None:
        floor_copy(file, dest)
        _fsync_tree(dest)

    try:
        t = measure_io(
            {
                "floor": lambda dest: floor_copy(file, dest),
                "memmap": lambda dest: convert_d4rl(file, dest, "memmap", progress=False),
                "floor_sync": floor_sync,
                "arrow": lambda dest: convert_d4rl(file, dest, "arrow", progress=False),
            },
            out,
            repeat,
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)
    floor = t["floor"]
    rep.ratio(f"convert_d4rl(memmap), {size} rows", t["memmap"], floor, CONVERT_TARGET)
    rep.info("  floor + fsync of every file and directory", t["floor_sync"], floor)
    rep.info("  convert_d4rl(memmap) vs floor + fsync", t["memmap"], t["floor_sync"])
    rep.info(f"convert_d4rl(arrow), {size} rows", t["arrow"], floor)
    rep.note(
        f"throughput (HDF5 file bytes {_mb(nbytes)} / s): memmap "
        f"{nbytes / 1e6 / t['memmap']:.0f} MB/s, arrow {nbytes / 1e6 / t['arrow']:.0f} MB/s, "
        f"floor {nbytes / 1e6 / floor:.0f} MB/s, floor + fsync "
        f"{nbytes / 1e6 / t['floor_sync']:.0f} MB/s"
    )
    free()


def bench_memory(cfg: Config, rep: Report) -> None:
    file = _file(cfg)
    n = _n(cfg)
    size = _size(n)
    print(
        f"\n2. peak resident memory of a conversion of the {size}-row file, each case in a "
        "fresh child process: peak VmHWM minus VmRSS after the imports (the high-water mark "
        "reset there via /proc/self/clear_refs)"
    )
    print(f"  target: extra <= {RSS_TARGET_MB:.0f} MB, whatever the file's size")
    here = str(Path(__file__).resolve().parent)
    results = {}
    for what in CASES:  # a fresh process each: no heap left over from another case
        out = _root() / f"rss-{what}"
        (results[what],) = _child(_CHILD_RSS, str(file), here, str(out), what)
    if not results["memmap"]["reset"]:
        rep.note("(/proc/self/clear_refs not writable: baseline = VmHWM after the imports)")
        for res in results.values():
            res["base_rss"] = res["base_hwm"]
    _rss_row(rep, f"convert_d4rl(memmap), {size} rows", results["memmap"], RSS_TARGET_MB)
    _rss_row(rep, f"convert_d4rl(arrow), {size} rows", results["arrow"], None)
    _rss_row(rep, "floor: h5py whole-dataset reads + np.save", results["floor"], None)
    with h5py.File(file, "r") as h5:
        sizes: list[int] = []
        h5.visititems(lambda _, obj: sizes.append(obj.nbytes) if hasattr(obj, "nbytes") else None)
    rep.note(
        f"HDF5 file {_mb(file.stat().st_size)}; the floor holds one whole dataset at a time "
        f"(largest {_mb(max(sizes))}): its peak grows with the file, the conversion's does not"
    )
    free()


def bench_open(cfg: Config, rep: Report) -> None:
    file = _file(cfg)
    n, repeat = _n(cfg), max(cfg.repeat, 5)
    size = _size(n)
    rep.section(
        f"3. OfflineDataset.open(entry) of a complete memmap cache entry, {size} transitions; "
        f"min over {repeat} opens (page cache warm), and once in a fresh child process",
        "np.fromfile of the storage's files (an eager read of every byte, page cache warm), "
        "for scale",
    )
    entry = _root() / "entry-memmap"
    if not entry.exists():
        build(file, entry, "memmap")
    files = [f for f in (entry / STORAGE_DIR).iterdir() if f.suffix == ".bin"]

    def eager() -> None:
        for f in files:
            np.fromfile(f, dtype=np.uint8)

    best = {"open": float("inf"), "eager": float("inf")}
    for _ in range(repeat + 1):  # the first round warms up
        start = time.perf_counter()
        ds = OfflineDataset.open(entry)
        t_open = time.perf_counter() - start
        assert len(ds) == n
        ds.close()
        del ds
        start = time.perf_counter()
        eager()
        best["open"] = min(best["open"], t_open)
        best["eager"] = min(best["eager"], time.perf_counter() - start)
    absolute_s(
        rep, f"OfflineDataset.open, {size} transitions", best["open"], best["eager"], OPEN_TARGET_S
    )
    child = _child(_CHILD_OPEN, str(entry))[0]
    absolute_s(
        rep,
        "  first open in a fresh process (after imports)",
        child["open"],
        best["eager"],
        OPEN_TARGET_S,
    )
    rep.note(
        f"fresh process: first __getitems__({BS} random indices) {fmt_time(child['first'])}, "
        f"second {fmt_time(child['second'])} (the first faults in the pages it reads)"
    )
    free()


def bench_dataloader(cfg: Config, rep: Report) -> None:
    file = _file(cfg)
    n = _n(cfg)
    size = _size(n)
    loader_cfg = Config(repeat=min(cfg.repeat, 5), min_time=0.0, warmup=1)  # 1 epoch per call
    rep.section(
        f"4. DataLoader(ds, batch_size={BS}, shuffle=True) over the converted cache entry, "
        f"{size} transitions, num_workers=0, default collate; time per batch over one epoch "
        f"(min over {loader_cfg.repeat} epochs after {loader_cfg.warmup} warm-up epoch)",
        "bench_foundation's DataLoader floor on plain tensors with the same keys, shapes and "
        "dtypes: batched __getitem__(list) -> dict of index_select(0, torch.as_tensor(idx, "
        f"dtype=torch.long)), sampler=BatchSampler(RandomSampler, {BS}), batch_size=None",
    )
    entries = {}
    for backend in ("memmap", "arrow"):
        entry = _root() / f"entry-{backend}"
        if not entry.exists():
            build(file, entry, backend)
        entries[backend] = entry
    datasets = {backend: OfflineDataset.open(entry) for backend, entry in entries.items()}
    try:
        ds = datasets["memmap"]
        storage = ds.storage
        if not isinstance(storage, MemmapStorage) or storage.layout is None:
            raise TypeError(f"expected a filled MemmapStorage, got {storage!r}")
        tensors = {
            "/".join(k): buf[:n].clone()
            for k, buf in zip(storage.layout.keys, storage.buffers, strict=True)
        }
        rep.note(
            f"{len(tensors)} leaves: "
            + ", ".join(f"{k} {list(t.shape[1:])} {str(t.dtype)[6:]}" for k, t in tensors.items())
        )

        def seeded() -> torch.Generator:
            return torch.Generator().manual_seed(0)

        def floor_loader(tensors: dict[str, torch.Tensor]) -> DataLoader[Any]:
            plain = PlainBatches(tensors)
            sampler = BatchSampler(RandomSampler(plain, generator=seeded()), BS, drop_last=False)
            return DataLoader(plain, sampler=sampler, batch_size=None)

        loaders = {
            backend: DataLoader(d, batch_size=BS, shuffle=True, generator=seeded())
            for backend, d in datasets.items()
        }
        loaders["identity"] = DataLoader(
            ds, batch_size=BS, shuffle=True, generator=seeded(), collate_fn=_identity
        )
        loaders["floor"] = floor_loader(tensors)
        mapped = dict(zip(tensors, storage.buffers, strict=True))  # the mapped files
        loaders["floor_mapped"] = floor_loader(mapped)
        batches = len(loaders["memmap"])

        def epoch(dl: DataLoader[Any]) -> None:
            for _ in dl:
                pass

        t = measure(
            {name: functools.partial(epoch, dl) for name, dl in loaders.items()}, loader_cfg
        )
        per = {k: v / batches for k, v in t.items()}
        rep.ratio(
            f"memmap entry ({batches} batches/epoch)", per["memmap"], per["floor"], LOADER_TARGET
        )
        rep.info("  collate_fn=identity (skips default_collate)", per["identity"], per["floor"])
        rep.info("  floor over the entry's mapped files", per["floor_mapped"], per["floor"])
        rep.info(
            "  memmap entry vs floor over the mapped files", per["memmap"], per["floor_mapped"]
        )
        rep.info("arrow entry", per["arrow"], per["floor"])
        rep.note(
            "default_collate returns the gathered TensorDict untouched: the storage marks a batch "
            "bound for it, so torch's collate does not index batch[0] (rbdata/storages/_collate.py)"
        )
        del tensors, mapped, loaders
    finally:
        for d in datasets.values():
            d.close()
    free()


WORKLOADS: list[Callable[[Config, Report], None]] = [
    bench_convert,
    bench_memory,
    bench_open,
    bench_dataloader,
]


def main(argv: list[str] | None = None) -> int:
    """Run every workload; ``--quick`` for a smoke run (100k rows)."""
    try:
        return _timing.main(
            "rbdata offline-dataset benchmarks",
            WORKLOADS,
            argv,
            quick_help=f"{_size(QUICK_N)} rows instead of {_size(FULL_N)}, fewer repeats",
        )
    finally:
        if _ROOT is not None:
            shutil.rmtree(_ROOT, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
