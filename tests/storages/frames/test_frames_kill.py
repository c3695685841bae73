"""SIGKILL at random moments: a ``FrameStackStorage`` with a path never tears or loses a write.

A worker process writes a full ring of pixel transitions (two env streams, random episode
ends with repeated-frame resets, batches of random sizes that overwrite live steps and wrap
around, and every fourth batch a ``set`` at random live slots). Every frame is one of a fixed
table of random frames ``FRAMES`` (incompressible, so the compressed log fills, grows and is
compacted into new generations all the time), and every step carries the table indices of
its two stacks (``fidx``), its batch id and its row. It logs ``done k`` after batch ``k``
returned. The test kills it at a random moment, reopens the directory and checks

* every stored step bit-exact: both stacks equal ``FRAMES[fidx]``, so no step points at
  frames a later (killed) write stored over the ones it needs;
* whole batches: every slot holds what the batches ``1..k`` (the one in flight absent) or
  ``1..k+1`` (present) left there, the same for all slots;
* the frames held after the open are exactly those the stored steps refer to;

then writes on and reads back again. Workers are forked from a zygote (``_zygote.py``).
"""

from __future__ import annotations

import inspect
import json
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from _zygote import Zygote
from test_memmap_kill import kill_and_reap, read_log

from rbdata.storages import FrameStackStorage

CAPACITY, STACK, SIDE, N_FRAMES, HI = 256, 4, 16, 4096, 200
TRIALS = 16


def size_of(seed: int, k: int) -> int:
    """The size of batch ``k`` of the worker with ``seed`` (the worker's and the model's)."""
    return random.Random(seed * 100_003 + k).randint(1, HI)


def slots_of(seed: int, k: int, n: int, length: int) -> list[int]:
    """The live slots the ``set`` of batch ``k`` writes (``n`` items, ``length`` stored)."""
    return random.Random(-(seed * 100_003 + k)).sample(range(length), min(n, length))


ZYGOTE = r"""
import os, random, sys, traceback
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict

from rbdata import ReplayBuffer
from rbdata.storages import FrameStackStorage
from rbdata.storages.frames import _pool

CAP, STACK, SIDE, N_FRAMES, HI = (int(v) for v in sys.argv[1:6])
CODEC = None if sys.argv[6] == "none" else sys.argv[6]
torch.set_num_threads(1)
_pool._MIN_LOG = 1 << 14  # a small log: grown and compacted (new generations) all the time
FRAMES = torch.from_numpy(
    np.random.default_rng(123).integers(0, 256, (N_FRAMES, SIDE, SIDE), dtype=np.uint8)
)


class Streams:
    # two env streams: each step one new frame (or a repeat), random episode ends
    def __init__(self, rng):
        self.rng, self.count, self.stacks = rng, 0, [None, None]

    def new(self):
        self.count += 1
        return self.count % N_FRAMES

    def step(self, e):
        if self.stacks[e] is None:  # an episode starts: its first frame repeated
            self.stacks[e] = [self.new()] * STACK
        obs = self.stacks[e]
        frame = obs[-1] if self.rng.random() < 0.1 else self.new()
        nxt = obs[1:] + [frame]
        self.stacks[e] = None if self.rng.random() < 0.08 else nxt
        return [obs, nxt]


def batch(streams, k, n):
    fidx = torch.tensor([streams.step(i % 2) for i in range(n)])
    return TensorDict(
        {
            "observation": FRAMES[fidx[:, 0]],
            "next": {"observation": FRAMES[fidx[:, 1]]},
            "fidx": fidx,
            "bid": torch.full((n,), k),
            "row": torch.arange(n),
        },
        [n],
    )


def work(root, seed, log):
    storage = FrameStackStorage(CAP, STACK, codec=CODEC, path=root / "storage")
    rb = ReplayBuffer(storage=storage)
    streams = Streams(random.Random(seed + 1))
    ready = [batch(streams, k, size_of(seed, k)) for k in range(1, 41)]  # most kills: writes
    k = 0
    while True:
        k += 1
        items = ready[k - 1] if k <= len(ready) else batch(streams, k, size_of(seed, k))
        if k % 4 == 0:
            slots = slots_of(seed, k, items.shape[0], len(storage))
            storage.set(torch.tensor(slots), items[: len(slots)])
        else:
            rb.extend(items)
        os.write(log, f"done {k}\n".encode())


warm = ReplayBuffer(FrameStackStorage(16, STACK, codec=CODEC))
warm.extend(batch(Streams(random.Random(0)), 1, 9))
"""
ZYGOTE += "\n".join(inspect.getsource(f) for f in (size_of, slots_of))

FRAMES = torch.from_numpy(
    np.random.default_rng(123).integers(0, 256, (N_FRAMES, SIDE, SIDE), dtype=np.uint8)
)


def model(seed: int, batches: int, sets: bool = True) -> tuple[np.ndarray, np.ndarray, int]:
    """Batch id and row of every slot after ``batches`` batches of the worker's plan."""
    bid = np.zeros(CAPACITY, np.int64)
    row = np.zeros(CAPACITY, np.int64)
    cursor = length = 0
    for k in range(1, batches + 1):
        n = size_of(seed, k)
        if sets and k % 4 == 0:
            slots = np.array(slots_of(seed, k, n, length), np.int64)
        else:
            slots = (cursor + np.arange(n)) % CAPACITY
            cursor = (cursor + n) % CAPACITY
            length = min(CAPACITY, length + n)
        bid[slots], row[slots] = k, np.arange(slots.size)
    return bid, row, length


