"""Issue 22 §4: ``rb.loads(path)`` loads into ``rb``; a loaded private copy flushes and says so.

Expectations are independent of the checkpoint code: the saved buffer itself, continuing in
lockstep with the loaded one, snapshots taken before a refused load, and the files' bytes.
"""

from __future__ import annotations

import inspect
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from test_checkpoint import files_digest, live
from torch.utils.data import DataLoader

from rbdata import (
    ArrowStorage,
    ListStorage,
    MaxValueWriter,
    MemmapStorage,
    PrioritizedSampler,
    ReplayBuffer,
    SliceSampler,
    TensorStorage,
    UniformSampler,
)
from rbdata.errors import CheckpointError

CAP = 48


def steps(n: int, start: int = 0) -> TensorDict:
    """``n`` steps whose every field is a function of the step id."""
    ids = torch.arange(start, start + n)
    f = ids.to(torch.float32)
    return TensorDict(
        {"id": ids, "obs": torch.stack([f, -f], 1), "done": (ids % 5 == 4).unsqueeze(1)},
        batch_size=[n],
    )


STORAGES: dict[str, Callable[[], Any]] = {
    "tensor": lambda: TensorStorage(CAP),
    "memmap": lambda: MemmapStorage(CAP),
    "arrow": lambda: ArrowStorage(CAP, chunk_size=16),
    "list": lambda: ListStorage(CAP),
}
SAMPLERS: dict[str, Callable[[int], Any]] = {
    "uniform": lambda seed: UniformSampler(generator=torch.Generator().manual_seed(seed)),
    "prioritized": lambda seed: PrioritizedSampler(
        CAP, alpha=0.7, beta=0.5, generator=torch.Generator().manual_seed(seed)
    ),
    "slice": lambda seed: SliceSampler(
        slice_len=4, end_key="done", generator=torch.Generator().manual_seed(seed)
    ),
}


def make(storage: str, sampler: str, seed: int = 0) -> ReplayBuffer:
    return ReplayBuffer(STORAGES[storage](), SAMPLERS[sampler](seed), batch_size=8)


def fill(rb: ReplayBuffer) -> None:
    """Past the capacity (the ring wraps), a few draws, some priorities."""
    for n, start in ((30, 0), (25, 30)):
        rb.extend(steps(n, start))
    rb.sample()
    if isinstance(rb.sampler, PrioritizedSampler):
        idx = torch.arange(0, len(rb), 3)
        rb.update_priority(idx, (idx % 5 + 1).to(torch.float32) / 3)


def rows(rb: ReplayBuffer) -> dict[str, list[Any]]:
    """Every stored item as plain lists by key, read one slot at a time."""
    got: dict[str, list[Any]] = {}
    for i in range(len(rb)):
        item = rb.storage[i]
        for key in item.keys(include_nested=True, leaves_only=True):
            got.setdefault(str(key), []).append(item[key].tolist())
    return got


