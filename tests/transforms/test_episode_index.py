"""``EpisodeIndex`` against a per-step Python model of the ring: bounds after every write."""

from __future__ import annotations

import random
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

from rbdata import ArrowStorage, ListStorage, MemmapStorage, ReplayBuffer, TensorStorage
from rbdata.transforms import EpisodeIndex, _goals
from rbdata.transforms._goals import STRATEGIES, goal_slots
from rbdata.transforms._goals_reference import goal_slots_reference
from tests._ring import Ring


def _items(done: list[bool], start: int) -> dict:
    n = len(done)
    return {
        "t": torch.arange(start, start + n),
        "next": {"done": torch.tensor(done, dtype=torch.bool).reshape(n, 1)},
    }


def _storage(kind: str, capacity: int, tmp_path: Path):
    if kind == "tensor":
        return TensorStorage(capacity)
    if kind == "list":
        return ListStorage(capacity)
    if kind == "arrow":
        return ArrowStorage(capacity, tmp_path / "arrow", chunk_size=5)
    return MemmapStorage(capacity, tmp_path / "mm")


@pytest.mark.parametrize("kind", ["tensor", "list", "memmap"])
@pytest.mark.parametrize("seed", range(3))
def test_bounds_match_the_brute_force_ring(kind: str, seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([7, 16, 33])
    storage = _storage(kind, capacity, tmp_path)
    rb = ReplayBuffer(storage)
    model = Ring(capacity)
    episodes = EpisodeIndex(storage)
    for _ in range(15):
        # chunks up to a whole turn (which leaves the length and next slot as they were)
        n = rng.randint(1, capacity)
        done = [rng.random() < 0.2 for _ in range(n)]
        rb.extend(_items(done, len(model.done)))
        model.write(done)
        slots = torch.arange(len(storage))
        first, last, finished = episodes.bounds(slots)
        expected = [model.bounds(s) for s in range(len(storage))]
        assert first.tolist() == [e[0] for e in expected]
        assert last.tolist() == [e[1] for e in expected]
        assert finished.tolist() == [e[2] for e in expected]


def test_traj_key_ids_give_the_same_bounds() -> None:
    rng = random.Random(5)
    capacity = 20
    storage = TensorStorage(capacity)
    rb = ReplayBuffer(storage)
    model = Ring(capacity)
    episodes = EpisodeIndex(storage, traj_key="episode")
    for _ in range(20):
        done = [rng.random() < 0.25 for _ in range(rng.randint(1, 9))]
        model.write(done)
        ids = model.episode[-len(done) :]
        rb.extend({"episode": torch.tensor(ids), "x": torch.zeros(len(done))})
        first, last, _ = episodes.bounds(torch.arange(len(storage)))
        expected = [model.bounds(s)[:2] for s in range(len(storage))]
        # an id change is only seen at the next step: the newest episode is still running
        assert list(zip(first.tolist(), last.tolist(), strict=True)) == expected


@pytest.mark.parametrize("kind", ["tensor", "list", "memmap", "arrow"])
@pytest.mark.parametrize("turns", [1, 2])
def test_whole_turns_between_two_looks_are_seen(kind: str, turns: int, tmp_path: Path) -> None:
    """A write of exactly C (or 2C) steps leaves len and next_slot as they were: still seen."""
    capacity = 12
    storage = _storage(kind, capacity, tmp_path)
    rb = ReplayBuffer(storage)
    model = Ring(capacity)
    episodes = EpisodeIndex(storage)
    rng = random.Random(turns)
    for p_end, first in [(0.3, 5), (0.1, capacity * turns), (0.5, capacity * turns)]:
        for n in (first,) if first < capacity else (capacity,) * turns:
            done = [rng.random() < p_end for _ in range(n)]
            rb.extend(_items(done, len(model.done)))
            model.write(done)
        first_slot, last_slot, finished = episodes.bounds(torch.arange(len(storage)))
        expected = [model.bounds(s) for s in range(len(storage))]
        assert first_slot.tolist() == [e[0] for e in expected]
        assert last_slot.tolist() == [e[1] for e in expected]
        assert finished.tolist() == [e[2] for e in expected]


def test_storage_set_and_single_adds_are_seen() -> None:
    """Writes that bypass the buffer (``storage.set``) and per-step adds count too."""
    storage = TensorStorage(4)
    rb = ReplayBuffer(storage)
    rb.extend(_items([False, True, False, False], 0))
    episodes = EpisodeIndex(storage)
    assert episodes.bounds(torch.tensor([0]))[1].tolist() == [1]
    storage.set(slice(0, 4), _items([False, False, False, True], 4))  # a whole turn
    assert episodes.bounds(torch.tensor([0]))[1].tolist() == [3]
    for t, done in enumerate([True, False, False, False], 8):  # one step at a time
        rb.add({"t": torch.tensor(t), "next": {"done": torch.tensor([done])}})
    assert episodes.bounds(torch.tensor([0, 1]))[1].tolist() == [0, 3]
    assert episodes.bounds(torch.tensor([0, 1]))[2].tolist() == [True, False]


def test_missing_key_and_bad_arguments() -> None:
    storage = TensorStorage(4)
    ReplayBuffer(storage).extend({"x": torch.zeros(3)})
    try:
        EpisodeIndex(storage).sync()
    except KeyError as err:  # a KeyError subclass, whose message prints as written
        assert "\\" not in str(err) and str(err).startswith("the storage has no key")
        assert "Error: the storage has no key ('next', 'done')" in repr_line(err)
    else:
        raise AssertionError("no KeyError")
    with pytest.raises(TypeError, match="end_key"):
        EpisodeIndex(storage, end_key=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Storage"):
        EpisodeIndex([1, 2, 3])


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("geom", [False, True])
def test_numba_kernel_equals_the_python_reference(strategy: str, geom: bool) -> None:
    rng = np.random.default_rng(0)
    for capacity, time in [(50, 30), (50, 50), (50, 137)]:
        oldest = max(0, time - capacity)
        ends = np.unique(rng.integers(oldest, time, 9))
        base = int(rng.integers(capacity))
        slots = rng.integers(0, min(capacity, time), 64)
        u = rng.random((64, 4))
        args = (slots, u, ends, time, base, capacity, strategy, 40, (0.2, 0.5, 0.3), geom, 0.9)
        assert goal_slots(*args).tolist() == goal_slots_reference(*args).tolist()


def test_episode_search_equals_searchsorted() -> None:
    """The guessed search (exact for one episode length) against numpy, on every shape of ends.

    Equal lengths (the guess is the answer), lengths that vary a little or wildly (the guess
    misses, the halvings take over), no ends, one end, times before, between and after them.
    """
    rng = np.random.default_rng(1)
    for trial in range(3000):
        count = int(rng.integers(0, 40))
        lengths = [
            np.full(count, int(rng.integers(1, 20))),
            rng.integers(1, 30, count),
            rng.choice([1, 2, 500], count),
        ][trial % 3]
        start = int(rng.integers(-5, 10**12))
        ends = (start + np.cumsum(lengths) - 1).astype(np.int64)
        times = rng.integers(start - 40, (ends[-1] if count else start) + 30, int(rng.integers(60)))
        found = np.full(times.shape[0], -7, np.int64)
        _goals._episodes_of(
            ends, times, found, times.shape[0], np.empty(3 * times.shape[0], np.int64)
        )
        assert found.tolist() == np.searchsorted(ends, times).tolist(), (ends, times)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_kernel_equals_the_reference_on_equal_episodes_around_the_ring(strategy: str) -> None:
    """Episodes of one length (every search resolved by the guess), the ring wrapped."""
    rng = np.random.default_rng(2)
    for capacity, time, length in [(60, 60, 10), (60, 257, 10), (64, 1000, 7), (50, 49, 50)]:
        oldest = max(0, time - capacity)
        ends = np.arange(length - 1, time, length, dtype=np.int64)
        ends = ends[ends >= oldest]
        base = int(rng.integers(capacity))
        slots = rng.integers(0, min(capacity, time), 64)
        u = rng.random((64, 4))
        args = (slots, u, ends, time, base, capacity, strategy, 51, (0.2, 0.5, 0.3), True, 0.9)
        assert goal_slots(*args).tolist() == goal_slots_reference(*args).tolist()


@pytest.mark.parametrize("kind", ["tensor", "list", "memmap"])
def test_a_checkpoint_loaded_into_the_storage_is_seen(kind: str, tmp_path: Path) -> None:
    """``rb.load`` replaces every item, len and next_slot as they were: still re-indexed."""
    capacity = 6
    saved = ReplayBuffer(_storage(kind, capacity, tmp_path / "a"))
    saved.extend(_items([False, False, False, False, False, True], 0))
    saved.dumps(tmp_path / "ckpt", fsync=False)
    rb = ReplayBuffer(_storage(kind, capacity, tmp_path / "b"))
    rb.extend(_items([True, False, True, False, True, False], 0))
    episodes = EpisodeIndex(rb.storage)
    assert episodes.bounds(torch.tensor([3]))[1].tolist() == [4]
    rb.load(tmp_path / "ckpt")
    assert episodes.bounds(torch.tensor([3]))[1].tolist() == [5]


def repr_line(err: BaseException) -> str:
    """The last line of ``err``'s traceback, as Python prints it."""
    return traceback.format_exception_only(type(err), err)[-1].strip()
