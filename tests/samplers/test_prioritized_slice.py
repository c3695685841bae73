"""PrioritizedSliceSampler against brute force: per-item priorities, masses, frequencies, weights.

The reference model knows nothing of rbdata's episode index nor of its trees: every written
step's episode id (``brute_spans``), every slot's item priority written item by item (the last
of duplicates wins), and a slice's priority taken from its items as the docs say.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

import pytest
import torch
from _slice_model import brute_spans, episodes, fill
from hypothesis import given, settings
from hypothesis import strategies as st
from sampler_contract import SamplerContract

from rbdata import PrioritizedSliceSampler, ReplayBuffer, TensorStorage
from rbdata.samplers._slice_priorities import covering_starts, last_wins


@pytest.fixture(autouse=True)
def _every_tree_path(tree_path: str) -> str:
    """Every test runs on the numba trees and on the device path (``tree_path``, conftest)."""
    return tree_path


class TestPrioritizedSliceSampler(SamplerContract):
    sized = True  # a tree of fixed size: a storage larger than it is refused

    def make(self, generator: torch.Generator | None, capacity: int = 16) -> Any:
        return PrioritizedSliceSampler(capacity, 0.7, 0.5, slice_len=2, generator=generator)

    def bad_states(self, state: dict[str, Any]) -> list[tuple[dict[str, Any], type, str]]:
        nan = state["priority"].clone()
        nan[3] = float("nan")
        return [
            *super().bad_states(state),
            ({**state, "capacity": 32}, ValueError, "the state is for 32 slots"),
            ({**state, "priority": nan}, ValueError, "NaN, infinite or negative"),
            ({**state, "priority": -state["priority"] - 1}, ValueError, "NaN, infinite"),
            ({**state, "priority": torch.ones(3)}, ValueError, "expected 16 floating"),
            ({**state, "max_priority": 1e300}, ValueError, "overflow the tree's dtype"),
            ({**state, "ends": state["ends"].flip(0)}, ValueError, "not increasing"),
        ]

    def test_draws_follow_updated_priorities(self) -> None:
        # by design: an update changes the draws (episodes of 3 steps: starts 1,2,4,5,...)
        rb = self.buffer(seed=0)
        for start in (1, 2, 4, 5, 7, 8, 10, 11):
            rb.update_priority([start, start + 1], [0.0, 0.0])
        rb.update_priority([5, 6], [1.0, 0.0])
        index = torch.cat([rb.sampler.draw(4)[0] for _ in range(20)])
        assert set(index.tolist()) == {5, 6}


HOWS = ["start", "max", "mean"]


def chi2_quantile_999(df: int) -> float:
    """Wilson-Hilferty approximation of the 99.9% chi-square quantile."""
    z = 3.0902
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def slots_of_start(start: int, span: int, length: int, capacity: int) -> list[int]:
    """Brute-force items of the slice of ``span`` real steps starting at time ``start``."""
    return [(start + min(j, span - 1)) % capacity for j in range(length)]


class Model:
    """Per-item priorities, written one item at a time, and the masses they give (brute force)."""

    def __init__(self, capacity: int, alpha: float, eps: float, how: str, first: float = 1.0):
        self.capacity, self.alpha, self.eps, self.how = capacity, alpha, eps, how
        self.item = [0.0] * capacity
        self.seen = first  # the highest priority seen: new items get it

    def written(self, first_time: int, last_time: int) -> None:
        for t in range(first_time, last_time):
            self.item[t % self.capacity] = self.seen

    def update(self, index: list[int], p: list[float]) -> None:
        for i, q in zip(index, p, strict=True):  # in order: the last of duplicates wins
            self.item[i] = q
        self.seen = max([self.seen, *p])

    def slice_priority(self, start: int, span: int) -> float:
        ps = [self.item[(start + j) % self.capacity] for j in range(span)]
        if self.how == "start":
            return ps[0]
        return max(ps) if self.how == "max" else sum(ps) / len(ps)

    def masses(self, valid: dict[int, int]) -> dict[int, float]:
        """Slot -> mass of every valid start (every other slot: 0)."""
        return {
            s % self.capacity: (self.slice_priority(s, span) + self.eps) ** self.alpha
            for s, span in valid.items()
        }


def assert_masses(sampler: PrioritizedSliceSampler, expected: dict[int, float]) -> None:
    got = sampler.priority_values().double()
    want = torch.zeros_like(got)
    for slot, v in expected.items():
        want[slot] = v
    want = want.to(sampler.priority_values().dtype).double()  # the trees' rounding
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-30)


def random_updates(
    capacity: int, filled: int, g: torch.Generator, rounds: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Any index sets: every item, a scattered subset, runs, duplicates, any order, scalars."""
    out = [(torch.arange(filled), torch.rand(filled, generator=g, dtype=torch.float64) * 4)]
    for r in range(rounds):
        n = int(torch.randint(1, 2 * filled, (1,), generator=g))
        index = torch.randint(filled, (n,), generator=g)  # duplicates likely
        out.append((index, torch.rand(n, generator=g, dtype=torch.float64) * (r % 3 + 1)))
    out.append((torch.randperm(filled, generator=g)[:7], torch.tensor(0.5)))  # one for all
    return out


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("strict", [True, False])
def test_frequencies_and_weights_against_brute_force(strict: bool, how: str) -> None:
    capacity, length, alpha, beta, eps = 40, 3, 0.7, 0.6, 1e-3
    gen = torch.Generator().manual_seed(0)
    sampler = PrioritizedSliceSampler(
        capacity,
        alpha,
        beta,
        slice_len=length,
        strict_length=strict,
        eps=eps,
        generator=gen,
        slice_priority=how,
    )
    rb = ReplayBuffer(TensorStorage(capacity), sampler=sampler)
    model = Model(capacity, alpha, eps, how)
    # ring wrap (53 steps), episodes shorter than a slice, the last one still running
    episode_of = fill(rb, [7, 2, 12, 1, 9, 5, 11, 8], [25, 28])
    model.written(0, len(episode_of))
    valid = brute_spans(episode_of, capacity, length, strict)
    g = torch.Generator().manual_seed(11)
    for index, p in random_updates(capacity, capacity, g, rounds=6):
        rb.update_priority(index, p)
        model.update(index.tolist(), p.expand(index.shape).tolist())
        assert_masses(sampler, model.masses(valid))
    assert sampler.priorities().tolist() == model.item
    assert sampler.max_priority == model.seen
    value = {s: v for s, v in zip(valid, model.masses(valid).values(), strict=True)}
    total = sum(value.values())
    # frequencies of each start against brute force
    draws = 60_000
    index, extras = sampler.draw(draws * length)
    starts = index.view(draws, length)[:, 0]
    counts = torch.bincount(starts, minlength=capacity).double()
    slots = {s % capacity: s for s in valid}
    assert set(torch.nonzero(counts).flatten().tolist()) <= set(slots)
    chi2 = sum(
        (counts[k] - draws * value[s] / total) ** 2 / (draws * value[s] / total)
        for k, s in slots.items()
    )
    assert float(chi2) < chi2_quantile_999(len(valid) - 1)
    # weights: (N P(s))^-beta / max over valid starts, repeated on the slice's items
    n = len(valid)
    w = {s: (n * value[s] / total) ** -beta for s in valid}
    top = max(w.values())
    expected_w = torch.tensor([w[slots[int(k)]] / top for k in starts], dtype=torch.float32)
    weight = extras["weight"].view(draws, length)
    torch.testing.assert_close(weight[:, 0], expected_w, rtol=1e-5, atol=1e-6)
    assert bool((weight == weight[:, :1]).all())
    # slices: items and padding as brute force says (never across an episode end)
    for row in range(300):
        s = slots[int(starts[row])]
        items = index.view(draws, length)[row].tolist()
        assert items == slots_of_start(s, valid[s], length, capacity)
        assert len({episode_of[s + j] for j in range(valid[s])}) == 1
        if not strict:
            mask = extras["mask"].view(draws, length)[row]
            assert mask.tolist() == [j < valid[s] for j in range(length)]


