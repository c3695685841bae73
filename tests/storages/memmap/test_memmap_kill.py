"""SIGKILL at random moments: every ``MemmapStorage.extend`` is atomic across a crash.

A worker process extends a full memmap ring with batches of random sizes (so that batches
overwrite live items and wrap around the end), each row carrying its batch id and its row
number in every leaf. It logs ``done k`` (unbuffered) after the ``extend`` of batch ``k``
returned. The test kills it at a random moment, reopens the directory and compares every slot
with the two possible rings: batches ``1..k`` (the batch in flight is absent) or ``1..k+1``
(it is present). Anything else is a torn batch. Every batch whose extend returned must be there.

Workers are forked from one "zygote" interpreter that imports torch and rbdata once (see
``tests/checkpoint/test_checkpoint_kill.py``); the test process itself is never forked.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from _zygote import TIMEOUT, Zygote

from rbdata.storages import MemmapStorage

CAPACITY = 2048
OBS = 256  # floats per row: a 1 KiB leaf, so a kill often lands inside a row's copy
MIN_BATCH, MAX_BATCH = 1, 1500
TRIALS = 24

ZYGOTE = r"""
import os, random, sys, traceback
from pathlib import Path

import torch
from tensordict import TensorDict

from rbdata import ReplayBuffer
from rbdata.storages import MemmapStorage

CAP, OBS, LO, HI = (int(v) for v in sys.argv[1:5])
torch.set_num_threads(1)  # no OpenMP spinning on a busy machine: the timing stays realistic


# reused source buffers: building a batch costs little next to its extend, so that most
# kills land inside an extend
BID = torch.empty(HI, dtype=torch.int64)
ROW = torch.arange(HI, dtype=torch.int32)
OBS_BUF, NEXT_BUF = torch.empty(HI, OBS), torch.empty(HI, OBS)
ROW_F = torch.arange(HI, dtype=torch.float32)


def batch(k, n):
    BID[:n].fill_(k)
    OBS_BUF[:n].fill_(float(k))
    OBS_BUF[:n, 1] = ROW_F[:n]
    torch.neg(OBS_BUF[:n], out=NEXT_BUF[:n])
    return TensorDict(
        {"bid": BID[:n], "row": ROW[:n], "obs": OBS_BUF[:n], "next": {"obs": NEXT_BUF[:n]}},
        [n],
    )


def work(root, seed, log):
    rb = ReplayBuffer(MemmapStorage(CAP, path=root / "storage"))
    rng = random.Random(seed)
    k = 0
    while True:
        k += 1
        rb.extend(batch(k, rng.randint(LO, HI)))
        os.write(log, f"done {k}\n".encode())


warm = ReplayBuffer(MemmapStorage(16))
for k in range(1, 6):
    warm.extend(batch(k, 7))
warm.storage.close()
"""


def read_log(root: Path) -> list[str]:
    log = root / "log"
    return log.read_text().splitlines() if log.exists() else []


def wait_for(root: Path, count: int, pid: int) -> None:
    """Wait until the worker logged ``done count``."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        lines = read_log(root)
        if f"done {count}" in lines:
            return
        if any(x.startswith("Traceback") for x in lines) or time.monotonic() > deadline:
            raise AssertionError(f"worker {pid}: no 'done {count}':\n" + "\n".join(lines))
        time.sleep(0.001)


def kill_and_reap(zygote: Zygote, root: Path, trial: int, logged: int, pause: float) -> int:
    """Run a worker in ``root``, SIGKILL it ``pause`` s after it logged ``done logged``.

    Returns the last ``done k`` it logged; it must have died of the SIGKILL.
    """
    pid = zygote.run(root, seed=trial)
    wait_for(root, logged, pid)
    time.sleep(pause)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    status = zygote.reap(pid)
    lines = read_log(root)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, lines
    return max(int(x.split()[1]) for x in lines if x.startswith("done "))


