"""Child-process script for test_memory_moves: move a storage's memory, then write and read.

``python tests/_moves.py KIND MOVE TMPDIR`` builds a storage of ``KIND`` (``tensor``,
``memmap``, ``private``: a copy-on-write MemmapStorage as ``ReplayBuffer.loads`` gives;
``huge``: a TensorStorage whose arena is a :func:`~rbdata.storages._memory.huge_block`, here
with 512-byte "huge pages" so that a small storage takes that path: a slice at an offset into
a larger allocation, advised before it is touched), fills
it, makes torch move its memory with ``MOVE``, then runs every write path (per-step ``add`` of a
dict and of a TensorDict, small and large ``extend``, ``set`` at scattered slots) and checks
every slot against a plain list of the values written. Prints ``OK`` and exits 0; a mismatch
raises; a write through a stale view crashes the process (the parent reports the signal).
"""

from __future__ import annotations

import io
import sys
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import torch
from tensordict import TensorDict

from rbdata import MemmapStorage, ReplayBuffer, TensorStorage
from rbdata.storages import Storage, _memory

CAP = 64


def item(k: int) -> dict[str, object]:
    """A CartPole-like transition whose every leaf encodes ``k``."""
    return {
        "observation": torch.full((4,), float(k)),
        "action": torch.tensor(k),
        "next": {"reward": torch.tensor(float(-k)), "done": torch.tensor(k % 3 == 0)},
    }


def batch(ks: list[int]) -> TensorDict:
    return TensorDict(
        {
            "observation": torch.tensor(ks, dtype=torch.float32)[:, None].expand(-1, 4).clone(),
            "action": torch.tensor(ks),
            "next": {
                "reward": -torch.tensor(ks, dtype=torch.float32),
                "done": torch.tensor([k % 3 == 0 for k in ks]),
            },
        },
        [len(ks)],
    )


def make(kind: str, tmp: Path) -> tuple[ReplayBuffer, list[int | None]]:
    model: list[int | None] = [None] * CAP
    if kind in ("tensor", "huge"):
        if kind == "huge":
            _memory.HUGE_PAGE = _memory.HUGE_MIN = 512
        rb = ReplayBuffer(TensorStorage(CAP))
    else:
        rb = ReplayBuffer(MemmapStorage(CAP, path=tmp / "mm"))
    ks = list(range(100, 100 + CAP))
    rb.extend(batch(ks))
    model[:] = ks
    if kind == "huge":  # the arena is a slice of a larger block, on a "huge page" boundary
        bufs = rb.storage.buffers  # type: ignore[attr-defined]
        assert bufs[0].untyped_storage().nbytes() > sum(b.nbytes for b in bufs)
        assert bufs[0].data_ptr() % 512 == 0
    if kind == "private":
        rb.dumps(tmp / "ckpt")
        rb = ReplayBuffer.loads(tmp / "ckpt")
    return rb, model


def move(storage: Storage, how: str) -> None:
    bufs = storage.buffers  # type: ignore[attr-defined]
    if how == "pickle-storage":  # a spawn/forkserver DataLoader worker, a Queue
        ForkingPickler(io.BytesIO()).dump(storage)
    elif how == "pickle-item":  # a view of one slot, sent to another process
        ForkingPickler(io.BytesIO()).dump(storage[3])
    elif how == "share-one":  # share_memory_ of one leaf's buffer
        bufs[-1].share_memory_()
    elif how == "share-all":
        for buf in bufs:
            buf.share_memory_()
    else:
        raise SystemExit(f"unknown move {how}")


def check(rb: ReplayBuffer, model: list[int | None]) -> None:
    n = len(rb.storage)
    assert n == CAP, n
    got = rb.storage[list(range(CAP))]
    for leaf, sign in (("observation", 1.0), (("next", "reward"), -1.0)):
        values = got[leaf].reshape(CAP, -1)[:, 0].tolist()
        want = [sign * float(k) for k in model]  # type: ignore[arg-type]
        assert values == want, (leaf, values, want)
    assert got["action"].tolist() == model
    assert got["next", "done"].tolist() == [k % 3 == 0 for k in model]  # type: ignore[operator]
    for slot in (0, 5, CAP - 1):  # single items (the per-item path) too
        assert int(rb.storage[slot]["action"]) == model[slot]


def main(kind: str, how: str, tmp: Path) -> None:
    rb, model = make(kind, tmp)
    cursor, k = 0, 1000

    def put(n: int) -> list[int]:
        nonlocal cursor, k
        ks = list(range(k, k + n))
        for v in ks:
            model[cursor] = v
            cursor = (cursor + 1) % CAP
        k += n
        return ks

    for _ in range(2):  # the second time, the memory is already shared
        move(rb.storage, how)
        for _ in range(CAP + 3):  # per-step add, a dict and a TensorDict, round the ring
            (v,) = put(1)
            rb.add(item(v) if v % 2 else TensorDict(item(v), []))
        check(rb, model)
        move(rb.storage, how)
        for n in (1, 5, CAP - 7, CAP):  # small extends (numpy rows) and large (torch)
            rb.extend(batch(put(n)))
            check(rb, model)
        move(rb.storage, how)
        slots = [7, 2, 40, 63, 0]
        ks = list(range(k, k + len(slots)))
        k += len(slots)
        rb.storage.set(torch.tensor(slots), batch(ks))
        for slot, v in zip(slots, ks, strict=True):
            model[slot] = v
        rb.storage.set(11, TensorDict(item(k), []))
        model[11] = k
        k += 1
        check(rb, model)  # writes at positions: the ring goes on at its cursor, shared or not


MOVES = ("pickle-storage", "pickle-item", "share-one", "share-all")


def loader_epochs(kind: str, tmp: Path) -> None:
    """A spawned DataLoader worker started after a write sees it (and the parent survives)."""
    from torch.utils.data import DataLoader

    rb, model = make(kind, tmp)
    for epoch in range(2):
        loader = DataLoader(
            rb.storage, batch_size=16, num_workers=1, multiprocessing_context="spawn"
        )
        got = torch.cat([b["action"] for b in loader]).tolist()
        assert got == model, (epoch, got, model)
        ks = list(range(5000 + 100 * epoch, 5000 + 100 * epoch + CAP))
        for v in ks[:10]:  # per-step adds after the workers were started from a pickle
            rb.add(item(v))
        rb.extend(batch(ks[10:]))
        model[:] = ks
        check(rb, model)


if __name__ == "__main__":
    kind, how, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    if how == "loader":
        loader_epochs(kind, root)
    else:
        for i, name in enumerate(MOVES if how == "all" else (how,)):
            (root / str(i)).mkdir()
            main(kind, name, root / str(i))
    print("OK")