@pytest.mark.parametrize("how", HOWS)
def test_every_item_of_an_arange_update_is_used(how: str) -> None:
    # torchrl's docs: rb.update_priority(torch.arange(n), prio). Each start's mass is its own
    # item's priority ("start"), or its slice's max / mean: never one item of eight.
    n, length = 48, 8
    sampler = PrioritizedSliceSampler(
        n, 1.0, 0.0, slice_len=length, eps=0.0, slice_priority=how, generator=torch.Generator()
    )
    rb = ReplayBuffer(TensorStorage(n), sampler=sampler)
    episode_of = fill(rb, [20, 28], [n])  # starts 0-12 and 20-40
    prio = torch.rand(n, generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 0.5
    rb.update_priority(torch.arange(n), prio)
    assert torch.equal(sampler.priorities(), prio)
    model = Model(n, 1.0, 0.0, how)
    model.update(list(range(n)), prio.tolist())
    expected = model.masses(brute_spans(episode_of, n, length, True))
    if how != "max":  # (neighbouring windows share their max)
        assert len(set(expected.values())) == len(expected)  # every start its own mass
    assert_masses(sampler, expected)
    if how == "start":  # the start's mass is its item's priority
        starts = torch.tensor(sorted(expected))
        torch.testing.assert_close(
            sampler.priority_values(starts).double(), prio[starts].float().double()
        )


@pytest.mark.parametrize("how", HOWS)
def test_scattered_updates_rederive_the_starts_that_cover_them(how: str) -> None:
    capacity, length = 30, 4
    sampler = PrioritizedSliceSampler(
        capacity,
        1.0,
        0.0,
        slice_len=length,
        eps=0.0,
        slice_priority=how,
        generator=torch.Generator(),
    )
    rb = ReplayBuffer(TensorStorage(capacity), sampler=sampler)
    episode_of = fill(rb, [9, 3, 12, 6, 10], [20, 20])  # wraps: times 10..39 retained
    valid = brute_spans(episode_of, capacity, length, True)
    model = Model(capacity, 1.0, 0.0, how)
    model.written(0, len(episode_of))
    for index in ([3, 17, 25, 29, 0, 11, 8, 21], [29, 0], [5], [12, 12, 12]):  # scattered
        p = [2.0 + 0.5 * k + 0.1 * i for k, i in enumerate(index)]
        rb.update_priority(index, p)
        model.update(index, p)
        assert_masses(sampler, model.masses(valid))
    assert sampler.priorities([12]).tolist() == [model.item[12]]  # duplicates: the last


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(4, 30),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=10),
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    length=st.integers(1, 4),
    strict=st.booleans(),
    how=st.sampled_from(HOWS),
    seed=st.integers(0, 2**16),
)
def test_masses_match_brute_force_after_every_write_and_update(
    capacity: int,
    lengths: list[int],
    sizes: list[int],
    length: int,
    strict: bool,
    how: str,
    seed: int,
) -> None:
    sampler = PrioritizedSliceSampler(
        capacity,
        1.0,
        0.5,
        slice_len=length,
        strict_length=strict,
        eps=0.0,
        slice_priority=how,
        generator=torch.Generator().manual_seed(0),
    )
    rb = ReplayBuffer(TensorStorage(capacity), sampler=sampler)
    model = Model(capacity, 1.0, 0.0, how)
    g = torch.Generator().manual_seed(seed)
    steps = episodes(lengths)
    time = 0
    for size in sizes:  # after each write (ends found, episodes extended, ring overwrites)
        size = min(size, capacity, steps.batch_size[0] - time)
        if size <= 0:
            break
        rb.extend(steps[time : time + size])
        model.written(time, time + size)
        time += size
        valid = brute_spans(steps["episode"][:time].tolist(), capacity, length, strict)
        assert_masses(sampler, model.masses(valid))
        filled = min(time, capacity)  # then any items, any priorities
        n = int(torch.randint(0, 2 * filled, (1,), generator=g))
        index = torch.randint(filled, (n,), generator=g)
        p = torch.rand(n, generator=g, dtype=torch.float64) * 3
        rb.update_priority(index, p)
        model.update(index.tolist(), p.tolist())
        assert_masses(sampler, model.masses(valid))
        if valid:
            index, _extras = sampler.draw(64 * length)
            for row in index.view(64, length).tolist():
                s = next(t for t in valid if t % capacity == row[0])
                assert row == slots_of_start(s, valid[s], length, capacity)
        else:
            with pytest.raises(ValueError, match=f"no episode in the buffer has {length}"):
                sampler.draw(length)


