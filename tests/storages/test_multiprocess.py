"""Many processes, one MemmapStorage: concurrent writers, the seeds' example, the learner.

Worker functions live in ``tests/_mp_workers.py`` (spawned children import them by name).
Spawned processes are few and started together: each costs seconds on two cores.
"""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _paths import TESTS_DIR
from torch.utils.data import DataLoader

from rbdata import ReplayBuffer
from rbdata.samplers import (
    PrioritizedSampler,
    SamplerWithoutReplacement,
    SliceSampler,
    UniformSampler,
)
from rbdata.storages import ArrowStorage, MemmapStorage

sys.path.insert(0, str(TESTS_DIR))
import _mp_workers as workers

TIMEOUT = 120


def _join(procs: list) -> None:
    for p in procs:
        p.join(TIMEOUT)
    assert [p.exitcode for p in procs] == [0] * len(procs)


def _codes(storage: MemmapStorage) -> torch.Tensor:
    """(worker, seq) of every present item as one int64 code; every field checked whole."""
    data = storage[torch.arange(len(storage))]
    code = data["worker"] * 1_000_000 + data["seq"]
    whole = (data["observation"] == code.unsqueeze(1).to(torch.float64)).all(1)
    assert bool(whole.all()), f"{int((~whole).sum())} torn items"
    assert torch.equal(data["next", "done"].squeeze(1), data["seq"] % 7 == 6)
    return code


