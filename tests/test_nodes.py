"""``rbdata.nodes.BufferSource``: the torchdata.nodes contract, composition, resume, prefetch.

References are independent of the node: the same buffer built twice with the same seed and
sampled directly (``rb.sample``, ``iter(rb)``), or ``DataLoader(storage, batch_sampler=...)``.
"""

from __future__ import annotations

import io
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader
from torchdata.nodes import BaseNode, Loader, ParallelMapper, PinMemory, Prefetcher

from rbdata import (
    BatchSampler,
    EmptyBufferError,
    PrioritizedSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorStorage,
    UniformSampler,
)
from rbdata.nodes import BufferSource

pytestmark = pytest.mark.usefixtures("collect_pipelines")


N, CAPACITY, BATCH = 60, 128, 8
KINDS = ("uniform", "without", "prioritized", "slice")


def _sampler(kind: str, seed: int, eps: float = 1e-8) -> Any:
    gen = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        return UniformSampler(generator=gen)
    if kind == "without":
        return SamplerWithoutReplacement(generator=gen)
    if kind == "prioritized":
        return PrioritizedSampler(CAPACITY, alpha=0.7, beta=0.5, eps=eps, generator=gen)
    return SliceSampler(slice_len=4, generator=gen)


def _buffer(kind: str, seed: int = 0, n: int = N, **kwargs: Any) -> ReplayBuffer:
    """A buffer of ``n`` deterministic transitions (episodes of 10 steps)."""
    rb = ReplayBuffer(TensorStorage(CAPACITY), sampler=_sampler(kind, seed, **kwargs))
    done = (torch.arange(n) % 10 == 9).unsqueeze(-1)
    obs = torch.arange(n * 3, dtype=torch.float32).view(n, 3)
    rb.extend(TensorDict({"observation": obs, "next": {"done": done}}, batch_size=[n]))
    if kind == "prioritized":
        rb.update_priority(torch.arange(n), (torch.arange(n) % 7 + 1).double())
    return rb


def _same(a: Any, b: Any) -> bool:
    """Equal batches: same keys, same shapes and values."""
    keys = sorted(a.keys(True, True), key=str)
    if keys != sorted(b.keys(True, True), key=str):
        return False
    return all(torch.equal(a[k], b[k]) for k in keys)


def _all_same(xs: list[Any], ys: list[Any]) -> bool:
    return len(xs) == len(ys) and all(_same(x, y) for x, y in zip(xs, ys, strict=True))


def _double(batch: TensorDict) -> TensorDict:
    out = batch.clone()
    out["observation"] = batch["observation"] * 2
    return out


def _pipeline(node: BaseNode, depth: str) -> BaseNode:
    """The source alone, or wrapped in the standard nodes (threads)."""
    if depth == "plain":
        return node
    if depth == "prefetch":
        return Prefetcher(node, prefetch_factor=3)
    return Prefetcher(ParallelMapper(node, _double, num_workers=2), prefetch_factor=4)


def _expected(rb: ReplayBuffer, depth: str, count: int) -> list[Any]:
    batches = [rb.sample(BATCH) for _ in range(count)]
    return [_double(b) for b in batches] if depth == "mapped" else batches


# --- batches ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["uniform", "prioritized", "slice"])
@pytest.mark.parametrize("depth", ["plain", "prefetch", "mapped"])
def test_batches_are_the_buffers_samples(kind: str, depth: str) -> None:
    source = BufferSource(_buffer(kind, seed=1), batch_size=BATCH, num_batches=7)
    got = list(Loader(_pipeline(source, depth)))
    assert _all_same(got, _expected(_buffer(kind, seed=1), depth, 7))
    assert "index" in got[0].keys()
    if kind == "prioritized":
        assert "weight" in got[0].keys()


def test_endless_without_num_batches() -> None:
    source = BufferSource(_buffer("uniform", seed=2), batch_size=BATCH)
    got = list(itertools.islice(Loader(Prefetcher(source, 2)), 40))
    assert _all_same(got, _expected(_buffer("uniform", seed=2), "plain", 40))


@pytest.mark.parametrize("depth", ["plain", "mapped"])
def test_without_replacement_gives_one_epoch_per_iteration(depth: str) -> None:
    loader = Loader(_pipeline(BufferSource(_buffer("without", seed=3), batch_size=BATCH), depth))
    twin = _buffer("without", seed=3)
    twin.batch_size = BATCH
    for _ in range(2):  # two epochs, each the twin's iteration
        got = list(loader)
        want = [_double(b) if depth == "mapped" else b for b in twin]
        assert _all_same(got, want)
        index = torch.cat([b["index"] for b in got])
        assert torch.equal(index.sort().values, torch.arange(N))  # each item once