@settings(max_examples=60, deadline=None)
@given(
    index=st.lists(st.integers(0, 9), max_size=20),
    capacity=st.integers(10, 14),
    filled=st.integers(1, 14),
    length=st.integers(1, 5),
    how=st.sampled_from(HOWS),
)
def test_update_helpers_against_brute_force(
    index: list[int], capacity: int, filled: int, length: int, how: str
) -> None:
    p = [float(k) for k in range(len(index))]
    last: dict[int, float] = {}
    for i, q in zip(index, p, strict=True):
        last[i] = q
    got = last_wins(torch.tensor(index, dtype=torch.long), torch.tensor(p)).tolist()
    assert got == [last[i] for i in index]
    # every start whose slice of `length` can hold a slot, within the filled slots
    slots = [i for i in index if i < filled]
    covered = set(
        covering_starts(
            torch.tensor(slots, dtype=torch.long), length, how, capacity, filled
        ).tolist()
    )
    reach = 1 if how == "start" else length
    want = {(i - k) % capacity for i in slots for k in range(reach)}
    assert covered == {c for c in want if c < filled}


def test_updates_before_the_slice_length_is_known() -> None:
    # num_slices: no masses until a draw fixes the length; item updates are kept
    gen = torch.Generator().manual_seed(0)
    sampler = PrioritizedSliceSampler(
        30, 1.0, 0.0, num_slices=2, eps=0.0, slice_priority="max", generator=gen
    )
    rb = ReplayBuffer(TensorStorage(30), sampler=sampler)
    rb.extend(episodes([3, 5, 4]))
    rb.update_priority([1, 4, 9, 11], [3.0, 0.5, 2.0, 7.0])
    assert sampler.total() == 0.0
    model = Model(30, 1.0, 0.0, "max")
    model.written(0, 12)
    model.update([1, 4, 9, 11], [3.0, 0.5, 2.0, 7.0])
    episode_of = [0] * 3 + [1] * 5 + [2] * 4
    for length in (2, 4, 3):
        sampler.draw(2 * length)
        assert_masses(sampler, model.masses(brute_spans(episode_of, 30, length, True)))


