"""SIGKILL at random moments of ``ReplayBuffer.dumps`` always leaves a complete checkpoint.

A worker process fills a prioritized memmap buffer so that every item (and every priority)
carries a generation number ``g``, checkpoints it with ``dumps``, and goes on with ``g + 1``.
The test kills it with SIGKILL at a random moment, then loads the checkpoint: it must be
complete and consistent, and be the last finished generation or the one being written.

Importing torch, tensordict and rbdata takes seconds per interpreter, so the workers are
forked from one "zygote": a fresh interpreter (started with ``subprocess``; the test process
itself is never forked) that imports everything once, warms the numba kernels on a tiny
buffer, then forks one worker per trial on request. Workers log ``ready``, ``start g``
(before ``dumps``) and ``done g`` (after it) with unbuffered writes to a file of their own,
so the last line of the log says where the kill landed.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from _zygote import TIMEOUT, Zygote

from rbdata import PrioritizedSampler, ReplayBuffer, TensorStorage
from rbdata.errors import CheckpointError

N = 30_000  # items: one dumps takes some 10-30 ms here, a generation's fill about half that
FEATURES = 8
ALPHA, BETA, EPS = 0.7, 0.5, 0.01
TRIALS = 24
# Three kinds of trials: killed around the very first dumps (there may be no checkpoint yet),
# at a blind random moment over several generations (fill or dumps), and aimed at a dumps: at a
# random moment in 1.2 times the duration of the previous dumps after the start of one.
FIRST_DUMP_TRIALS = range(0, TRIALS, 6)
FIRST_DUMP_WINDOW = 0.04  # seconds after "ready": the first fill + dumps take about that long
BLIND_WINDOW = 0.3  # seconds after "done 1": several generations
AIMED_WINDOW = 1.2  # times the previous dumps's duration, after "start g"
MIN_INSIDE_DUMPS = 5

ZYGOTE = r"""
import os, sys, tempfile, time, traceback
from pathlib import Path

import torch
from tensordict import TensorDict

from rbdata import MemmapStorage, PrioritizedSampler, ReplayBuffer

N, F = int(sys.argv[1]), int(sys.argv[2])
ALPHA, BETA, EPS = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])


def fill(rb, n, g):
    # every item of generation g carries g: its "gen", its first feature and its priority
    obs = torch.empty(n, F)
    obs[:, 0] = g
    obs[:, 1] = torch.arange(n, dtype=torch.float32)
    obs[:, 2:] = -g
    rb.extend(TensorDict({"gen": torch.full((n,), g, dtype=torch.int64), "obs": obs}, [n]))
    index = torch.arange(n)
    rb.update_priority(index, 1.0 + g + (index % 7).double() / 2)


def build(root, n, seed):
    sampler = PrioritizedSampler(
        n, ALPHA, BETA, eps=EPS, generator=torch.Generator().manual_seed(seed)
    )
    return ReplayBuffer(MemmapStorage(n, path=root / "storage"), sampler, batch_size=32)


def work(root, seed, log):
    def say(line):
        os.write(log, (line + "\n").encode())  # unbuffered: on file before the next step

    rb = build(root, N, seed)
    say("ready")
    g = 0
    while True:
        g += 1
        fill(rb, N, g)
        say(f"start {g} {time.monotonic():.6f}")
        rb.dumps(root / "ckpt")
        say(f"done {g} {time.monotonic():.6f}")


with tempfile.TemporaryDirectory() as tmp:  # warm-up: numba kernels, tensordict, dumps
    warm = build(Path(tmp), 64, 0)
    for g in (1, 2):
        fill(warm, 64, g)
        warm.dumps(Path(tmp) / "ckpt")
    ReplayBuffer.loads(Path(tmp) / "ckpt").sample()
    warm.storage.close()
    del warm