def check(storage: FrameStackStorage, seed: int, done: int) -> str:
    """``present``/``absent`` for the batch in flight; raises on a torn or wrong step."""
    n = len(storage)
    items = storage[torch.arange(n)]
    fidx = items["fidx"]
    assert torch.equal(items["observation"], FRAMES[fidx[:, 0]]), "a stack is not its frames"
    assert torch.equal(items["next", "observation"], FRAMES[fidx[:, 1]]), "next stack differs"
    refs = storage.steps[torch.arange(n)]["_frame_refs"]
    assert storage.frames_stored == int(torch.unique(refs).numel()), "frames left unfreed"
    for verdict, k in (("present", done + 1), ("absent", done)):
        bid, row, length = model(seed, k)
        got = (items["bid"].numpy(), items["row"].numpy())
        if n == length and (got[0] == bid[:n]).all() and (got[1] == row[:n]).all():
            return verdict
    raise AssertionError(f"torn: the slots match neither {done} nor {done + 1} batches")


@pytest.mark.parametrize("codec", [None, "lz4"])
def test_sigkill_during_writes_keeps_every_step_exact(tmp_path: Path, codec: str | None) -> None:
    rng = random.Random(20261212)
    start = time.monotonic()
    argv = (CAPACITY, STACK, SIDE, N_FRAMES, HI, codec or "none")
    zygote = Zygote(tmp_path, ZYGOTE, argv)
    counts = {"present": 0, "absent": 0}
    generations = []
    try:
        for trial in range(TRIALS):
            root = tmp_path / f"trial-{trial:02d}"
            root.mkdir()
            done = kill_and_reap(zygote, root, trial, rng.randint(3, 8), rng.uniform(0, 0.03))
            storage = FrameStackStorage.open(root / "storage")
            counts[check(storage, trial, done)] += 1
            generations.append(_generation(root / "storage"))
            # the storage goes on: a write after the open reads back exactly
            more = storage[torch.arange(min(len(storage), 40))]
            storage.set(torch.arange(more.shape[0]), more)
            again = storage[torch.arange(more.shape[0])]
            assert torch.equal(again["observation"], FRAMES[again["fidx"][:, 0]])
            storage.close()
    finally:
        zygote.close()
    print(
        f"\nframes SIGKILL trials ({codec}): {TRIALS}, batch in flight present "
        f"{counts['present']}, absent {counts['absent']}, log generations {generations}, "
        f"{time.monotonic() - start:.1f} s"
    )
    if codec is not None:
        assert max(generations) > 0  # compactions happened (and were killed into, at times)


def _generation(path: Path) -> int:
    return int(json.loads((path / "frames.json").read_text())["generation"])


# --- a kill inside a compaction of the log, at each of its steps ----------------------------
CRASH = r"""
from rbdata.storages.frames import _files

_real = {"pack": _files.pack, "meta": _files.write_frames_meta, "fsync_dir": _files.fsync_dir}


def _exit_after(name, calls):
    def patched(*args, **kwargs):
        calls[0] -= 1
        if calls[0] < 0:
            os._exit(77)
        return _real[name](*args, **kwargs)
    return patched


def crash_pack(src, dst, table, order, same):  # half the blobs copied, then the kill
    _real["pack"](src, dst, table, order[: order.size // 2], same)
    os._exit(77)


def work(root, seed, log):
    point, codec = divmod(seed, 10)
    if point == 0:
        _files.pack = crash_pack
    elif point == 1:  # frames.json: new, the layout, then the first compaction's switch
        _files.write_frames_meta = _exit_after("meta", [2])
    else:  # switched, the old generation not yet removed
        _files.fsync_dir = _exit_after("fsync_dir", [0])
    storage = FrameStackStorage(CAP, STACK, codec="lz4", path=root / "storage")
    rb = ReplayBuffer(storage=storage)
    streams = Streams(random.Random(seed + 1))
    k = 0
    while True:
        k += 1
        rb.extend(batch(streams, k, size_of(seed, k)))
        os.write(log, f"done {k}\n".encode())
"""


def test_kill_inside_a_log_compaction(tmp_path: Path) -> None:
    argv = (CAPACITY, STACK, SIDE, N_FRAMES, HI, "lz4")
    zygote = Zygote(tmp_path, ZYGOTE + CRASH, argv)
    try:
        for point in range(3):
            root = tmp_path / f"point-{point}"
            root.mkdir()
            status = zygote.reap(zygote.run(root, seed=10 * point))
            lines = read_log(root)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 77, lines
            done = max(int(x.split()[1]) for x in lines if x.startswith("done "))
            assert done >= 2  # the kill came in a compaction, not at the first write
            storage = FrameStackStorage.open(root / "storage")
            bid, row, length = model(10 * point, done, sets=False)
            items = storage[torch.arange(len(storage))]
            assert len(storage) == length
            assert (items["bid"].numpy() == bid[:length]).all()
            assert (items["row"].numpy() == row[:length]).all()
            assert torch.equal(items["observation"], FRAMES[items["fidx"][:, 0]])
            assert torch.equal(items["next", "observation"], FRAMES[items["fidx"][:, 1]])
            names = sorted(os.listdir(root / "storage" / "frames"))
            gen = _generation(root / "storage")
            assert names == [f"log-{gen}.bin", f"table-{gen}.bin"]  # leftovers removed
            assert gen == (1 if point == 2 else 0)
            storage.close()
    finally:
        zygote.close()