def test_bad_updates_change_nothing() -> None:
    sampler = PrioritizedSliceSampler(
        16, 1.0, 0.5, slice_len=2, slice_priority="mean", generator=torch.Generator()
    )
    rb = ReplayBuffer(TensorStorage(16), sampler=sampler)
    rb.extend(episodes([4, 4, 4]))
    before = sampler.priorities(), sampler.priority_values(), sampler.max_priority
    cases = [
        ([0, 1, 2, 3], [1.0, float("nan"), 1.0, 1.0], "expected finite values"),
        ([0, 1, 2, 3], [1.0, 1.0, -2.0, 1.0], "expected values >= 0"),
        ([0, 1, 12, 13], [1.0, 1.0, 1.0, 1.0], "outside the filled range"),
        ([0, 1, 2, -1], [1.0, 1.0, 1.0, 1.0], "outside the filled range"),
        ([0, 1, 2, 3], [1.0, 1.0, 1.0, float("inf")], "expected finite values"),
        ([0, 5, 9], [1.0, 1e39, 1.0], "not finite in the tree's float32"),
        ([0, 5, 9], [3e38, 3e38, 3e38], "total overflow"),
    ]
    for index, p, message in cases:
        with pytest.raises(ValueError, match=message):
            rb.update_priority(index, p)
            sampler.check_errors()  # where device trees report
        assert torch.equal(sampler.priorities(), before[0])
        assert torch.equal(sampler.priority_values(), before[1])
        assert sampler.max_priority == before[2]
        with pytest.raises(ValueError, match=message):  # check_priority: the same error
            sampler.check_priority(index, p)
    with pytest.raises(ValueError, match="expected 3 values"):
        rb.update_priority([0, 1, 2], [1.0, 2.0])
    rb.update_priority([0, 1, 2], 0.25)  # any number of items, one priority for all
    assert sampler.priorities([0, 1, 2]).tolist() == [0.25] * 3


