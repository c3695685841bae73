"""Checkpoints: exact continuation, state dicts, ``load``, copy-on-write, tampering, atomicity.

Every expectation is independent of the checkpoint code: the original buffer continuing in
lockstep with the loaded one, contents snapshotted before saving, or the bytes of the files.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, TensorDictBase

import rbdata.checkpoint
from rbdata import (
    ArrowStorage,
    ImmutableWriter,
    ListStorage,
    MaxValueWriter,
    MemmapStorage,
    PrioritizedSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorStorage,
    UniformSampler,
)
from rbdata.errors import CheckpointError, ReadOnlyError

CAP = 64
BATCH = 8  # a multiple of the slice length


# --- data and helpers ------------------------------------------------------------------------
def steps(n: int, start: int = 0) -> TensorDict:
    """``n`` steps whose every field is a function of the step id (episodes of varying length)."""
    ids = torch.arange(start, start + n)
    f = ids.to(torch.float32)
    done = (ids % 7 == 6) | (ids % 11 == 10)
    return TensorDict(
        {
            "id": ids,
            "obs": torch.stack([f, f + 0.5, -f], dim=1),
            "done": done.unsqueeze(1),
            ("next", "return"): ((ids * 7919) % 101).to(torch.float32),
        },
        batch_size=[n],
    )


STORAGES: dict[str, Callable[[int], Any]] = {
    "tensor": lambda cap: TensorStorage(cap),
    "memmap": lambda cap: MemmapStorage(cap),
    "arrow": lambda cap: ArrowStorage(cap, chunk_size=16),
    "list": lambda cap: ListStorage(cap),
}

SAMPLERS: dict[str, Callable[[int, int], Any]] = {
    "uniform": lambda cap, seed: UniformSampler(generator=torch.Generator().manual_seed(seed)),
    "without_replacement": lambda cap, seed: SamplerWithoutReplacement(
        generator=torch.Generator().manual_seed(seed)
    ),
    "prioritized": lambda cap, seed: PrioritizedSampler(
        cap, alpha=0.7, beta=0.5, generator=torch.Generator().manual_seed(seed)
    ),
    "slice": lambda cap, seed: SliceSampler(
        slice_len=4, end_key="done", generator=torch.Generator().manual_seed(seed)
    ),
}


def make_buffer(
    storage: str, sampler: str, seed: int = 0, cap: int = CAP, writer: Any = None
) -> ReplayBuffer:
    return ReplayBuffer(
        STORAGES[storage](cap), SAMPLERS[sampler](cap, seed), writer=writer, batch_size=BATCH
    )


def assert_same(a: Any, b: Any, where: str = "value") -> None:
    """Deep equality: same types, same keys, tensors equal in dtype, shape and values."""
    if isinstance(a, TensorDictBase):
        assert isinstance(b, TensorDictBase), where
        assert a.batch_size == b.batch_size, where
        keys_a = sorted(a.keys(include_nested=True, leaves_only=True), key=str)
        keys_b = sorted(b.keys(include_nested=True, leaves_only=True), key=str)
        assert keys_a == keys_b, where
        for key in keys_a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a!r} vs {b!r}"
        assert torch.equal(a.cpu(), b.cpu()), f"{where}: {a!r} vs {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: {a!r} vs {b!r}"
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} vs {b!r}"


def items(rb: ReplayBuffer) -> Any:
    """Every stored item: one batch read for tensor data, else a list read one at a time."""
    if len(rb) and rb.storage.layout is not None:
        return rb.storage[torch.arange(len(rb))]  # a gather: a copy, not a view
    out = []
    for i in range(len(rb)):
        item = rb.storage[i]
        out.append(item.clone() if isinstance(item, (torch.Tensor, TensorDictBase)) else item)
    return out


def snapshot(rb: ReplayBuffer) -> dict[str, Any]:
    """Everything observable about a buffer's state, deep-copied."""
    return {
        "len": len(rb),
        "next": rb.storage.next_slot,
        "items": items(rb),
        "sampler": sampler_state(rb),
        "writer": rb.writer.state_dict(),
    }


def sampler_state(rb: ReplayBuffer) -> dict[str, Any]:
    return rb.sampler.state_dict()


def assert_lockstep(
    reference: ReplayBuffer, *others: ReplayBuffer, rounds: int = 4, start: int = 1000
) -> None:
    """Each of ``others`` behaves exactly like ``reference``: samples, extends, priorities."""

    def check_state(where: str) -> None:
        for other in others:
            assert len(other) == len(reference), where
            assert other.storage.next_slot == reference.storage.next_slot, where
            assert_same(sampler_state(reference), sampler_state(other), f"{where} sampler")
            assert_same(reference.writer.state_dict(), other.writer.state_dict(), f"{where} writer")

    check_state("initial")
    assert_same([items(reference)] * len(others), [items(o) for o in others], "initial items")
    for r in range(rounds):
        for _ in range(2):
            expected = reference.sample()
            for other in others:
                assert_same(expected, other.sample(), f"round {r} batch")
        if isinstance(reference.sampler, PrioritizedSampler):
            idx = expected["index"]
            prio = (idx.to(torch.float32) % 13 + 1) / 7
            for buffer in (reference, *others):
                buffer.update_priority(idx.clone(), prio.clone())
        data = steps(5 + 3 * r, start + 100 * r)
        slots = reference.extend(data)
        for other in others:
            assert_same(slots, other.extend(data.clone()), f"round {r} slots")
        check_state(f"round {r}")
    assert_same([items(reference)] * len(others), [items(o) for o in others], "final items")


def assert_same_draws(a: ReplayBuffer, b: ReplayBuffer, n: int) -> None:
    """The samplers draw the same slots, holding the same objects (read one by one: a batch
    of mixed Python objects is not always collatable)."""
    index_a, index_b = a.sampler.sample(n), b.sampler.sample(n)
    assert_same(index_a, index_b, "drawn slots")
    assert_same([a.storage[i] for i in index_a.tolist()], [b.storage[i] for i in index_b.tolist()])


def fill(rb: ReplayBuffer) -> None:
    """Fill past the capacity (the ring wraps), sample a little, update some priorities."""
    for n, start in ((40, 0), (30, 40), (20, 70)):
        rb.extend(steps(n, start))
    rb.sample()
    rb.sample()
    if isinstance(rb.sampler, PrioritizedSampler):
        idx = torch.arange(0, len(rb), 3)
        rb.update_priority(idx, (idx % 5 + 1).to(torch.float32) / 3)