def test_four_spawned_writers_lose_nothing_and_keep_ring_suffixes(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    first = ReplayBuffer(storage=MemmapStorage(40_000, tmp_path / "a"))
    second = ReplayBuffer(storage=MemmapStorage(40_000, tmp_path / "b"))
    barrier = ctx.Barrier(4)
    procs = [
        ctx.Process(target=workers.extend_both, args=(first, second, w, barrier)) for w in range(4)
    ]
    for p in procs:
        p.start()
    _join(procs)
    # 4 x 10,000 <= capacity: every item exactly once
    codes = _codes(first.storage)
    assert len(first) == 40_000 and codes.unique().numel() == 40_000
    expected = torch.cat([w * 1_000_000 + torch.arange(10_000) for w in range(4)])
    assert torch.equal(codes.sort().values, expected.sort().values)
    assert first.storage.write_count == 40_000
    # 4 x 20,000 into 40,000: full, no duplicate, each whole, a suffix per process
    storage = second.storage
    codes = _codes(storage)
    assert len(second) == 40_000 and codes.unique().numel() == 40_000
    assert storage.write_count == 80_000
    for w in range(4):
        seq = (codes[codes // 1_000_000 == w] % 1_000_000).sort().values
        if seq.numel():
            assert torch.equal(seq, torch.arange(20_000 - seq.numel(), 20_000)), w


def _samplers() -> dict[str, object]:
    return {
        "uniform": UniformSampler(),
        "without_replacement": SamplerWithoutReplacement(),
        "prioritized": PrioritizedSampler(21, alpha=0.7, beta=0.5),
        "slice": SliceSampler(slice_len=2),
    }


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_seeds_example_every_sampler(method: str) -> None:
    ctx = mp.get_context(method)
    buffers = {}
    for name, sampler in _samplers().items():
        rb = ReplayBuffer(storage=MemmapStorage(21), sampler=sampler)  # type: ignore[arg-type]
        rb.extend(workers.items(0, 0, 10))
        buffers[name] = rb
    p = ctx.Process(target=workers.extend_ten_each, args=(list(buffers.values()),))
    p.start()
    _join([p])
    for name, rb in buffers.items():
        assert len(rb) == 20, name
        batch = rb.sample(4) if name != "without_replacement" else rb.sample(20)
        assert int(batch["index"].max()) < 20, name
        if name == "without_replacement":  # one epoch: every item, the child's included
            assert sorted(batch["index"].tolist()) == list(range(20))
        if name == "prioritized":  # the child's items got the default priority
            seen = torch.cat([rb.sample(64)["index"] for _ in range(10)])
            assert bool((seen >= 10).any())
            rb.update_priority(seen, torch.ones(seen.numel()))
        if name == "slice":
            seen = torch.cat([rb.sample(32)["index"] for _ in range(10)])
            assert bool((seen >= 10).any())
        # the parent goes on writing after the child: one ring
        rb.extend(workers.items(2, 0, 1))
        assert len(rb) == 21 and int(rb.storage[20]["worker"]) == 2


def test_prioritized_learner_samples_items_of_two_writers() -> None:
    ctx = mp.get_context("spawn")
    rb = ReplayBuffer(
        storage=MemmapStorage(30_000), sampler=PrioritizedSampler(30_000, alpha=0.6, beta=0.4)
    )
    rb.extend(workers.items(0, 0, 100))
    procs = [ctx.Process(target=workers.extend_many, args=(rb, w, 10_000, 100)) for w in (1, 2)]
    for p in procs:
        p.start()
    sampled = []
    deadline = time.monotonic() + TIMEOUT
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        batch = rb.sample(256)
        idx, n = batch["index"], len(rb)
        assert int(idx.max()) < n
        code = batch["worker"] * 1_000_000 + batch["seq"]
        assert torch.equal(batch["observation"][:, 0], code.to(torch.float64))  # written items
        rb.update_priority(idx, torch.rand(idx.numel()) + 0.1)
        sampled.append(batch["worker"])
    _join(procs)
    assert len(rb) == 20_100
    batch = rb.sample(4096)
    sampled.append(batch["worker"])
    workers_seen = set(torch.cat(sampled).tolist())
    assert {1, 2} <= workers_seen
    assert int(batch["index"].max()) < 20_100


def test_dataloader_workers_read_while_a_process_writes() -> None:
    ctx = mp.get_context("fork")
    storage = MemmapStorage(20_000)
    rb = ReplayBuffer(storage=storage)
    rb.extend(workers.items(0, 0, 2_000))
    writer = ctx.Process(target=workers.extend_many, args=(rb, 1, 18_000, 500))
    writer.start()
    loader = DataLoader(
        storage, batch_size=250, num_workers=2, sampler=range(2_000), collate_fn=lambda b: b
    )
    rows = 0
    for _ in range(2):
        for batch in loader:
            code = batch["worker"] * 1_000_000 + batch["seq"]
            assert torch.equal(batch["observation"][:, 0], code.to(torch.float64))
            rows += batch.shape[0]
    _join([writer])
    assert rows == 4_000 and len(storage) == 20_000
    _codes(storage)


def test_arrow_storage_refuses_a_second_writer_process(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    storage = ArrowStorage(10, tmp_path / "arrow")
    storage.set(slice(0, 2), workers.items(0, 0, 2))
    messages = []
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        queue = ctx.Queue()
        p = ctx.Process(target=workers.arrow_extend, args=(storage, queue))
        p.start()
        messages.append(queue.get(timeout=TIMEOUT))
        _join([p])
    for message in messages:
        assert message.startswith("RuntimeError") and "does not own it" in message
    assert [int(w) for w in storage[torch.arange(2)]["worker"]] == [0, 0]
    storage.set(slice(2, 3), workers.items(0, 2, 1))  # the owner still writes
    assert len(storage) == 3


def test_shared_counter_and_fork_make_the_parent_shared() -> None:
    storage = MemmapStorage(8)
    storage.set(slice(0, 3), workers.items(0, 0, 3))
    assert storage.write_count == 3 and not storage.shared
    assert not (storage.path / "shared.bin").exists()
    rb = ReplayBuffer(storage=storage)
    ctx = mp.get_context("fork")
    p = ctx.Process(target=workers.extend_many, args=(rb, 1, 7, 7))
    p.start()
    _join([p])
    assert storage.shared and (storage.path / "shared.bin").exists()
    assert storage.write_count == 10 and len(storage) == 8
    assert storage.next_slot == 2  # the child's ring: slots 3..7 then 0, 1
    rb.extend(workers.items(2, 0, 1))  # the parent writes where the child stopped
    assert int(storage[2]["worker"]) == 2 and storage.write_count == 11


def test_import_keeps_the_start_method() -> None:
    code = (
        "import multiprocessing as mp\n"
        "before = mp.get_start_method(allow_none=True)\n"
        "import rbdata, rbdata.storages, rbdata.samplers, rbdata.writers\n"
        "assert mp.get_start_method(allow_none=True) == before, before\n"
        "print(before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"


def test_learner_catches_up_when_others_wrote_more_than_the_capacity() -> None:
    rb = ReplayBuffer(storage=MemmapStorage(8), sampler=PrioritizedSampler(8, alpha=1.0, beta=0.4))
    rb.extend(workers.items(0, 0, 3))
    rb.update_priority(torch.arange(3), torch.full((3,), 1e-6))  # the parent's items: ~never
    ctx = mp.get_context("fork")
    p = ctx.Process(target=workers.extend_many, args=(rb, 1, 20, 4))
    p.start()
    _join([p])
    assert len(rb) == 8 and rb.storage.write_count == 23
    seen = set(rb.sample(4096)["index"].tolist())
    assert seen == set(range(8))  # every slot now holds the child's items, default priority
    assert set(rb.storage[torch.arange(8)]["worker"].tolist()) == {1}


def test_own_storage_set_on_a_shared_storage_is_not_another_process_write() -> None:
    """Found by the model-based test: on a shared storage, this process's ``storage.set``
    (bypassing the buffer) reached the sampler as if another process had written: the slice
    sampler then refused the next ``len``; the prioritized one reset the slot's priority."""
    done = torch.zeros(4, 1, dtype=torch.bool)
    rb = ReplayBuffer(MemmapStorage(8), sampler=SliceSampler(slice_len=2))
    rb.extend({"t": torch.arange(4), "next": {"done": done}})
    rb.storage.share()
    for slot in (1, 3):  # two bypassing writes (shared: the ring goes on after slot 3)
        rb.storage.set(slot, {"t": torch.tensor(100 + slot), "next": {"done": done[0]}})
    assert len(rb) == 4
    rb.extend({"t": torch.arange(4, 6), "next": {"done": done[:2]}})  # the buffer's own write
    assert len(rb) == 6 and rb.storage[[1, 3, 5]]["t"].tolist() == [101, 103, 5]

    pr = ReplayBuffer(MemmapStorage(8), sampler=PrioritizedSampler(8, alpha=1.0, beta=1.0))
    pr.extend({"t": torch.arange(4)})
    pr.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    pr.storage.share()
    pr.storage.set(1, {"t": torch.tensor(100)})
    pr.storage.set(torch.tensor([2, 3]), {"t": torch.tensor([7, 8])})
    assert len(pr) == 4
    assert pr.sampler.priority_values()[:4].tolist() == [1.0, 2.0, 3.0, 4.0]  # type: ignore[attr-defined]
    pr.add({"t": torch.tensor(9)})  # then the buffer's own add: the default (max) priority
    assert pr.sampler.priority_values()[:5].tolist() == [1.0, 2.0, 3.0, 4.0, 4.0]  # type: ignore[attr-defined]
    rb.storage.close()
    pr.storage.close()