def test_storage_first_like_every_sampler() -> None:
    def steps() -> Any:
        return episodes([6, 3, 9, 5, 1])

    storage = TensorStorage(24)
    first = PrioritizedSliceSampler(
        storage, 0.6, 0.4, slice_len=3, generator=torch.Generator().manual_seed(2)
    )
    assert first.capacity == 24 and first.data_source is storage
    rb = ReplayBuffer(storage, sampler=first)
    rb.extend(steps())
    old = PrioritizedSliceSampler(
        24, 0.6, 0.4, slice_len=3, generator=torch.Generator().manual_seed(2)
    )
    other = ReplayBuffer(TensorStorage(24), sampler=old)
    other.extend(steps())
    for buffer in (rb, other):
        buffer.update_priority(torch.arange(24), torch.linspace(0.1, 3.0, 24))
    for _ in range(3):
        a, b = first.draw(12), old.draw(12)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1]["weight"], b[1]["weight"])
    # a filled storage given first, no buffer: its episodes are indexed at the first use
    alone = PrioritizedSliceSampler(
        storage, 0.6, 0.4, slice_len=3, generator=torch.Generator().manual_seed(2)
    )
    alone.update_priority(torch.arange(24), torch.linspace(0.1, 3.0, 24))
    assert torch.equal(alone.priority_values(), first.priority_values())
    with pytest.raises(ValueError, match="the storage given first is not data_source"):
        PrioritizedSliceSampler(storage, 0.6, 0.4, slice_len=3, data_source=TensorStorage(24))
    with pytest.raises(ValueError, match="fewer than the 24 items"):
        ReplayBuffer(storage, sampler=PrioritizedSliceSampler(16, 0.6, 0.4, slice_len=3))
    with pytest.raises(TypeError, match="use `capacity=`"):
        PrioritizedSliceSampler(max_capacity=24, alpha=0.6, beta=0.4, slice_len=3)
    with pytest.raises(ValueError, match="slice_priority must be one of"):
        PrioritizedSliceSampler(storage, 0.6, 0.4, slice_len=3, slice_priority="min")


@pytest.mark.parametrize("how", HOWS)
def test_resume_and_pickle_continue_the_draws(how: str) -> None:
    gen = torch.Generator().manual_seed(3)
    sampler = PrioritizedSliceSampler(24, 0.6, 0.4, slice_len=3, slice_priority=how, generator=gen)
    rb = ReplayBuffer(TensorStorage(24), sampler=sampler)
    steps = episodes([5, 8, 4, 9, 6])
    rb.extend(steps[:20])
    rb.extend(steps[20:])
    index, _ = sampler.draw(12)
    rb.update_priority(index, torch.arange(12.0))
    rb.update_priority([2, 19, 7], [5.0, 0.1, 2.5])
    state = sampler.state_dict()
    assert torch.equal(state["priority"], sampler.priorities())  # per item
    clone = pickle.loads(pickle.dumps(sampler))
    expected = [sampler.draw(12) for _ in range(3)]
    other = PrioritizedSliceSampler(
        24, 0.6, 0.4, slice_len=3, slice_priority=how, generator=torch.Generator()
    )
    ReplayBuffer(rb.storage, sampler=other)
    other.load_state_dict(state)
    assert torch.equal(other.priority_values(), sampler.priority_values())
    for again in (other, clone):
        for (a, ea), (b, eb) in zip(expected, [again.draw(12) for _ in range(3)], strict=True):
            assert torch.equal(a, b) and torch.equal(ea["weight"], eb["weight"])


def test_a_state_of_start_priorities_loads_as_item_priorities() -> None:
    # before priorities were per item, "priority" held each slot's start priority: with
    # slice_priority="start" those are the items' priorities that give the same masses
    storage = TensorStorage(20)
    sampler = PrioritizedSliceSampler(
        storage, 1.0, 0.4, slice_len=3, eps=0.0, generator=torch.Generator()
    )
    rb = ReplayBuffer(storage, sampler=sampler)
    episode_of = fill(rb, [8, 12], [20])
    state = sampler.state_dict()
    starts = sorted(brute_spans(episode_of, 20, 3, True))
    saved = torch.zeros(20, dtype=torch.float64)
    saved[starts] = torch.arange(1.0, len(starts) + 1, dtype=torch.float64)
    sampler.load_state_dict({**state, "priority": saved, "max_priority": float(len(starts))})
    expected = torch.zeros(20)
    expected[starts] = saved[starts].float()
    assert torch.equal(sampler.priority_values(), expected)