def files_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def live(path: Path) -> Path:
    return path / (path / "CURRENT").read_text().strip()


def entries(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()}


# --- 1. exact continuation ---------------------------------------------------------------
@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("storage", list(STORAGES))
def test_loads_continues_exactly(tmp_path: Path, storage: str, sampler: str) -> None:
    rb = make_buffer(storage, sampler)
    fill(rb)
    assert len(rb) == CAP  # wrapped
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    assert type(loaded.storage) is type(rb.storage)
    assert type(loaded.sampler) is type(rb.sampler)
    assert type(loaded.writer) is RoundRobinWriter
    assert loaded.batch_size == BATCH
    assert loaded.sampler.data_source is loaded.storage
    assert_lockstep(rb, loaded)


def test_loads_restores_the_slice_sampler_state_as_saved(tmp_path: Path) -> None:
    rb = make_buffer("memmap", "slice")
    fill(rb)
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    assert_same(rb.sampler.state_dict(), loaded.sampler.state_dict())


@pytest.mark.parametrize(
    "sampler",
    [
        "uniform",
        "without_replacement",
        "prioritized",
        "slice",
    ],
)
@pytest.mark.parametrize("storage", ["memmap", "tensor"])
def test_loads_reads_no_items(
    tmp_path: Path, storage: str, sampler: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rb = make_buffer(storage, sampler)
    fill(rb)
    rb.dumps(tmp_path / "ckpt")
    reads: list[int] = []
    real = TensorStorage.gather

    def counting(self: TensorStorage, idx: torch.Tensor, extra: Any) -> Any:
        reads.append(int(idx.numel()))
        return real(self, idx, extra)

    monkeypatch.setattr(TensorStorage, "gather", counting)
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    assert reads == [], f"loads read {sum(reads)} items"
    assert_same(rb.sample(), loaded.sample())


@pytest.mark.parametrize("how", ["loads", "from_state_dict"])
def test_all_zero_priorities_survive_loads(tmp_path: Path, how: str) -> None:
    rb = ReplayBuffer(TensorStorage(16), PrioritizedSampler(16, alpha=1.0, beta=0.5, eps=0.0))
    rb.extend(steps(16))
    rb.update_priority(torch.arange(16), torch.zeros(16))  # eps=0: nothing can be sampled
    with pytest.raises(ValueError, match="every priority"):
        rb.sample(4)
    if how == "loads":
        rb.dumps(tmp_path / "ckpt")
        loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    else:
        loaded = ReplayBuffer.from_state_dict(rb.state_dict())
    assert_same(rb.sampler.state_dict(), loaded.sampler.state_dict())


def test_all_zero_priorities_survive_load_into_a_buffer(tmp_path: Path) -> None:
    rb = ReplayBuffer(TensorStorage(16), PrioritizedSampler(16, alpha=1.0, beta=0.5, eps=0.0))
    rb.extend(steps(16))
    rb.update_priority(torch.arange(16), torch.zeros(16))
    rb.dumps(tmp_path / "ckpt")
    target = ReplayBuffer(TensorStorage(16), PrioritizedSampler(16, alpha=1.0, beta=0.5, eps=0.0))
    target.load(tmp_path / "ckpt")
    assert_same(rb.sampler.state_dict(), target.sampler.state_dict())
    with pytest.raises(ValueError, match="every priority"):
        target.sample(4)


def _text_and_boxes(n: int, start: int = 0) -> dict[str, Any]:
    ids = torch.arange(start, start + n)
    return {
        "id": ids,
        "text": [f"step {i} " * (i % 3) for i in ids.tolist()],
        "boxes": [torch.full((i % 4, 2), float(i)) for i in ids.tolist()],
    }


def test_arrow_strings_and_ragged_continue_exactly(tmp_path: Path) -> None:
    def make(seed: int) -> ReplayBuffer:
        sampler = UniformSampler(generator=torch.Generator().manual_seed(seed))
        return ReplayBuffer(ArrowStorage(40, chunk_size=8), sampler, batch_size=6)

    rb = make(0)
    rb.extend(_text_and_boxes(30))
    rb.extend(_text_and_boxes(20, 30))  # wraps
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    target = make(5)
    target.extend(_text_and_boxes(5, 100))
    target.load(tmp_path / "ckpt")

    def plain(batch: Any) -> tuple[Any, ...]:
        boxes = [t.tolist() for t in batch["boxes"].unbind()]
        return batch["id"].tolist(), batch["text"].tolist(), boxes

    for r in range(3):
        expected = plain(rb.sample())
        assert plain(loaded.sample()) == expected and plain(target.sample()) == expected
        slots = rb.extend(_text_and_boxes(7, 200 + 10 * r))
        for other in (loaded, target):
            assert_same(slots, other.extend(_text_and_boxes(7, 200 + 10 * r)))
    everything = torch.arange(len(rb))
    assert plain(rb.storage[everything]) == plain(loaded.storage[everything])
    assert plain(rb.storage[everything]) == plain(target.storage[everything])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_buffer_continues_exactly(tmp_path: Path) -> None:
    def make(seed: int) -> ReplayBuffer:
        sampler = PrioritizedSampler(
            CAP, 0.7, 0.5, device="cuda", generator=torch.Generator().manual_seed(seed)
        )
        return ReplayBuffer(TensorStorage(CAP, device="cuda"), sampler, batch_size=BATCH)

    rb = make(0)
    fill(rb)
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    assert loaded.storage.device.type == "cuda"
    target = make(3)
    target.load(tmp_path / "ckpt")
    rebuilt = ReplayBuffer.from_state_dict(_through_torch_save(rb.state_dict()))
    assert_lockstep(rb, loaded, target, rebuilt)


def test_loads_takes_a_transform(tmp_path: Path) -> None:
    rb = make_buffer("tensor", "uniform")
    fill(rb)
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer.loads(tmp_path / "ckpt", transform=lambda batch: batch["id"] * 2)
    assert loaded.transform is not None
    assert torch.equal(loaded.sample(), rb.sample()["id"] * 2)


@pytest.mark.parametrize("storage", list(STORAGES))
def test_max_value_writer_continues_exactly(tmp_path: Path, storage: str) -> None:
    rb = make_buffer(storage, "uniform", writer=MaxValueWriter(("next", "return")))
    for start in range(0, 200, 25):
        rb.extend(steps(25, start))  # later batches replace only the lowest returns
    assert len(rb) == CAP
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    assert isinstance(loaded.writer, MaxValueWriter)
    assert loaded.writer.rank_key == ("next", "return")
    target = make_buffer(storage, "uniform", seed=4, writer=MaxValueWriter(("next", "return")))
    target.extend(steps(10, 3000))
    target.load(tmp_path / "ckpt")
    assert_lockstep(rb, loaded, target)
    low = steps(6, 5000)
    low["next", "return"] = torch.full((6,), -1.0)
    slots = rb.extend(low)
    assert slots.numel() == 0  # below every stored return: all dropped
    assert_same(slots, loaded.extend(low.clone()))
    assert_same(slots, target.extend(low.clone()))
    high = steps(1, 7777)[0]
    high["next", "return"] = torch.tensor(1e6)
    slot = rb.add(high)
    assert slot >= 0 and loaded.add(high.clone()) == slot == target.add(high.clone())
    assert_same(snapshot(rb), snapshot(loaded))
    assert_same(snapshot(rb), snapshot(target))


@pytest.mark.parametrize("storage", list(STORAGES))
def test_immutable_writer_continues_exactly(tmp_path: Path, storage: str) -> None:
    store = STORAGES[storage](CAP)
    store.set(slice(0, 50), steps(50))
    rb = ReplayBuffer(store, SAMPLERS["prioritized"](CAP, 3), ImmutableWriter(), batch_size=BATCH)
    rb.update_priority(torch.arange(10), torch.linspace(0.1, 5.0, 10))
    rb.sample()
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    assert isinstance(loaded.writer, ImmutableWriter)
    assert_same(items(rb), items(loaded))
    for _ in range(5):
        assert_same(rb.sample(), loaded.sample())
    for buffer in (rb, loaded):
        with pytest.raises(ReadOnlyError):
            buffer.extend(steps(2, 100))
        with pytest.raises(ReadOnlyError):
            buffer.add(steps(1, 100)[0])
    assert_same(snapshot(rb), snapshot(loaded))


def test_empty_buffer_round_trips(tmp_path: Path) -> None:
    for storage in STORAGES:
        rb = make_buffer(storage, "prioritized")
        rb.dumps(tmp_path / storage)
        loaded = ReplayBuffer.loads(tmp_path / storage)
        assert len(loaded) == 0 and loaded.storage.layout is None
        assert_same(snapshot(rb), snapshot(loaded))
        data = steps(12)
        assert_same(rb.extend(data), loaded.extend(data.clone()))
        assert_lockstep(rb, loaded, rounds=2)


# --- 2. state dicts through torch.save ---------------------------------------------------
def _through_torch_save(state: dict[str, Any]) -> dict[str, Any]:
    blob = io.BytesIO()
    torch.save(state, blob)
    blob.seek(0)
    return torch.load(blob, weights_only=True)


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("storage", list(STORAGES))
def test_state_dict_through_torch_save_continues_exactly(storage: str, sampler: str) -> None:
    rb = make_buffer(storage, sampler)
    fill(rb)
    state = _through_torch_save(rb.state_dict())
    rebuilt = ReplayBuffer.from_state_dict(state)
    fresh = make_buffer(storage, sampler, seed=99)  # another seed: the state must win
    fresh.extend(steps(9, 500))  # and other contents
    fresh.load_state_dict(_through_torch_save(rb.state_dict()))
    assert rebuilt.batch_size == BATCH
    assert_lockstep(rb, rebuilt, fresh)


def test_state_dict_of_object_list_storage() -> None:
    rb = ReplayBuffer(ListStorage(8), UniformSampler(generator=torch.Generator().manual_seed(0)))
    objects = ["a", {"k": [1, 2.5, None]}, 7, (1, "x"), torch.arange(3), True, [], "z"]
    for obj in objects:
        rb.add(obj)
    rebuilt = ReplayBuffer.from_state_dict(_through_torch_save(rb.state_dict()))
    assert_same(items(rb), items(rebuilt))
    assert_same(objects, items(rebuilt))
    assert_same_draws(rb, rebuilt, 16)


# --- 3. load into an existing buffer -------------------------------------------------------
@pytest.mark.parametrize("sampler", ["prioritized", "slice", "without_replacement"])
@pytest.mark.parametrize("storage", list(STORAGES))
def test_load_into_matching_buffer_continues_exactly(
    tmp_path: Path, storage: str, sampler: str
) -> None:
    rb = make_buffer(storage, sampler)
    fill(rb)
    rb.dumps(tmp_path / "ckpt")
    target = make_buffer(storage, sampler, seed=42)
    target.extend(steps(40, 9000))  # other contents, wrapped, another generator
    target.extend(steps(30, 9040))
    target.sample()
    target.load(tmp_path / "ckpt")
    assert target.batch_size == BATCH
    assert_lockstep(rb, target)


def test_load_into_empty_matching_buffer(tmp_path: Path) -> None:
    rb = make_buffer("memmap", "prioritized")
    fill(rb)
    rb.dumps(tmp_path / "ckpt")
    target = make_buffer("memmap", "prioritized", seed=5)
    target.load(tmp_path / "ckpt")
    assert_lockstep(rb, target)


MISMATCHES: dict[str, tuple[str, Callable[[], ReplayBuffer]]] = {
    "storage class": (
        "storage",
        lambda: ReplayBuffer(MemmapStorage(CAP), PrioritizedSampler(CAP, 0.7, 0.5)),
    ),
    "capacity": (
        "storage",
        lambda: ReplayBuffer(TensorStorage(CAP // 2), PrioritizedSampler(CAP // 2, 0.7, 0.5)),
    ),
    "sampler class": ("sampler", lambda: ReplayBuffer(TensorStorage(CAP), UniformSampler())),
    "alpha": (
        "sampler",
        lambda: ReplayBuffer(TensorStorage(CAP), PrioritizedSampler(CAP, 0.6, 0.5)),
    ),
    "writer": (
        "writer",
        lambda: ReplayBuffer(
            TensorStorage(CAP), PrioritizedSampler(CAP, 0.7, 0.5), MaxValueWriter("id")
        ),
    ),
    "rank key": (
        "writer",
        lambda: ReplayBuffer(
            TensorStorage(CAP),
            PrioritizedSampler(CAP, 0.7, 0.5),
            MaxValueWriter(("next", "return")),
        ),
    ),
    "layout": (
        "storage",
        lambda: ReplayBuffer(TensorStorage(CAP), PrioritizedSampler(CAP, 0.7, 0.5)),
    ),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_load_refuses_mismatched_components_and_changes_nothing(tmp_path: Path, case: str) -> None:
    source = ReplayBuffer(
        TensorStorage(CAP),
        PrioritizedSampler(CAP, 0.7, 0.5),
        MaxValueWriter("id") if case == "rank key" else None,
        batch_size=BATCH,
    )
    fill(source)
    source.dumps(tmp_path / "ckpt")
    kind, make = MISMATCHES[case]
    target = make()
    if case == "layout":
        target.extend(TensorDict({"other": torch.arange(20.0)}, [20]))
    else:
        target.extend(steps(20, 300))
    target.sample(4)
    before = snapshot(target)
    with pytest.raises(ValueError, match=rf"^{kind}: ") as info:
        target.load(tmp_path / "ckpt")
    assert not isinstance(info.value, CheckpointError)
    assert_same(before, snapshot(target), "target after a refused load")
    # and it still works as before
    target.sample(4)


# --- 4. copy-on-write and overwriting ----------------------------------------------------
@pytest.mark.parametrize("storage", list(STORAGES))
def test_writes_after_loads_never_reach_the_checkpoint(tmp_path: Path, storage: str) -> None:
    path = tmp_path / "ckpt"
    rb = make_buffer(storage, "prioritized")
    fill(rb)
    saved = items(rb)
    rb.dumps(path)
    digest = files_digest(path)
    loaded = ReplayBuffer.loads(path)
    loaded.extend(steps(CAP, 10_000))  # overwrites every slot
    loaded.storage.set(slice(0, 3), steps(3, 20_000))
    loaded.storage.set(5, steps(1, 30_000)[0])
    loaded.update_priority(torch.arange(CAP), torch.full((CAP,), 2.0))
    assert int(loaded.storage[5]["id"]) == 30_000
    assert files_digest(path) == digest
    again = ReplayBuffer.loads(path)
    assert_same(saved, items(again), "second loads")
    assert_same(saved, items(ReplayBuffer.loads(path)), "third loads")
    assert int(loaded.storage[5]["id"]) == 30_000  # the first one kept its writes


@pytest.mark.parametrize("storage", list(STORAGES))
def test_dumps_twice_keeps_one_checkpoint(tmp_path: Path, storage: str) -> None:
    path = tmp_path / "ckpt"
    rb = make_buffer(storage, "uniform")
    fill(rb)
    rb.dumps(path)
    first = live(path)
    rb.extend(steps(10, 500))
    rb.dumps(path)
    assert [p.name for p in path.iterdir() if p.name.startswith("ckpt-")] == [live(path).name]
    assert entries(path) == {"CURRENT", live(path).name}
    assert not first.exists()
    assert_lockstep(rb, ReplayBuffer.loads(path))


@pytest.mark.parametrize("storage", list(STORAGES))
def test_loaded_buffer_survives_the_checkpoint_being_replaced(tmp_path: Path, storage: str) -> None:
    path = tmp_path / "ckpt"
    rb = make_buffer(storage, "prioritized")
    fill(rb)
    rb.dumps(path)
    loaded = ReplayBuffer.loads(path)
    saved = items(loaded)
    old_dir = live(path)
    rb.extend(steps(20, 700))
    rb.dumps(path)  # the directory ``loaded`` maps is removed
    assert not old_dir.exists()
    assert_same(saved, items(loaded), "reads after the replacement")
    twin = ReplayBuffer.loads(path)  # the newest state
    assert_lockstep(rb, twin, rounds=2)
    # the old buffer goes on working, and can itself overwrite the checkpoint it came from
    loaded.extend(steps(5, 900))
    loaded.sample()
    loaded.dumps(path)
    assert_lockstep(loaded, ReplayBuffer.loads(path), rounds=2, start=4000)


def test_loaded_buffer_dumps_over_its_own_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    rb = make_buffer("memmap", "slice")
    fill(rb)
    rb.dumps(path)
    loaded = ReplayBuffer.loads(path)
    loaded.dumps(path)  # reads its own (mapped) source while writing the new one
    assert_lockstep(rb, ReplayBuffer.loads(path))


# --- 5. ListStorage items --------------------------------------------------------------------
class Opaque:
    pass


@pytest.mark.parametrize(
    ("item", "name"),
    [
        (Opaque(), "Opaque"),
        ({1, 2}, "set"),
        (b"raw", "bytes"),
        (1 + 2j, "complex"),
        ({"nested": [1, frozenset()]}, "frozenset"),
    ],
)
def test_list_storage_refuses_non_json_items(tmp_path: Path, item: Any, name: str) -> None:
    path = tmp_path / "ckpt"
    rb = ReplayBuffer(ListStorage(8))
    rb.add("fine")
    rb.add(item)
    with pytest.raises(TypeError, match=name):
        rb.dumps(path)
    assert not path.exists()
    # with a previous checkpoint: it stays live and complete
    ok = ReplayBuffer(ListStorage(8))
    ok.extend(["a", "b", 3])
    ok.dumps(path)
    before = files_digest(path)
    with pytest.raises(TypeError, match=name):
        rb.dumps(path)
    assert files_digest(path) == before
    assert entries(path) == {"CURRENT", live(path).name}
    assert_same(["a", "b", 3], items(ReplayBuffer.loads(path)))


def test_list_storage_refuses_non_string_keys(tmp_path: Path) -> None:
    rb = ReplayBuffer(ListStorage(4))
    rb.add({1: "one"})
    with pytest.raises(TypeError, match="string keys"):
        rb.dumps(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_list_storage_json_and_tensor_objects_round_trip(tmp_path: Path) -> None:
    objects = [
        "a string ✓",
        {"dict": {"nested": [1, 2.5, None, True]}, "empty": {}},
        42,
        -(2**70),
        3.25,
        float("inf"),
        [1, "two", [3.0]],
        (1, ("tuple", None)),
        None,
        False,
        torch.arange(6).view(2, 3),
        {"tensor": torch.ones(2, dtype=torch.float16), "label": "x"},
        TensorDict({"a": torch.zeros(3)}, [3]),
        torch.tensor(3.5),  # 0-d
        torch.empty(0, 3),
        torch.tensor([True, False]),
        torch.ones(3, dtype=torch.bfloat16),
        torch.tensor([1 + 2j, 3 - 1j]),
        torch.arange(6).view(2, 3).t(),  # not contiguous
        torch.arange(10)[::3],
    ]
    rb = ReplayBuffer(ListStorage(32), UniformSampler(generator=torch.Generator().manual_seed(1)))
    for obj in objects:
        rb.add(obj)
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    assert_same(objects, items(loaded))
    assert_same_draws(rb, loaded, 4)
    assert rb.add("next") == loaded.add("next")
    target = ReplayBuffer(ListStorage(32), UniformSampler())
    target.extend(["other", "contents"])
    target.load(tmp_path / "ckpt")
    assert_same(objects, items(target))
    assert_same_draws(ReplayBuffer.loads(tmp_path / "ckpt"), target, 4)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4).filter(lambda k: k != "$rb"), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=40, deadline=None)
@given(objects=st.lists(json_like, min_size=1, max_size=5))
def test_list_storage_objects_round_trip_property(objects: list[Any]) -> None:
    rb = ReplayBuffer(ListStorage(8))
    rb.add("first")  # a string first: the storage holds objects
    for obj in objects:
        rb.add(obj)
    with tempfile.TemporaryDirectory() as tmp:
        rb.dumps(Path(tmp) / "ckpt")
        loaded = ReplayBuffer.loads(Path(tmp) / "ckpt")
    assert_same(["first", *objects], items(loaded))
    rebuilt = ReplayBuffer.from_state_dict(_through_torch_save(rb.state_dict()))
    assert_same(["first", *objects], items(rebuilt))


def test_list_storage_tensor_rows_with_gaps_round_trip(tmp_path: Path) -> None:
    storage = ListStorage(16)
    storage.set([0, 1, 2], steps(3))
    storage.set(9, steps(1, 9)[0])  # slots 3..8 were never written
    rb = ReplayBuffer(storage, SAMPLERS["uniform"](16, 2))
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    assert len(loaded) == len(rb) == 10
    for i in (0, 1, 2, 9):
        assert_same(rb.storage[i], loaded.storage[i])
    assert loaded.storage.next_slot == rb.storage.next_slot
    ring = rb.extend(steps(4, 10))  # the ring goes on at its cursor: set(9) left it at 3
    assert ring.tolist() == [3, 4, 5, 6]
    assert_same(ring, loaded.extend(steps(4, 10)))
    for buffer in (rb, loaded):
        buffer.storage.set(slice(7, 9), steps(2, 7))  # fill the rest of the gap
    assert_same(items(rb), items(loaded))
    assert_same(items(rb), torch.cat([steps(3), steps(4, 10), steps(2, 7), steps(1, 9)]))


# --- 6. tampering ----------------------------------------------------------------------------
def _meta(path: Path) -> dict[str, Any]:
    return json.loads((live(path) / "checkpoint.json").read_text())


def _write_meta(path: Path, meta: Any) -> None:
    (live(path) / "checkpoint.json").write_text(json.dumps(meta))


def _edit(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def tamper(path: Path) -> None:
        meta = _meta(path)
        change(meta)
        _write_meta(path, meta)

    return tamper


def _truncate(file: Path, keep: float = 0.5) -> None:
    size = file.stat().st_size
    with open(file, "r+b") as f:
        f.truncate(int(size * keep))


def _truncate_leaf(path: Path) -> None:
    leaves = sorted((live(path) / "storage").glob("0*.bin"))
    assert leaves
    _truncate(leaves[-1])


def _set(meta: dict[str, Any], keys: tuple[Any, ...], value: Any) -> None:
    for key in keys[:-1]:
        meta = meta[key]
    meta[keys[-1]] = value


def _elsewhere(path: Path) -> None:
    shutil.copytree(live(path), path.parent / "elsewhere")  # a valid checkpoint outside
    (path / "CURRENT").write_text("../elsewhere\n")


TAMPER: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated leaf": (_truncate_leaf, "truncated"),
    "truncated header": (lambda p: _truncate(live(p) / "storage" / "header.bin"), "header"),
    "missing storage dir": (lambda p: shutil.rmtree(live(p) / "storage"), r"layout\.json"),
    "truncated tensors.bin": (lambda p: _truncate(live(p) / "tensors.bin"), "truncated"),
    "missing tensors.bin": (lambda p: (live(p) / "tensors.bin").unlink(), "missing"),
    "json not json": (lambda p: (live(p) / "checkpoint.json").write_text("{oops"), "corrupt"),
    "json a list": (lambda p: _write_meta(p, [1, 2]), r"not an rbdata\.checkpoint"),
    "missing json": (lambda p: (live(p) / "checkpoint.json").unlink(), r"checkpoint\.json"),
    "wrong format": (_edit(lambda m: _set(m, ("format",), "rbdata.memmap")), "not an"),
    "wrong version": (_edit(lambda m: _set(m, ("version",), 2)), "version 2"),
    "string version": (_edit(lambda m: _set(m, ("version",), "1")), "version"),
    "os.system storage": (
        _edit(lambda m: _set(m, ("storage", "class"), "os.system")),
        r"unknown class 'os\.system'",
    ),
    "builtins.eval sampler": (
        _edit(lambda m: _set(m, ("sampler", "class"), "builtins.eval")),
        r"unknown class 'builtins\.eval'",
    ),
    "storage class as writer": (
        _edit(lambda m: _set(m, ("writer", "class"), "TensorStorage")),
        "writer: unknown class",
    ),
    "non-string class": (
        _edit(lambda m: _set(m, ("writer", "class"), ["os", "system"])),
        "unknown class",
    ),
    "missing sampler": (_edit(lambda m: m.pop("sampler")), "sampler"),
    "config not a dict": (
        _edit(lambda m: _set(m, ("writer", "config"), [1])),
        "config must be a dict",
    ),
    "unexpected config key": (
        _edit(lambda m: _set(m, ("sampler", "config", "command"), "rm -rf /")),
        "command",
    ),
    "storage dir escapes": (
        _edit(lambda m: _set(m, ("storage", "state", "dir"), "../../etc")),
        "directory",
    ),
    "huge tensor offset": (
        _edit(lambda m: _set(m, ("tensors", 0, "offset"), 2**40)),
        "does not fit",
    ),
    "misaligned tensor offset": (
        _edit(lambda m: _set(m, ("tensors", 0, "offset"), 3)),
        "does not fit",
    ),
    "huge tensor shape": (
        _edit(lambda m: _set(m, ("tensors", 0, "shape"), [2**31, 2**31])),
        "tensor 0",
    ),
    "overflowing tensor shape": (
        _edit(lambda m: _set(m, ("tensors", 0, "shape"), [2**62 + 1, 4])),
        "tensor 0|invalid",
    ),
    "negative tensor shape": (
        _edit(lambda m: _set(m, ("tensors", 0, "shape"), [-1])),
        "does not fit",
    ),
    "bad tensor dtype": (
        _edit(lambda m: _set(m, ("tensors", 0, "dtype"), "Tensor")),
        "unknown dtype",
    ),
    "tensor table not a list": (_edit(lambda m: _set(m, ("tensors",), {})), "not a list"),
    "tensor reference out of range": (
        _edit(lambda m: _set(m, ("sampler", "state", "sum_tree", "i"), 999)),
        "out of range",
    ),
    "unknown entry kind": (
        _edit(lambda m: _set(m, ("sampler", "state", "sum_tree"), {"$rb": "pickle", "d": "x"})),
        "unknown entry kind 'pickle'",
    ),
    "bad dtype entry": (
        _edit(lambda m: _set(m, ("sampler", "config", "dtype"), {"$rb": "dtype", "name": "eval"})),
        "unknown dtype",
    ),
    "CURRENT escapes": (lambda p: (p / "CURRENT").write_text("../elsewhere\n"), "elsewhere"),
    "CURRENT escapes to a valid checkpoint": (_elsewhere, "not a checkpoint subdirectory"),
    "CURRENT absolute": (lambda p: (p / "CURRENT").write_text("/etc\n"), "not a checkpoint"),
    "CURRENT names a missing dir": (
        lambda p: (p / "CURRENT").write_text("ckpt-deadbeef\n"),
        "missing",
    ),
    "CURRENT binary": (lambda p: (p / "CURRENT").write_bytes(b"\xff\xfe\x00"), "CURRENT"),
    "missing CURRENT": (lambda p: (p / "CURRENT").unlink(), "no CURRENT file"),
}


@pytest.mark.parametrize("case", list(TAMPER))
def test_tampered_checkpoint_raises_checkpoint_error(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ckpt"
    rb = make_buffer("memmap", "prioritized")
    fill(rb)
    rb.dumps(path)
    tamper, message = TAMPER[case]
    tamper(path)
    calls: list[Any] = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a))
    monkeypatch.setattr("builtins.eval", lambda *a, **k: calls.append(a))
    with pytest.raises(CheckpointError, match=message):
        ReplayBuffer.loads(path)
    fresh = make_buffer("memmap", "prioritized", seed=1)
    fresh.extend(steps(10))
    before = snapshot(fresh)
    with pytest.raises(CheckpointError):
        fresh.load(path)
    assert_same(before, snapshot(fresh))
    assert calls == []


@pytest.mark.parametrize(
    ("storage", "tamper", "message"),
    [
        ("arrow", lambda p: _truncate(live(p) / "storage" / "chunk-000001.arrow"), "chunk-000001"),
        ("arrow", lambda p: (live(p) / "storage" / "chunk-000002.arrow").unlink(), "missing"),
        (
            "arrow",
            lambda p: (live(p) / "storage" / "_rbdata.json").write_text("[]"),
            r"not an rbdata\.arrow",
        ),
        ("tensor", _truncate_leaf, "truncated"),
        ("list", _edit(lambda m: _set(m, ("storage", "state", "length"), 10**6)), "out of range"),
        ("list", _edit(lambda m: _set(m, ("storage", "state", "next"), -1)), "out of range"),
        (
            "list",
            _edit(lambda m: _set(m, ("storage", "state", "present", "i"), 10**6)),
            "out of range",
        ),
    ],
)
def test_tampered_storage_raises_checkpoint_error(
    tmp_path: Path, storage: str, tamper: Callable[[Path], None], message: str
) -> None:
    path = tmp_path / "ckpt"
    rb = make_buffer(storage, "uniform")
    fill(rb)
    rb.dumps(path)
    tamper(path)
    with pytest.raises(CheckpointError, match=message):
        ReplayBuffer.loads(path)


def test_missing_path_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ReplayBuffer.loads(tmp_path / "nothing here")
    (tmp_path / "a file").write_text("x")
    with pytest.raises(FileNotFoundError):
        ReplayBuffer.loads(tmp_path / "a file")
    with pytest.raises(FileNotFoundError):
        ReplayBuffer(TensorStorage(4)).load(tmp_path / "nothing here")


def test_empty_directory_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no CURRENT"):
        ReplayBuffer.loads(tmp_path / "empty")


# --- 7. no pickle anywhere -------------------------------------------------------------------
def _forbid(monkeypatch: pytest.MonkeyPatch, names: list[str]) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pickle used by a checkpoint")

    for name in names:
        module, attr = name.rsplit(".", 1)
        target = {"pickle": pickle, "torch": torch}[module]
        monkeypatch.setattr(target, attr, refuse)


@pytest.mark.parametrize("sampler", ["prioritized", "slice", "without_replacement"])
@pytest.mark.parametrize("storage", list(STORAGES))
def test_no_pickle_on_dumps_and_loads(
    tmp_path: Path, storage: str, sampler: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rb = make_buffer(storage, sampler)
    fill(rb)
    with monkeypatch.context() as patch:
        _forbid(patch, ["pickle.dumps", "pickle.dump", "pickle.Pickler", "torch.save"])
        rb.dumps(tmp_path / "ckpt")
    with monkeypatch.context() as patch:
        _forbid(patch, ["pickle.loads", "pickle.load", "pickle.Unpickler", "torch.load"])
        loaded = ReplayBuffer.loads(tmp_path / "ckpt")
        target = make_buffer(storage, sampler, seed=8)
        target.load(tmp_path / "ckpt")
    assert_lockstep(rb, loaded, target, rounds=2)


def test_no_pickle_for_list_storage_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rb = ReplayBuffer(ListStorage(8), UniformSampler(generator=torch.Generator().manual_seed(0)))
    objects = ["s", {"d": [1, None]}, (2, 3.5), torch.ones(2)]
    rb.extend(objects)
    _forbid(monkeypatch, ["pickle.dumps", "pickle.dump", "pickle.Pickler", "torch.save"])
    _forbid(monkeypatch, ["pickle.loads", "pickle.load", "pickle.Unpickler", "torch.load"])
    rb.dumps(tmp_path / "ckpt")
    assert_same(objects, items(ReplayBuffer.loads(tmp_path / "ckpt")))


# --- 8. atomicity under injected faults --------------------------------------------------
def _fail_at(k: int, real: Callable[..., Any], calls: list[int]) -> Callable[..., Any]:
    def faulty(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == k:
            raise OSError(f"injected fault at call {k}")
        return real(*args, **kwargs)

    return faulty


@pytest.mark.parametrize("fault", ["replace", "fsync", "rename"])
@pytest.mark.parametrize("storage", ["memmap", "arrow", "list"])
def test_failed_dumps_leaves_the_previous_checkpoint_live(
    tmp_path: Path, storage: str, fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ckpt"
    rb = make_buffer(storage, "prioritized")
    fill(rb)
    rb.dumps(path)
    previous = snapshot(rb)
    rb.extend(steps(25, 5000))
    rb.update_priority(torch.arange(5), torch.full((5,), 9.0))
    newest = snapshot(rb)
    real = getattr(os, fault)
    live_before = live(path).name
    failures = switched = 0
    for k in range(1, 200):
        calls = [0]
        with monkeypatch.context() as patch:
            patch.setattr(os, fault, _fail_at(k, real, calls))
            try:
                rb.dumps(path)
            except OSError as err:
                assert f"injected fault at call {k}" in str(err)
            else:
                break
        failures += 1
        state = snapshot(ReplayBuffer.loads(path))  # always one complete checkpoint
        where = f"after a fault at call {k} of os.{fault}"
        if fault == "fsync" and live(path).name != live_before:
            # the fsync of the directory *after* the switch of CURRENT failed: the new
            # checkpoint is live, dumps raised because it may not be durable yet
            assert_same(newest, state, where)
            switched += 1
            continue
        assert_same(previous, state, where)
        leftovers = entries(path) - {"CURRENT", live_before}
        assert all(name.startswith((".tmp-", "ckpt-", ".CURRENT.")) for name in leftovers)
    else:  # pragma: no cover
        pytest.fail("dumps never succeeded")
    assert failures >= 1 and switched <= 1  # every fault point exercised, then success
    assert entries(path) == {"CURRENT", live(path).name}  # leftovers cleaned up
    assert_same(newest, snapshot(ReplayBuffer.loads(path)))


def test_dumps_that_raises_after_the_switch_keeps_the_previous_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the last fsync (of the directory, after CURRENT is switched) fails after the
    switch: the new checkpoint is live, and the previous one is not removed (its removal
    might reach the disk before the switch does)."""
    path = tmp_path / "ckpt"
    rb = make_buffer("list", "uniform")
    rb.extend(steps(10))
    rb.dumps(path)
    before = live(path).name
    previous = snapshot(rb)
    rb.extend(steps(10, 10))
    newest = snapshot(rb)
    real = os.fsync
    for k in range(1, 200):
        calls = [0]
        with monkeypatch.context() as patch:
            patch.setattr(os, "fsync", _fail_at(k, real, calls))
            try:
                rb.dumps(path)
            except OSError:
                pass
            else:
                break
        state = snapshot(ReplayBuffer.loads(path))
        if live(path).name == before:
            assert_same(previous, state, f"fault at fsync call {k}")
        else:
            assert_same(newest, state, f"fault at fsync call {k}")
            assert (path / before).is_dir(), "the previous checkpoint was removed too early"
            break
    else:  # pragma: no cover
        pytest.fail("dumps never succeeded nor switched")


@pytest.mark.parametrize("fault", ["replace", "fsync", "rename"])
def test_failed_first_dumps_leaves_nothing(
    tmp_path: Path, fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "new" / "ckpt"
    rb = make_buffer("memmap", "prioritized")
    fill(rb)
    real = getattr(os, fault)
    for k in range(1, 200):
        calls = [0]
        with monkeypatch.context() as patch:
            patch.setattr(os, fault, _fail_at(k, real, calls))
            try:
                rb.dumps(path)
            except OSError:
                pass
            else:
                break
        if path.exists():  # only a fault after the switch leaves the (new) checkpoint
            assert fault == "fsync", f"fault at call {k}: {sorted(entries(path))}"
            assert_lockstep(rb, ReplayBuffer.loads(path), rounds=1)
            rb.dumps(path)
            break
    assert entries(path) == {"CURRENT", live(path).name}
    assert_lockstep(rb, ReplayBuffer.loads(path), rounds=1)


def test_stale_leftovers_are_ignored_then_cleaned_up(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    rb = make_buffer("memmap", "prioritized")
    fill(rb)
    rb.dumps(path)
    expected = snapshot(rb)
    # what a process killed in the middle of dumps leaves behind
    (path / ".tmp-killed" / "storage").mkdir(parents=True)
    (path / ".tmp-killed" / "tensors.bin").write_bytes(b"partial")
    shutil.copytree(live(path), path / "ckpt-0")  # renamed, CURRENT never switched
    (path / ".CURRENT.abc").write_text("ckpt-0\n")
    assert_same(expected, snapshot(ReplayBuffer.loads(path)))
    rb.extend(steps(9, 800))
    rb.dumps(path)
    assert entries(path) == {"CURRENT", live(path).name}
    assert_lockstep(rb, ReplayBuffer.loads(path), rounds=1)


# --- 9. foreign directories ------------------------------------------------------------------
def test_dumps_refuses_a_directory_of_user_files(tmp_path: Path) -> None:
    path = tmp_path / "mine"
    (path / "sub").mkdir(parents=True)
    (path / "notes.txt").write_text("precious")
    (path / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = files_digest(path)
    rb = make_buffer("memmap", "uniform")
    fill(rb)
    with pytest.raises(FileExistsError, match=r"notes\.txt"):
        rb.dumps(path)
    assert files_digest(path) == before
    assert entries(path) == {"notes.txt", "sub"}
    file = tmp_path / "a file"
    file.write_text("keep me")
    with pytest.raises(FileExistsError):
        rb.dumps(file)
    assert file.read_text() == "keep me"


def test_dumps_into_an_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    rb = make_buffer("tensor", "uniform")
    fill(rb)
    rb.dumps(tmp_path / "empty")
    assert_lockstep(rb, ReplayBuffer.loads(tmp_path / "empty"), rounds=1)


def test_dumps_refuses_a_storage_directory(tmp_path: Path) -> None:
    storage = MemmapStorage(8, path=tmp_path / "store")
    storage.set(slice(0, 2), steps(2))
    rb = ReplayBuffer(storage)
    before = files_digest(tmp_path / "store")
    with pytest.raises(FileExistsError, match="not part of an rbdata checkpoint"):
        rb.dumps(tmp_path / "store")
    assert files_digest(tmp_path / "store") == before
    storage.close()


# --- 10. custom components -------------------------------------------------------------------
@rbdata.checkpoint.register
class CountingWriter(RoundRobinWriter):
    """A ring writer that counts its writes (state) and has a constructor option (config)."""

    def __init__(self, label: str = "default") -> None:
        super().__init__()
        self.label = label
        self.writes = 0

    def extend(self, storage: Any, data: Any) -> torch.Tensor:
        index = super().extend(storage, data)
        self.writes += int(index.numel())
        return index

    def config(self) -> dict[str, Any]:
        return {"label": self.label}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "writes": self.writes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.writes = int(state["writes"])


class UnregisteredWriter(RoundRobinWriter):
    pass


def test_registered_custom_writer_round_trips(tmp_path: Path) -> None:
    rb = make_buffer("tensor", "uniform", writer=CountingWriter("mine"))
    fill(rb)
    rb.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    assert type(loaded.writer) is CountingWriter
    assert loaded.writer.label == "mine" and loaded.writer.writes == rb.writer.writes == 90
    assert_lockstep(rb, loaded)
    rebuilt = ReplayBuffer.from_state_dict(_through_torch_save(rb.state_dict()))
    assert type(rebuilt.writer) is CountingWriter and rebuilt.writer.writes == rb.writer.writes


def test_unregistered_custom_writer_is_refused(tmp_path: Path) -> None:
    rb = make_buffer("tensor", "uniform", writer=UnregisteredWriter())
    fill(rb)
    with pytest.raises(TypeError, match=r"UnregisteredWriter.*not registered"):
        rb.dumps(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(TypeError, match="not registered"):
        rb.state_dict()


def test_register_checks_its_argument() -> None:
    with pytest.raises(TypeError):
        rbdata.checkpoint.register(int)  # type: ignore[arg-type]
    assert rbdata.checkpoint.register(CountingWriter) is CountingWriter  # idempotent


# --- 11. pickling a loaded memmap storage ------------------------------------------------
def test_loaded_memmap_storage_pickles_with_its_private_writes(tmp_path: Path) -> None:
    rb = make_buffer("memmap", "uniform")
    fill(rb)
    rb.dumps(tmp_path / "ckpt")
    digest = files_digest(tmp_path / "ckpt")
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    loaded.extend(steps(10, 40_000))  # private writes, in this process only
    clone = pickle.loads(pickle.dumps(loaded.storage))
    assert isinstance(clone, MemmapStorage)
    assert len(clone) == len(loaded.storage) and clone.next_slot == loaded.storage.next_slot
    assert_same(items(loaded), clone[torch.arange(len(clone))])
    ids = set(clone[torch.arange(len(clone))]["id"].tolist())
    assert set(range(40_000, 40_010)) <= ids
    # the clone's writes stay in the clone
    clone.set(0, steps(1, 50_000)[0])
    assert int(clone[0]["id"]) == 50_000 and int(loaded.storage[0]["id"]) != 50_000
    assert files_digest(tmp_path / "ckpt") == digest
    assert_same(items(rb), items(ReplayBuffer.loads(tmp_path / "ckpt")))


# --- found by the model-based test (tests/test_model_based.py) -------------------------------
def test_dumps_before_any_episode_end(tmp_path: Path) -> None:
    """A SliceSampler whose episode index is still empty checkpoints (was a raw RuntimeError)."""
    rb = ReplayBuffer(TensorStorage(8), sampler=SliceSampler(slice_len=2))
    rb.extend({"x": torch.arange(3), "next": {"done": torch.zeros(3, 1, dtype=torch.bool)}})
    rb.dumps(tmp_path / "c")
    back = ReplayBuffer.loads(tmp_path / "c")
    assert back.storage[[0, 1, 2]]["x"].tolist() == [0, 1, 2]
    rb.extend({"x": torch.arange(3, 6), "next": {"done": torch.tensor([[0], [0], [1]]).bool()}})
    back.extend({"x": torch.arange(3, 6), "next": {"done": torch.tensor([[0], [0], [1]]).bool()}})
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    rb.sampler.generator, back.sampler.generator = g1, g2  # type: ignore[attr-defined]
    assert torch.equal(rb.sample(4)["x"], back.sample(4)["x"])


def test_state_dict_of_a_loaded_buffer_round_trips_torch_save(tmp_path: Path) -> None:
    """Loaded tensors own their memory: torch.save writes what torch.load reads back."""
    rb = ReplayBuffer(ListStorage(7), sampler=SamplerWithoutReplacement())
    rb.extend({"x": torch.zeros(1)})
    rb.sample(1)
    rb.dumps(tmp_path / "c")
    back = ReplayBuffer.loads(tmp_path / "c")
    buf = io.BytesIO()
    torch.save(back.state_dict(), buf)
    buf.seek(0)
    again = torch.load(buf, weights_only=True)
    want = rb.state_dict()
    assert again.keys() == want.keys()
    fresh = ReplayBuffer(ListStorage(7), sampler=SamplerWithoutReplacement())
    fresh.load_state_dict(again)  # the saved state restores: the same next draws
    assert fresh.storage[0]["x"].tolist() == 0.0 and len(fresh) == 1
    assert fresh.sampler.state_dict().keys() == rb.sampler.state_dict().keys()
