"""SIGKILL at random moments of ArrowStorage extends: every batch is wholly present or absent.

A worker extends a ring (capacity 2048, chunk 256) with batches of random sizes, wrapping and
overwriting full chunks in place; every row of batch ``b`` carries ``b`` in all its fields.
It logs ``start b n`` before an ``extend`` and ``done b`` after it (and flushes now and then),
with unbuffered writes. The test kills it at a random moment, reopens the directory, and
compares every row with a ring model of the logged batches: the storage must equal the model
after the last returned extend (the batch being written absent) or after the one being
written (present); anything else is a torn batch. Workers are forked from a "zygote"
interpreter that imported everything once (as in ``test_checkpoint_kill.py``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from pathlib import Path

import torch
from _zygote import TIMEOUT, Zygote

from rbdata.storages import ArrowStorage

CAPACITY, CHUNK, WIDTH = 2048, 256, 256
TRIALS = 24

ZYGOTE = r"""
import os, random, sys, tempfile, traceback
from pathlib import Path
import torch
from rbdata import ReplayBuffer
from rbdata.storages import ArrowStorage

CAPACITY, CHUNK, WIDTH = (int(x) for x in sys.argv[1:4])
torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool

def work(root, seed, log, limit=None):
    def say(line):
        os.write(log, (line + "\n").encode())
    rng = random.Random(seed)
    rb = ReplayBuffer(ArrowStorage(CAPACITY, path=root / "storage", chunk_size=CHUNK))
    say("ready")
    b = 0
    while limit is None or b < limit:
        b += 1
        n = rng.randint(1, 600)
        data = {"bid": torch.full((n,), b), "obs": torch.full((n, WIDTH), float(b))}
        say(f"start {b} {n}")
        rb.extend(data)
        say(f"done {b}")
        if b % 40 == 0:
            rb.storage.flush()

with tempfile.TemporaryDirectory() as tmp:  # warm-up: numba kernels, pyarrow, tensordict
    fd = os.open(os.path.join(tmp, "log"), os.O_WRONLY | os.O_CREAT)
    work(Path(tmp), 0, fd, limit=20)
    os.close(fd)
    ArrowStorage.open(Path(tmp) / "storage")[torch.arange(8)]

"""


def model(sizes: list[int]) -> tuple[list[int], int]:
    """The batch id in each slot after ``sizes`` were extended (-1: empty), and the next slot."""
    slots, cursor = [-1] * CAPACITY, 0
    for b, n in enumerate(sizes, start=1):
        for _ in range(n):
            slots[cursor] = b
            cursor = (cursor + 1) % CAPACITY
    return slots, cursor


def test_every_extend_is_atomic_across_sigkill(tmp_path: Path) -> None:
    rng = random.Random(11)
    start = time.monotonic()
    zygote = Zygote(tmp_path, ZYGOTE, (CAPACITY, CHUNK, WIDTH))
    counts = {"present": 0, "absent": 0, "torn": 0, "between": 0}
    try:
        for trial in range(TRIALS):
            root = tmp_path / f"t{trial}"
            root.mkdir()
            pid = zygote.run(root, trial)
            deadline = time.monotonic() + TIMEOUT
            while "ready" not in (root / "log").read_text() if (root / "log").exists() else True:
                assert time.monotonic() < deadline, "worker never ready"
                time.sleep(0.001)
            time.sleep(rng.uniform(0.01, 0.3))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            status = zygote.reap(pid)
            lines = (root / "log").read_text().splitlines()
            assert os.WIFSIGNALED(status), "\n".join(lines[-20:])
            sizes = [int(x.split()[2]) for x in lines if x.startswith("start ")]
            finished = sum(x.startswith("done ") for x in lines)
            assert finished in (len(sizes), len(sizes) - 1), lines[-5:]
            storage = ArrowStorage.open(root / "storage")
            n = len(storage)
            rows = storage[torch.arange(n)] if n else None
            got = [-1] * CAPACITY
            if rows is not None:
                got[:n] = rows["bid"].tolist()
                # every field of a row is of one batch: no torn item
                assert torch.equal(rows["obs"], rows["bid"].float()[:, None].expand(n, WIDTH))
            before, next_before = model(sizes[:finished])
            after, next_after = model(sizes)
            if got == before and storage.next_slot == next_before:
                kind = "absent" if finished < len(sizes) else "between"
            elif got == after and storage.next_slot == next_after:
                kind = "present"
            else:
                kind = "torn"
            counts[kind] += 1
            assert kind != "torn", f"trial {trial}: the storage matches neither model"
            storage.close()
    finally:
        zygote.close()
    elapsed = time.monotonic() - start
    print(
        f"\nArrowStorage SIGKILL trials: {TRIALS}; the batch being written present "
        f"{counts['present']}, absent {counts['absent']}, killed between extends "
        f"{counts['between']}, torn {counts['torn']}; {elapsed:.1f} s"
    )
    assert counts["torn"] == 0