def test_triton_kernels_match_the_numba_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fused kernels (Triton's interpreter on CPU) against the numba trees, same seed
    pytest.importorskip("triton")
    from rbdata.samplers import prioritized as prioritized_module

    results = []
    for device_path, kernels in ((False, None), (True, "triton")):
        monkeypatch.setattr(prioritized_module, "_DEVICE_PATH_ON_CPU", device_path)
        monkeypatch.setattr(prioritized_module, "_DEVICE_KERNELS", kernels)
        gen = torch.Generator().manual_seed(2)
        sampler = PrioritizedSliceSampler(
            40, 0.6, 0.4, slice_len=3, slice_priority="max", generator=gen
        )
        rb = ReplayBuffer(TensorStorage(40), sampler=sampler)
        fill(rb, [7, 2, 12, 1, 9, 5, 11, 8], [25, 28])
        index, _ = sampler.draw(24)
        rb.update_priority(index, torch.linspace(0.0, 3.0, 24, dtype=torch.float64))
        rb.update_priority([3, 30, 3], [9.0, 0.0, 4.0])
        results.append((sampler.priority_values(), sampler.draw(300)))
    (values_a, (index_a, extras_a)), (values_b, (index_b, extras_b)) = results
    assert torch.equal(values_a, values_b)
    assert torch.equal(index_a, index_b) and torch.equal(extras_a["weight"], extras_b["weight"])


@pytest.mark.parametrize("how", HOWS)
def test_the_numba_update_matches_the_torch_path(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # CPU trees: one numba kernel per update; device trees: torch ops (their reference)
    from rbdata.samplers import prioritized as prioritized_module

    results = []
    for device_path, kernels in ((False, None), (True, "torch")):
        monkeypatch.setattr(prioritized_module, "_DEVICE_PATH_ON_CPU", device_path)
        monkeypatch.setattr(prioritized_module, "_DEVICE_KERNELS", kernels)
        sampler = PrioritizedSliceSampler(
            40,
            0.6,
            0.4,
            slice_len=4,
            strict_length=False,
            slice_priority=how,
            generator=torch.Generator().manual_seed(5),
        )
        rb = ReplayBuffer(TensorStorage(40), sampler=sampler)
        fill(rb, [7, 2, 12, 1, 9, 5, 11, 8], [25, 28])
        for index, p in random_updates(40, 40, torch.Generator().manual_seed(8), rounds=8):
            rb.update_priority(index, p)
        results.append((sampler.priorities(), sampler.priority_values(), sampler.max_priority))
    (prio_a, values_a, top_a), (prio_b, values_b, top_b) = results
    assert torch.equal(prio_a, prio_b) and top_a == top_b
    assert torch.equal(values_a, values_b)


def test_checkpoint_round_trip(tmp_path: Any) -> None:
    gen = torch.Generator().manual_seed(4)
    storage = TensorStorage(30)
    sampler = PrioritizedSliceSampler(
        storage, 0.6, 0.4, slice_len=2, slice_priority="mean", generator=gen
    )
    rb = ReplayBuffer(storage, sampler=sampler)
    fill(rb, [5, 3, 8, 6, 9], [20, 11])
    rb.update_priority(
        torch.randperm(30, generator=torch.Generator().manual_seed(1))[:17], torch.arange(17.0)
    )
    rb.dumps(tmp_path / "ckpt")
    expected = [sampler.draw(8)[0] for _ in range(3)]
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    assert isinstance(loaded.sampler, PrioritizedSliceSampler)
    assert loaded.sampler.slice_priority == "mean"
    assert torch.equal(loaded.sampler.priorities(), sampler.priorities())
    assert torch.equal(loaded.sampler.priority_values(), sampler.priority_values())
    got = [loaded.sampler.draw(8)[0] for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