"""


def read_log(root: Path) -> list[str]:
    log = root / "log"
    return log.read_text().splitlines() if log.exists() else []


def wait_for(root: Path, event: str, pid: int) -> list[str]:
    """Wait for the worker's log line ``event`` (its timestamp aside); return the log."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        lines = read_log(root)
        if any(x == event or x.startswith(event + " ") for x in lines):
            return lines
        if any(x.startswith("Traceback") for x in lines) or time.monotonic() > deadline:
            raise AssertionError(f"worker {pid}: no {event!r}:\n" + "\n".join(lines))
        time.sleep(0.001)


def stamp(lines: list[str], event: str) -> float:
    """The ``time.monotonic()`` (system-wide) at which the worker logged ``event``."""
    return next(float(x.split()[2]) for x in lines if x.startswith(event + " "))


def last_generations(lines: list[str]) -> tuple[int, bool]:
    """(the last generation whose ``dumps`` finished, whether a ``dumps`` was in progress)."""
    done, inside = 0, False
    for line in lines:
        if line == "ready":
            continue
        match = re.fullmatch(r"(start|done) (\d+) [\d.]+", line)
        word, num = match.groups() if match else ("", "-1")
        if word == "start" and int(num) == done + 1 and not inside:
            inside = True
        elif word == "done" and int(num) == done + 1 and inside:
            done, inside = done + 1, False
        else:
            raise AssertionError(f"unexpected worker log line {line!r}:\n" + "\n".join(lines))
    return done, inside


def expected_priority_values(g: int) -> torch.Tensor:
    """The sum-tree leaves ``(p + eps)^alpha`` of generation ``g``, computed here in float64."""
    p = 1.0 + g + (np.arange(N) % 7) / 2.0
    return torch.from_numpy((p + EPS) ** ALPHA)


def check_buffer(rb: ReplayBuffer) -> int:
    """Check that every item, priority and state of ``rb`` is of one generation; return it."""
    assert len(rb) == N
    assert rb.storage.next_slot == 0
    assert getattr(rb.writer, "cursor", None) == 0
    items = rb.storage[torch.arange(N)]
    gens = items["gen"]
    k = int(gens[0])
    assert k >= 1
    assert bool((gens == k).all()), f"items of several generations: {gens.unique().tolist()}"
    obs = items["obs"]
    assert bool((obs[:, 0] == k).all())
    assert torch.equal(obs[:, 1], torch.arange(N, dtype=torch.float32))
    assert bool((obs[:, 2:] == -k).all())
    sampler = rb.sampler
    assert isinstance(sampler, PrioritizedSampler)
    values = expected_priority_values(k)
    torch.testing.assert_close(sampler.priority_values().double(), values, rtol=1e-6, atol=0)
    assert sampler.max_priority == 1.0 + k + 3.0
    batch = rb.sample()  # the sum and min trees agree with the leaves
    assert batch["index"].shape == (32,)
    weight = (values[batch["index"]] / values.min()) ** -BETA
    torch.testing.assert_close(batch["weight"].double(), weight, rtol=1e-5, atol=0)
    return k


def load_generation(path: Path) -> tuple[ReplayBuffer | None, str]:
    """The checkpoint at ``path`` (``None`` if there is none) and why there is none."""
    try:
        return ReplayBuffer.loads(path), ""
    except (CheckpointError, FileNotFoundError) as err:
        return None, f"{type(err).__name__}: {err}"


def assert_clean(path: Path) -> None:
    names = sorted(p.name for p in path.iterdir())
    live = [n for n in names if n.startswith("ckpt-")]
    assert len(live) == 1 and names == sorted(["CURRENT", *live]), names
    assert (path / "CURRENT").read_text().strip() == live[0]


@dataclass
class Outcome:
    kind: str  # "first", "blind" or "aimed"
    done: int  # the last generation whose dumps finished
    inside: bool  # killed inside dumps(done + 1)
    loaded: int  # the generation of the checkpoint found (0: none)
    leftovers: list[str]  # what the killed process left besides the live checkpoint