def test_num_batches_restarts_each_iteration() -> None:
    loader = Loader(BufferSource(_buffer("uniform", seed=4), batch_size=BATCH, num_batches=3))
    got = list(loader) + list(loader)
    assert _all_same(got, _expected(_buffer("uniform", seed=4), "plain", 6))


def test_default_batch_size_and_transform_are_the_buffers() -> None:
    rb, twin = _buffer("uniform", seed=5), _buffer("uniform", seed=5)
    for b in (rb, twin):
        b.batch_size, b.transform = 5, _double
    got = list(Loader(BufferSource(rb, num_batches=4)))
    assert _all_same(got, [twin.sample() for _ in range(4)])
    assert got[0]["observation"].shape == (5, 3)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_memory_pipeline() -> None:
    source = BufferSource(_buffer("prioritized", seed=6), batch_size=BATCH, num_batches=5)
    node = Prefetcher(PinMemory(ParallelMapper(source, _double, num_workers=2)), 4)
    got = list(Loader(node))
    assert all(b["observation"].is_pinned() for b in got)
    assert _all_same(got, _expected(_buffer("prioritized", seed=6), "mapped", 5))


# --- from_storage ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["uniform", "without"])
def test_from_storage_matches_dataloader(kind: str) -> None:
    num_batches = None if kind == "without" else 5

    def make() -> tuple[TensorStorage, BatchSampler]:
        storage = _buffer("uniform").storage  # the data only
        sampler = _sampler(kind, seed=7)
        sampler.attach(storage)
        return storage, BatchSampler(sampler, BATCH, num_batches=num_batches)

    node = BufferSource.from_storage(*make(), transform=_double)
    got = list(Loader(Prefetcher(node, 2)))
    ref_storage, ref_batches = make()
    want = [_double(b) for b in DataLoader(ref_storage, batch_sampler=ref_batches)]
    assert len(got) == (-(-N // BATCH) if kind == "without" else 5)  # an epoch: ceil(N / B)
    assert _all_same(got, want)


def test_from_storage_rejects_bad_arguments() -> None:
    storage = _buffer("uniform").storage
    other = _buffer("uniform").storage
    good = BatchSampler(UniformSampler(storage), BATCH, num_batches=2)
    with pytest.raises(TypeError, match="storage must be an rbdata Storage"):
        BufferSource.from_storage([1, 2], good)  # type: ignore[arg-type]
    torch_batches = torch.utils.data.BatchSampler(range(N), BATCH, drop_last=False)
    with pytest.raises(TypeError, match="batch_sampler must be an rbdata BatchSampler"):
        BufferSource.from_storage(storage, torch_batches)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"batch_sampler: .* reads another data_source"):
        BufferSource.from_storage(other, good)
    with pytest.raises(TypeError, match="transform must be callable"):
        BufferSource.from_storage(storage, good, transform=3)  # type: ignore[arg-type]
    node = BufferSource.from_storage(storage, good)
    with pytest.raises(TypeError, match="UniformSampler has no priorities"):
        node.update_priority([0], [1.0])


# --- the state contract ------------------------------------------------------------------
def _check_save_load(make: Callable[[], BaseNode], midpoint: int) -> None:
    """torchdata's save/load contract: state at start, midpoint and end, then reset."""
    loader = Loader(make())
    initial = loader.state_dict()
    it = iter(loader)
    epoch0 = [next(it) for _ in range(midpoint)]
    mid = loader.state_dict()
    epoch0 += list(it)
    end = loader.state_dict()
    epoch1 = list(loader)

    for state, want in ((mid, epoch0[midpoint:]), (initial, epoch0), (end, epoch1)):
        fresh = Loader(make())
        fresh.load_state_dict(state)
        assert _all_same(list(fresh), want)
        loader.load_state_dict(state)  # the same loader, reloaded
        assert _all_same(list(loader), want)


@pytest.mark.parametrize("depth", ["plain", "prefetch", "mapped"])
@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_round_trip(kind: str, depth: str) -> None:
    rb = _buffer(kind, seed=8)  # one buffer: a loaded state must rewind its sampler
    num_batches = None if kind == "without" else 6

    def make() -> BaseNode:
        return _pipeline(BufferSource(rb, batch_size=BATCH, num_batches=num_batches), depth)

    _check_save_load(make, midpoint=3)


@pytest.mark.parametrize("depth", ["plain", "mapped"])
def test_resume_mid_epoch_in_a_new_pipeline(depth: str) -> None:
    """Loader.state_dict() mid-epoch, saved to bytes, continues in a new buffer + pipeline."""
    uninterrupted = list(Loader(_pipeline(BufferSource(_buffer("without", 9), BATCH), depth)))
    loader = Loader(_pipeline(BufferSource(_buffer("without", 9), BATCH), depth))
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    blob = io.BytesIO()
    torch.save(loader.state_dict(), blob)
    blob.seek(0)
    del loader, it

    # another process would build its buffer with another seed: the state decides
    resumed = Loader(_pipeline(BufferSource(_buffer("without", seed=99), BATCH), depth))
    resumed.load_state_dict(torch.load(blob, weights_only=True))
    assert _all_same(first + list(resumed), uninterrupted)


def test_reset_starts_a_new_epoch_and_restores_a_state() -> None:
    source = BufferSource(_buffer("without", seed=10), batch_size=BATCH)
    twin = _buffer("without", seed=10)
    twin.batch_size = BATCH
    twin_it = iter(twin)
    first = [next(source) for _ in range(3)]
    assert _all_same(first, [next(twin_it) for _ in range(3)])
    rest_of_epoch, next_epoch = list(twin_it), list(twin)
    state = source.state_dict()
    source.reset()  # a fresh epoch, like a new iteration of the twin
    assert source.num_yielded == 0
    assert _all_same(list(source), next_epoch)
    source.reset(state)  # back to the fourth batch of the first epoch
    assert _all_same(list(source), rest_of_epoch)


def test_reset_without_state_never_replays_batches() -> None:
    source = BufferSource(_buffer("uniform", seed=11), batch_size=BATCH, num_batches=2)
    got = list(source)
    source.reset()
    got += list(source)
    assert _all_same(got, _expected(_buffer("uniform", seed=11), "plain", 4))


def test_prioritized_state_restores_draws_not_priorities() -> None:
    rb = _buffer("prioritized", seed=12)
    source = BufferSource(rb, batch_size=BATCH)
    state = source.state_dict()
    rb.update_priority(torch.arange(N), torch.rand(N, generator=torch.Generator().manual_seed(0)))
    priorities = rb.sampler.priority_values()
    gen_after = rb.sampler.generator.get_state()
    next(source)
    source.reset(state)
    assert torch.equal(rb.sampler.priority_values(), priorities)  # the buffer's data stays
    assert torch.equal(rb.sampler.generator.get_state(), gen_after)  # the draws rewind


# --- prefetching and priorities ------------------------------------------------------------
def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the prefetcher did not fill its queue")
        time.sleep(0.005)


def test_prefetched_batches_keep_the_priorities_they_were_drawn_with() -> None:
    factor = 4
    rb = _buffer("prioritized", seed=13, eps=0.0)
    twin = _buffer("prioritized", seed=13, eps=0.0)
    source = BufferSource(rb, batch_size=BATCH)
    it = iter(Loader(Prefetcher(source, prefetch_factor=factor)))
    first = next(it)
    _wait_for(lambda: source.num_yielded == 1 + factor)  # the queue is full, drawing paused

    # every priority but slot 5's goes to 0: new draws can only return slot 5
    source.update_priority(torch.arange(N), torch.zeros(N))
    source.update_priority(5, 3.0)
    prefetched = [next(it) for _ in range(factor)]
    later = [next(it) for _ in range(3)]

    # the prefetched batches are exactly those drawn with the old priorities
    assert _all_same([first, *prefetched], [twin.sample(BATCH) for _ in range(1 + factor)])
    assert any(bool((b["index"] != 5).any()) for b in prefetched)
    for b in later:
        assert b["index"].eq(5).all() and b["weight"].eq(1.0).all()
    # their indices are valid for update_priority, and the update lands on those slots
    for b in prefetched:
        source.update_priority(b["index"], 2.0)
    touched = torch.cat([b["index"] for b in prefetched]).unique()
    values = rb.sampler.priority_values(touched)
    assert torch.allclose(values, torch.full_like(values, 2.0**0.7))


def test_priority_updates_during_prefetch_are_serialised_with_draws() -> None:
    """Updates through the source while a pipeline draws: every batch stays consistent."""
    rb = _buffer("prioritized", seed=14, eps=0.0)
    source = BufferSource(rb, batch_size=BATCH)
    loader = Loader(Prefetcher(ParallelMapper(source, _double, num_workers=2), 4))
    stop = threading.Event()
    gen = torch.Generator().manual_seed(1)

    def update() -> None:
        while not stop.is_set():
            index = torch.randint(N, (32,), generator=gen)
            source.update_priority(index, torch.rand(32, generator=gen).double())

    thread = threading.Thread(target=update)
    thread.start()
    try:
        for batch in itertools.islice(loader, 200):
            index, weight = batch["index"], batch["weight"]
            assert bool(((index >= 0) & (index < N)).all())
            assert bool((torch.isfinite(weight) & (weight > 0) & (weight <= 1)).all())
            assert torch.equal(batch["observation"], _double(rb.storage[index])["observation"])
    finally:
        stop.set()
        thread.join()


# --- bad input --------------------------------------------------------------------------------
class _DuckSampler:
    data_source = None

    def sample(self, batch_size: int) -> torch.Tensor:
        return torch.zeros(batch_size, dtype=torch.long)


def test_constructor_rejects_bad_arguments() -> None:
    rb = _buffer("uniform")
    with pytest.raises(
        TypeError, match="buffer must be an rbdata ReplayBuffer or MixedBuffer, got list"
    ):
        BufferSource([1, 2, 3])  # type: ignore[arg-type]
    duck = ReplayBuffer(TensorStorage(10), sampler=_DuckSampler())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="buffer: BufferSource needs an rbdata Sampler"):
        BufferSource(duck, batch_size=2)
    with pytest.raises(ValueError, match=r"batch_size: pass .* got None"):
        BufferSource(rb)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        BufferSource(rb, batch_size=0)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="num_batches must be a positive integer"):
            BufferSource(rb, batch_size=2, num_batches=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_batches: SamplerWithoutReplacement ends"):
        BufferSource(_buffer("without"), batch_size=2, num_batches=3)


def _bad_states(good: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    def edit(**changes: Any) -> dict[str, Any]:
        return {**good, **changes}

    missing = {k: v for k, v in good.items() if k != "started"}
    perm = good["sampler_state"]["perm"].clone()
    perm[0] = perm[1]  # not a permutation
    return [
        (missing, r"initial_state: expected a dict with keys"),
        (edit(sampler="UniformSampler"), r"initial_state\['sampler'\]: the state is for a Unif"),
        (edit(batch_size=BATCH + 1), r"initial_state\['batch_size'\]: the state was saved"),
        (edit(num_yielded=-1), r"initial_state\['num_yielded'\]: expected an int >= 0"),
        (edit(started=1), r"initial_state\['started'\]: expected a bool"),
        (edit(sampler_state=[1]), r"initial_state\['sampler_state'\]: expected a dict"),
        (edit(sampler_state={}), r"initial_state\['sampler_state'\]: not a state"),
        (edit(sampler_state={**good["sampler_state"], "perm": perm}), "not a permutation"),
    ]


def test_reset_with_a_bad_state_changes_nothing() -> None:
    source = BufferSource(_buffer("without", seed=15), batch_size=BATCH)
    twin = _buffer("without", seed=15)
    twin.batch_size = BATCH
    twin_it = iter(twin)
    assert _same(next(source), next(twin_it))
    good = source.state_dict()
    for bad, message in _bad_states(good):
        with pytest.raises(ValueError, match=message):
            source.reset(bad)
        state = source.state_dict()
        assert state["num_yielded"] == 1 and state["started"] is True
        assert torch.equal(state["sampler_state"]["perm"], good["sampler_state"]["perm"])
    assert _all_same(list(source), list(twin_it))  # the epoch goes on as before


def test_prioritized_bad_generator_state_is_refused() -> None:
    source = BufferSource(_buffer("prioritized", seed=16), batch_size=BATCH)
    good = source.state_dict()
    bad = {**good, "sampler_state": {"generator": torch.zeros(3)}}
    with pytest.raises(ValueError, match=r"\['generator'\]: expected a uint8 tensor"):
        source.reset(bad)
    bad = {**good, "sampler_state": {"generator": torch.zeros(3, dtype=torch.uint8)}}
    with pytest.raises(ValueError, match=r"initial_state\['sampler_state'\]: not a state"):
        source.reset(bad)
    assert torch.equal(
        source.state_dict()["sampler_state"]["generator"], good["sampler_state"]["generator"]
    )


def test_empty_buffer_raises_until_filled() -> None:
    rb = ReplayBuffer(TensorStorage(CAPACITY), sampler=_sampler("without", seed=17))
    source = BufferSource(rb, batch_size=BATCH)
    with pytest.raises(EmptyBufferError):
        next(source)
    rb.extend({"observation": torch.arange(16.0)})
    assert sorted(torch.cat([b["index"] for b in source]).tolist()) == list(range(16))