def ring(sizes: list[int]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Batch id and row of every slot after the batches ``sizes`` (an independent model)."""
    bid = np.zeros(CAPACITY, dtype=np.int64)
    row = np.zeros(CAPACITY, dtype=np.int64)
    cursor = length = 0
    for k, n in enumerate(sizes, start=1):
        slots = (cursor + np.arange(n)) % CAPACITY
        bid[slots] = k
        row[slots] = np.arange(n)
        cursor = (cursor + n) % CAPACITY
        length = min(CAPACITY, length + n)
    return bid, row, length, cursor


def classify(storage: MemmapStorage, sizes: list[int], done: int) -> tuple[str, int]:
    """``present``/``absent``/``torn`` for the batch in flight, and the torn slot count."""
    n = len(storage)
    items = storage[torch.arange(n)] if n else None
    verdicts = []
    for k in (done, done + 1):
        bid, row, length, cursor = ring(sizes[:k])
        if items is None:
            ok = length == 0 and storage.next_slot == 0
            verdicts.append((ok, 0 if ok else CAPACITY))
            continue
        obs = np.full((n, OBS), 0.0, dtype=np.float32)
        obs[:] = bid[:n, None]
        obs[:, 1] = row[:n]
        got_obs = items["obs"].numpy()
        bad = (
            (items["bid"].numpy() != bid[:n])
            | (items["row"].numpy() != row[:n])
            | (got_obs != obs).any(axis=1)
            | (items["next", "obs"].numpy() != -obs).any(axis=1)
        )
        ok = n == length and storage.next_slot == cursor and not bad.any()
        verdicts.append((ok, int(bad.sum()) if n == length else CAPACITY))
    if verdicts[1][0]:
        return "present", 0
    if verdicts[0][0]:
        return "absent", 0
    return "torn", min(v[1] for v in verdicts)


def test_sigkill_during_extend_leaves_whole_batches(tmp_path: Path) -> None:
    rng = random.Random(20261124)
    start = time.monotonic()
    zygote = Zygote(tmp_path, ZYGOTE, (CAPACITY, OBS, MIN_BATCH, MAX_BATCH))
    counts = {"present": 0, "absent": 0, "torn": 0}
    torn_slots = []
    try:
        for trial in range(TRIALS):
            root = tmp_path / f"trial-{trial:02d}"
            root.mkdir()
            # the ring is full (or nearly) after 3-6 batches
            done = kill_and_reap(zygote, root, trial, rng.randint(3, 6), rng.uniform(0.0, 0.03))
            seeded = random.Random(trial)
            sizes = [seeded.randint(MIN_BATCH, MAX_BATCH) for _ in range(done + 1)]
            storage = MemmapStorage.open(root / "storage")
            verdict, slots = classify(storage, sizes, done)
            counts[verdict] += 1
            if slots:
                torn_slots.append(slots)
            if verdict != "torn":  # the storage goes on: the next extend lands after it
                storage.set(slice(0, 1), storage[[0]])
            storage.close()
    finally:
        zygote.close()
    print(
        f"\nmemmap SIGKILL trials: {TRIALS}, batch in flight present {counts['present']}, "
        f"absent {counts['absent']}, torn {counts['torn']} (slots {torn_slots}), "
        f"{time.monotonic() - start:.1f} s"
    )
    assert counts["torn"] == 0, f"torn batches: {counts}, torn slots per trial {torn_slots}"


# --- per-step adds --------------------------------------------------------------------------
ADD_CAPACITY = 512
ADD_LOG_EVERY = 64
ADD_TRIALS = 16

ADD_ZYGOTE = r"""
import os, random, sys, traceback
from pathlib import Path

import numpy as np
import torch

from rbdata import ReplayBuffer
from rbdata.storages import MemmapStorage

CAP, OBS, EVERY = (int(v) for v in sys.argv[1:4])
torch.set_num_threads(1)


def work(root, seed, log):
    # numpy items, as an agent's step gives them: the per-step (fast) add path
    rb = ReplayBuffer(MemmapStorage(CAP, path=root / "storage"))
    obs = np.empty(OBS, dtype=np.float32)
    k = 0
    while True:
        k += 1
        obs.fill(k)
        rb.add({"id": np.int64(k), "obs": obs, "next": {"obs": -obs, "done": k % 3 == 0}})
        if k % EVERY == 0:
            os.write(log, f"done {k}\n".encode())


warm = ReplayBuffer(MemmapStorage(4))
for k in range(9):
    warm.add({"id": np.int64(k), "obs": np.zeros(OBS, np.float32),
              "next": {"obs": np.zeros(OBS, np.float32), "done": False}})
warm.storage.close()
"""


def check_adds(storage: MemmapStorage, done: int) -> tuple[str, int]:
    """``ok`` if the ring holds items ``1..K`` for one ``K`` in ``[done, done + EVERY]``."""
    n = len(storage)
    candidates = [
        k for k in range(done, done + ADD_LOG_EVERY + 1) if k % ADD_CAPACITY == storage.next_slot
    ]
    if len(candidates) != 1 or n != min(ADD_CAPACITY, candidates[0]):
        return "torn", ADD_CAPACITY
    total = candidates[0]
    items = storage[torch.arange(n)]
    slots = np.arange(n)
    # the last item written to each slot: k = slot + 1 + CAP * j, the largest <= total
    want = slots + 1 + ADD_CAPACITY * ((total - slots - 1) // ADD_CAPACITY)
    obs = items["obs"].numpy()
    bad = (
        (items["id"].numpy() != want)
        | (obs != want[:, None]).any(axis=1)
        | (items["next", "obs"].numpy() != -want[:, None]).any(axis=1)
        | (items["next", "done"].numpy() != (want % 3 == 0))
    )
    return ("torn" if bad.any() else "ok"), int(bad.sum())


# 256 floats: numpy rows through the journal; 4 floats: packed (one struct call, one kernel)
@pytest.mark.parametrize("obs", [OBS, 4])
def test_sigkill_during_per_step_adds_leaves_whole_items(tmp_path: Path, obs: int) -> None:
    rng = random.Random(20261125 + obs)
    start = time.monotonic()
    zygote = Zygote(tmp_path, ADD_ZYGOTE, (ADD_CAPACITY, obs, ADD_LOG_EVERY))
    counts = {"ok": 0, "torn": 0}
    try:
        for trial in range(ADD_TRIALS):
            root = tmp_path / f"trial-{trial:02d}"
            root.mkdir()
            # the ring is full by then: most adds overwrite live items through the journal
            logged = ADD_LOG_EVERY * rng.randint(9, 14)
            done = kill_and_reap(zygote, root, trial, logged, rng.uniform(0.0, 0.02))
            storage = MemmapStorage.open(root / "storage")
            verdict, _ = check_adds(storage, done)
            counts[verdict] += 1
            storage.close()
    finally:
        zygote.close()
    print(
        f"\nmemmap per-step add ({obs} floats) SIGKILL trials: {ADD_TRIALS}, whole {counts['ok']}, "
        f"torn {counts['torn']}, {time.monotonic() - start:.1f} s"
    )
    assert counts["torn"] == 0, counts
