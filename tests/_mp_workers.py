"""Worker functions for ``tests/storages/test_multiprocess.py`` (spawn children import them)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict


def items(worker: int, start: int, n: int, width: int = 4) -> TensorDict:
    """``n`` distinct items of ``worker``: every field of row ``i`` encodes (worker, start + i)."""
    seq = torch.arange(start, start + n, dtype=torch.int64)
    code = worker * 1_000_000 + seq
    return TensorDict(
        {
            "worker": torch.full((n,), worker, dtype=torch.int64),
            "seq": seq,
            "observation": code.unsqueeze(1).expand(n, width).to(torch.float64).clone(),
            ("next", "done"): (seq % 7 == 6).unsqueeze(1),
        },
        batch_size=[n],
    )


def extend_many(rb: Any, worker: int, total: int, chunk: int, barrier: Any = None) -> None:
    """Extend ``rb`` with ``total`` items of ``worker`` in batches of ``chunk``."""
    if barrier is not None:
        barrier.wait()
    for start in range(0, total, chunk):
        rb.extend(items(worker, start, min(chunk, total - start)))


def extend_ten(rb: Any) -> None:
    """The seeds' example worker: 10 more items."""
    rb.extend(items(1, 0, 10))


def storage_extend(storage: Any, worker: int, total: int, chunk: int) -> None:
    """Extend a bare storage through a ring writer (what a buffer does)."""
    from rbdata.writers import RoundRobinWriter

    writer = RoundRobinWriter()
    for start in range(0, total, chunk):
        writer.extend(storage, items(worker, start, min(chunk, total - start)))


def arrow_extend(storage: Any, queue: Any) -> None:
    """Try to extend an ArrowStorage from a second process; report the error."""
    try:
        storage.set(slice(0, 2), items(2, 0, 2))
    except Exception as err:
        queue.put(f"{type(err).__name__}: {err}")
    else:
        queue.put("no error")


def extend_both(first: Any, second: Any, worker: int, barrier: Any) -> None:
    """4 x 10,000 into ``first`` (all fit), then 4 x 20,000 into ``second`` (wraps)."""
    barrier.wait()
    extend_many(first, worker, 10_000, 1_000)
    barrier.wait()
    extend_many(second, worker, 20_000, 1_000)


def extend_ten_each(buffers: list[Any]) -> None:
    """The seeds' example worker for several buffers at once (one spawn start-up)."""
    for rb in buffers:
        rb.extend(items(1, 0, 10))
