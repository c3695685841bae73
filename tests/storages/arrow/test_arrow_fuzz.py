"""Fuzzing ArrowStorage files: corrupt chunks and metadata give a clear error, never a crash.

A template storage (fixed, bool, ragged and string leaves; two chunk files) is written once.
Each case copies it, changes one byte of a chunk file or of ``_rbdata.json`` (or truncates
one), then opens it, reads every row (one batch and one item at a time) and a sample of
random gathers. The cases run in a few child interpreters, which log ``start i`` before and
``done i outcome`` after each case with unbuffered writes: a child killed by a signal is a
crash of the case it last started, and a new child goes on with the next case.

Outcomes: ``error`` (a ``ValueError`` or ``FileNotFoundError`` naming the problem), ``ok``
(the corruption hit bytes whose change still reads: same-size corruption of data may
legitimately read back as other data), ``crash`` (exit by a signal: must be zero) and
``other`` (any other exception type: must be zero).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch
from _paths import ROOT_DIR

from rbdata.storages import ArrowStorage

ROOT = ROOT_DIR
SEED = 20261124
# (kind, count): single-byte changes and truncations of chunk files and of the metadata
PLAN = [("chunk-flip", 230), ("chunk-trunc", 40), ("meta-flip", 30), ("meta-trunc", 20)]
CHILDREN = 3

CHILD = r"""
import os, random, shutil, sys, traceback
from pathlib import Path
import torch
from rbdata.storages import ArrowStorage

template, work, log_path, seed = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
cases = [(int(i), kind) for i, kind in (x.split(":") for x in sys.argv[5].split(","))]
log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
chunks = sorted(p.name for p in template.iterdir() if p.name.startswith("chunk-"))

def mutate(path, i, kind):
    rng = random.Random(seed * 1000 + i)
    name = "_rbdata.json" if kind.startswith("meta") else rng.choice(chunks)
    data = bytearray((path / name).read_bytes())
    if kind.endswith("flip"):
        at = rng.randrange(len(data))
        data[at] ^= rng.randrange(1, 256)
    else:
        data = data[: rng.randrange(len(data))]
    (path / name).write_bytes(bytes(data))

for i, kind in cases:
    os.write(log, f"start {i}\n".encode())
    case = work / f"case-{i}"
    shutil.copytree(template, case)
    mutate(case, i, kind)
    outcome = "ok"
    try:
        s = ArrowStorage.open(case)
        n = len(s)
        if n:
            s[torch.arange(n)]
            for j in range(n):
                s[j]
            g = torch.Generator().manual_seed(i)
            for _ in range(5):
                s[torch.randint(0, n, (7,), generator=g)]
        s.close()
    except (ValueError, FileNotFoundError):
        outcome = "error"
    except Exception:
        outcome = "other " + traceback.format_exc().replace("\n", " | ")
    shutil.rmtree(case, ignore_errors=True)
    os.write(log, f"done {i} {outcome}\n".encode())
"""


def make_template(path: Path) -> None:
    storage = ArrowStorage(16, path=path, chunk_size=8)
    ids = range(13)
    storage.set(
        slice(0, 13),
        {
            "id": torch.tensor(list(ids)),
            "obs": torch.tensor([[i, i / 2, -i] for i in ids], dtype=torch.float32),
            "flag": torch.tensor([i % 2 == 0 for i in ids]),
            "boxes": [torch.full((i % 4, 2), float(i)) for i in ids],
            "text": [f"row {i}" + "é" * (i % 3) for i in ids],
        },
    )
    storage.close()


def run_cases(tmp: Path, template: Path, cases: list[tuple[int, str]], child: int) -> dict:
    """Run ``cases`` in children (a new one after each crash); the outcome of every case."""
    outcomes: dict[int, str] = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    todo = list(cases)
    run = 0
    while todo:
        log = tmp / f"log-{child}-{run}"
        work = tmp / f"work-{child}-{run}"
        work.mkdir()
        arg = ",".join(f"{i}:{kind}" for i, kind in todo)
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(template), str(work), str(log), str(SEED), arg],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        lines = log.read_text().splitlines() if log.exists() else []
        started = None
        for line in lines:
            word, num, *rest = line.split(" ", 2)
            if word == "start":
                started = int(num)
            else:
                outcomes[int(num)] = rest[0] if rest else "?"
                started = None
        if proc.returncode < 0:
            assert started is not None, f"child died by signal {-proc.returncode} between cases"
            outcomes[started] = f"crash (signal {-proc.returncode})"
        elif proc.returncode != 0:
            raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        todo = [(i, kind) for i, kind in todo if i not in outcomes]
        run += 1
    return outcomes


def test_corrupt_files_never_crash(tmp_path: Path) -> None:
    template = tmp_path / "template"
    make_template(template)
    cases = []
    for kind, count in PLAN:
        cases += [(len(cases) + j, kind) for j in range(count)]
    outcomes: dict[int, str] = {}
    for child in range(CHILDREN):
        outcomes.update(run_cases(tmp_path, template, cases[child::CHILDREN], child))
    assert len(outcomes) == len(cases) >= 300
    by_kind: dict[str, Counter[str]] = {}
    for i, kind in cases:
        by_kind.setdefault(kind, Counter())[outcomes[i].split(" ")[0]] += 1
    total = sum(by_kind.values(), Counter())
    print(
        f"\nfuzz cases: {len(cases)}; clean error {total['error']}, read OK {total['ok']}, "
        f"crash {total['crash']}, other exception {total['other']}; by kind: "
        + "; ".join(f"{k} {dict(v)}" for k, v in by_kind.items())
    )
    bad = {i: o for i, o in outcomes.items() if o.startswith(("crash", "other"))}
    assert not bad, f"{len(bad)} cases crashed or raised another error: {bad}"
    assert total["error"] > len(cases) // 3  # the checks do fire