def run_trial(zygote: Zygote, root: Path, trial: int, rng: random.Random) -> Outcome:
    root.mkdir()
    path = root / "ckpt"
    pid = zygote.run(root, seed=trial)
    kind = "first" if trial in FIRST_DUMP_TRIALS else ("blind", "aimed")[trial % 2]
    if kind == "first":
        wait_for(root, "ready", pid)
        time.sleep(rng.uniform(0, FIRST_DUMP_WINDOW))
    elif kind == "blind":
        wait_for(root, "done 1", pid)
        time.sleep(rng.uniform(0, BLIND_WINDOW))
    else:
        g = rng.randint(2, 5)
        lines = wait_for(root, f"start {g}", pid)
        previous = stamp(lines, f"done {g - 1}") - stamp(lines, f"start {g - 1}")
        at = stamp(lines, f"start {g}") + rng.uniform(0, AIMED_WINDOW * previous)
        time.sleep(max(0.0, at - time.monotonic()))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    status = zygote.reap(pid)
    lines = read_log(root)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"worker {pid} was not killed by SIGKILL (status {status}):\n" + "\n".join(lines)
    )
    done, inside = last_generations(lines)
    # a kill inside dumps(done + 1) leaves generation done or done + 1; elsewhere exactly done
    allowed = {done, done + 1} if inside else {done}
    current = path / "CURRENT"
    live = current.read_text().strip() if current.is_file() else None
    names = [p.name for p in path.iterdir()] if path.is_dir() else []
    leftovers = sorted(n for n in names if n not in ("CURRENT", live))
    rb, why = load_generation(path)
    if rb is None:
        assert 0 in allowed, f"no checkpoint ({why}) after generation {done} was saved"
        assert not (path / "CURRENT").exists()
        k = 0
        rb = ReplayBuffer(TensorStorage(4), PrioritizedSampler(4, ALPHA, BETA))
        rb.extend(torch.zeros(4, 2))
    else:
        k = check_buffer(rb)
        assert k in allowed, f"checkpoint of generation {k}, expected one of {sorted(allowed)}"
    # the next dumps to the same path succeeds and removes the killed process's leftovers
    rb.dumps(path)
    assert_clean(path)
    again = ReplayBuffer.loads(path)
    if k:
        assert check_buffer(again) == k
    else:
        assert len(again) == 4
    for buf in (rb, again):
        close = getattr(buf.storage, "close", None)
        if close is not None:
            close()
    return Outcome(kind, done, inside, k, leftovers)


def test_sigkill_during_dumps_leaves_a_complete_checkpoint(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    start = time.monotonic()
    zygote = Zygote(tmp_path, ZYGOTE, (N, FEATURES, ALPHA, BETA, EPS))
    try:
        results = [
            run_trial(zygote, tmp_path / f"trial-{trial:02d}", trial, rng)
            for trial in range(TRIALS)
        ]
    finally:
        zygote.close()
    inside = sum(r.inside for r in results)
    by_kind = ", ".join(
        f"{kind} {sum(r.inside for r in results if r.kind == kind)}"
        f"/{sum(r.kind == kind for r in results)}"
        for kind in ("first", "blind", "aimed")
    )
    none = sum(r.loaded == 0 for r in results)
    newer = sum(r.loaded == r.done + 1 for r in results)
    dirty = sum(bool(r.leftovers) for r in results)
    gens = [r.done for r in results]
    print(
        f"\nSIGKILL trials: {TRIALS}, inside dumps: {inside} ({by_kind}), "
        f"new checkpoint already live: {newer}, no checkpoint yet: {none}, leftovers "
        f"cleaned: {dirty}, generations done before the kill: {min(gens)}-{max(gens)}, "
        f"{time.monotonic() - start:.1f} s"
    )
    assert inside >= MIN_INSIDE_DUMPS, f"only {inside} of {TRIALS} kills landed inside dumps"