def state(value: Any) -> Any:
    """A state dict as plain, comparable values."""
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), value.tolist())
    if isinstance(value, dict):
        return {k: state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [state(v) for v in value]
    return value


def snapshot(rb: ReplayBuffer) -> dict[str, Any]:
    return {
        "len": len(rb),
        "next": rb.storage.next_slot,
        "rows": rows(rb),
        "sampler": state(rb.sampler.state_dict()),
        "writer": state(rb.writer.state_dict()),
        "batch_size": rb.batch_size,
    }


def batches_equal(a: TensorDictBase, b: TensorDictBase) -> bool:
    keys = sorted(a.keys(include_nested=True, leaves_only=True), key=str)
    if keys != sorted(b.keys(include_nested=True, leaves_only=True), key=str):
        return False
    return all(torch.equal(a[k], b[k]) for k in keys)


def assert_lockstep(reference: ReplayBuffer, other: ReplayBuffer, rounds: int = 3) -> None:
    """``other`` behaves exactly like ``reference``: contents, draws, writes, priorities."""
    assert snapshot(other) == snapshot(reference)
    for r in range(rounds):
        expected = reference.sample()
        assert batches_equal(expected, other.sample()), f"round {r}: another batch"
        if isinstance(reference.sampler, PrioritizedSampler):
            prio = (expected["index"] % 7 + 1).to(torch.float32)
            reference.update_priority(expected["index"], prio)
            other.update_priority(expected["index"], prio)
        new = steps(7, 1000 + 10 * r)
        assert torch.equal(reference.extend(new), other.extend(new.clone()))
        assert snapshot(other) == snapshot(reference), f"round {r}"


# --- 1. rb.loads(path) on a buffer loads into it ----------------------------------------------
@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("storage", list(STORAGES))
def test_loads_on_a_buffer_loads_into_it_and_returns_it(
    tmp_path: Path, storage: str, sampler: str
) -> None:
    rb = make(storage, sampler)
    fill(rb)
    rb.dumps(tmp_path / "ckpt")
    target = make(storage, sampler, seed=42)
    target.extend(steps(20, 5000))  # other contents and another generator: all replaced
    own = (target.storage, target.sampler, target.writer)
    assert target.loads(tmp_path / "ckpt") is target
    assert (target.storage, target.sampler, target.writer) == own  # the same objects, filled
    assert_lockstep(rb, target)


def test_a_resumed_run_does_not_train_on_an_empty_buffer(tmp_path: Path) -> None:
    """The torchrl pattern: build the buffer (and a DataLoader over its storage), then load."""
    rb = ReplayBuffer(MemmapStorage(CAP), batch_size=8)
    rb.extend(steps(40))
    rb.dumps(tmp_path / "ckpt")
    resumed = ReplayBuffer(MemmapStorage(CAP), batch_size=8)
    loader = DataLoader(resumed.storage, batch_size=16, collate_fn=lambda batch: batch)
    resumed.loads(tmp_path / "ckpt")
    assert len(resumed) == 40
    ids = sorted(i for batch in loader for i in batch["id"].tolist())
    assert ids == list(range(40))  # the loader made before the load reads the loaded items
    assert set(resumed.sample()["id"].tolist()) <= set(range(40))
    resumed.storage.close()
    rb.storage.close()


MISMATCHES: dict[str, tuple[str, Callable[[], ReplayBuffer]]] = {
    "storage class": ("storage", lambda: ReplayBuffer(TensorStorage(CAP), _prioritized())),
    "capacity": ("storage", lambda: ReplayBuffer(MemmapStorage(CAP + 1), _prioritized(CAP + 1))),
    "sampler class": ("sampler", lambda: ReplayBuffer(MemmapStorage(CAP), UniformSampler())),
    "alpha": ("sampler", lambda: ReplayBuffer(MemmapStorage(CAP), _prioritized(alpha=0.6))),
    "writer": (
        "writer",
        lambda: ReplayBuffer(MemmapStorage(CAP), _prioritized(), MaxValueWriter("id")),
    ),
    "layout": ("storage", lambda: ReplayBuffer(MemmapStorage(CAP), _prioritized())),
}


def _prioritized(cap: int = CAP, alpha: float = 0.7) -> PrioritizedSampler:
    return PrioritizedSampler(cap, alpha=alpha, beta=0.5)


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_loads_on_a_mismatched_buffer_refuses_and_changes_nothing(
    tmp_path: Path, case: str
) -> None:
    source = ReplayBuffer(MemmapStorage(CAP), _prioritized(), batch_size=8)
    fill(source)
    source.dumps(tmp_path / "ckpt")
    kind, build = MISMATCHES[case]
    target = build()
    if case == "layout":
        target.extend(TensorDict({"other": torch.arange(20.0)}, [20]))
    else:
        target.extend(steps(20, 300))
    target.sample(4)
    transform = target.transform
    before = snapshot(target)
    with pytest.raises(ValueError, match=rf"^{kind}: .*this buffer(.s| has)") as info:
        target.loads(tmp_path / "ckpt", transform=lambda batch: batch)
    assert not isinstance(info.value, CheckpointError)
    assert snapshot(target) == before
    assert target.transform is transform  # not replaced by a refused load
    target.sample(4)  # and it goes on working


def test_loads_on_a_buffer_keeps_its_batch_size_and_takes_a_transform(tmp_path: Path) -> None:
    rb = ReplayBuffer(TensorStorage(CAP), batch_size=8)
    rb.extend(steps(10))
    rb.dumps(tmp_path / "ckpt")
    target = ReplayBuffer(TensorStorage(CAP), batch_size=3, transform=lambda b: b["id"])
    assert target.loads(tmp_path / "ckpt") is target
    assert target.batch_size == 3 and target.sample().shape == (3,)  # transform kept
    assert target.loads(tmp_path / "ckpt", transform=lambda b: b["id"] * 0 - 1) is target
    assert target.sample().tolist() == [-1, -1, -1]
    with pytest.raises(TypeError, match="transform must be callable, got int"):
        target.loads(tmp_path / "ckpt", transform=3)  # type: ignore[arg-type]


def test_loads_on_a_buffer_verifies_before_changing_anything(tmp_path: Path) -> None:
    rb = ReplayBuffer(MemmapStorage(CAP), batch_size=8)
    rb.extend(steps(40))
    rb.dumps(tmp_path / "ckpt")
    data = next(p for p in (live(tmp_path / "ckpt") / "storage").iterdir() if "id" in p.name)
    raw = bytearray(data.read_bytes())
    raw[8] ^= 0xFF  # same size: only the checksum sees it
    data.write_bytes(bytes(raw))
    target = ReplayBuffer(MemmapStorage(CAP), batch_size=8)
    target.extend(steps(5, 900))
    before = snapshot(target)
    with pytest.raises(CheckpointError, match=re.escape(data.name)):
        target.loads(tmp_path / "ckpt", verify=True)
    assert snapshot(target) == before
    # the default load checksums files of up to 64 KiB too: refused, nothing changed
    with pytest.raises(CheckpointError, match=re.escape(data.name)):
        target.loads(tmp_path / "ckpt")
    assert snapshot(target) == before


def test_loads_on_the_class_still_builds_a_new_buffer(tmp_path: Path) -> None:
    class Custom(ReplayBuffer):
        pass

    rb = ReplayBuffer(TensorStorage(CAP), batch_size=8)
    rb.extend(steps(10))
    rb.dumps(tmp_path / "ckpt")
    new = ReplayBuffer.loads(tmp_path / "ckpt", transform=lambda b: b["id"])
    assert type(new) is ReplayBuffer and new is not rb and len(new) == 10
    assert new.batch_size == 8 and new.sample().shape == (8,)
    sub = Custom.loads(tmp_path / "ckpt")
    assert type(sub) is Custom and len(sub) == 10
    into = Custom(TensorStorage(CAP))
    assert into.loads(tmp_path / "ckpt") is into and len(into) == 10


def test_loads_reads_the_same_on_the_class_and_on_a_buffer() -> None:
    """``help(rb.loads)`` and ``help(ReplayBuffer.loads)``: one signature, one docstring."""
    rb = ReplayBuffer(TensorStorage(4))
    expected = ["path", "transform", "verify"]
    assert list(inspect.signature(ReplayBuffer.loads).parameters) == expected
    assert list(inspect.signature(rb.loads).parameters) == expected
    doc = ReplayBuffer.__dict__["loads"].__doc__
    assert doc is not None and "load into" in doc.lower() and ">>> resumed.loads(path)" in doc
    assert ReplayBuffer.loads.__doc__ == doc


# --- 2. a private copy loaded from a checkpoint, then the checkpoint dumped over ---------------
def test_flush_of_a_loaded_storage_after_dumps_over_its_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    rb = ReplayBuffer(MemmapStorage(CAP), batch_size=8)
    rb.extend(steps(40))
    rb.dumps(path)
    loaded = ReplayBuffer.loads(path)
    source = live(path) / "storage"
    loaded.extend(steps(5, 700))
    loaded.dumps(path)  # the same path: the directory the copy was mapped from is removed
    assert not source.exists()
    loaded.storage.flush()  # FileNotFoundError on ckpt-<old>/... before
    assert loaded.storage.path == source  # where it came from, as repr says:
    assert repr(loaded.storage).endswith(f"private copy of {str(source)!r})")
    loaded.extend(steps(3, 800))  # goes on working
    loaded.storage.flush()
    assert rows(loaded)["id"][40:48] == [*range(700, 705), *range(800, 803)]
    assert rows(ReplayBuffer.loads(path))["id"] == [*range(40), *range(700, 705)]


def test_flush_of_a_private_copy_never_writes_the_files(tmp_path: Path) -> None:
    storage = MemmapStorage(CAP, path=tmp_path / "st")
    storage.set(slice(0, 10), steps(10))
    storage.close()
    before = files_digest(tmp_path / "st")
    copy = MemmapStorage.open(tmp_path / "st", copy_on_write=True)
    copy.set(slice(0, 4), steps(4, 100))
    copy.flush()
    received = pickle.loads(pickle.dumps(copy))  # a private copy pickles its data
    received.set(5, steps(1, 200)[0])
    received.flush()
    assert repr(received).endswith(f"private copy of {str(tmp_path / 'st')!r})")
    assert files_digest(tmp_path / "st") == before
    assert [int(copy[i]["id"]) for i in range(6)] == [100, 101, 102, 103, 4, 5]
    copy.close()
    received.close()


def test_repr_of_a_memmap_storage_names_its_directory(tmp_path: Path) -> None:
    storage = MemmapStorage(CAP, path=tmp_path / "st")
    assert repr(storage).endswith(f"path={str(tmp_path / 'st')!r})")
    assert "private copy" not in repr(storage)
    storage.close()
