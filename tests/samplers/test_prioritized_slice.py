"""PrioritizedSliceSampler against brute force: masses, frequencies, weights, update routing."""

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


def chi2_quantile_999(df: int) -> float:
    """Wilson-Hilferty approximation of the 99.9% chi-square quantile."""
    z = 3.0902
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def slots_of_start(start: int, span: int, length: int, capacity: int) -> list[int]:
    """Brute-force items of the slice of ``span`` real steps starting at time ``start``."""
    return [(start + min(j, span - 1)) % capacity for j in range(length)]


@pytest.mark.parametrize("strict", [True, False])
def test_frequencies_and_weights_against_brute_force(strict: bool) -> None:
    capacity, length, alpha, beta, eps = 40, 3, 0.7, 0.6, 1e-3
    gen = torch.Generator().manual_seed(0)
    sampler = PrioritizedSliceSampler(
        capacity, alpha, beta, slice_len=length, strict_length=strict, eps=eps, generator=gen
    )
    rb = ReplayBuffer(TensorStorage(capacity), sampler=sampler)
    # ring wrap (53 steps), episodes shorter than a slice, the last one still running
    episode_of = fill(rb, [7, 2, 12, 1, 9, 5, 11, 8], [25, 28])
    valid = brute_spans(episode_of, capacity, length, strict)
    prio = {s: 0.1 + (7 * s % 13) / 4 for s in valid}  # distinct-ish priorities per start
    for s, span in valid.items():  # routed through the slice's items: the start gets the max
        items = slots_of_start(s, span, length, capacity)
        p_items = [prio[s] / 2] * span + [99.0] * (length - span)  # padding: ignored
        p_items[span - 1] = prio[s]  # the largest on the last real item
        rb.update_priority(items, p_items)
    value = {s: (prio[s] + eps) ** alpha for s in valid}
    total = sum(value.values())
    # masses: exactly the valid starts' values, zero elsewhere
    masses = sampler.priority_values().double()
    expected_mass = torch.zeros(capacity, dtype=torch.float64)
    for s in valid:
        expected_mass[s % capacity] = value[s]
    torch.testing.assert_close(masses, expected_mass.to(masses.dtype).double())
    # frequencies
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
    # slices: items and padding as brute force says
    for row in range(200):
        s = slots[int(starts[row])]
        assert index.view(draws, length)[row].tolist() == slots_of_start(
            s, valid[s], length, capacity
        )
        if not strict:
            mask = extras["mask"].view(draws, length)[row]
            assert mask.tolist() == [j < valid[s] for j in range(length)]


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(4, 30),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=10),
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    length=st.integers(1, 4),
    strict=st.booleans(),
)
def test_masses_match_brute_force_after_every_write(
    capacity: int, lengths: list[int], sizes: list[int], length: int, strict: bool
) -> None:
    sampler = PrioritizedSliceSampler(
        capacity,
        1.0,
        0.5,
        slice_len=length,
        strict_length=strict,
        eps=0.0,
        generator=torch.Generator().manual_seed(0),
    )
    rb = ReplayBuffer(TensorStorage(capacity), sampler=sampler)
    steps = episodes(lengths)
    time = 0
    for size in sizes:  # after each write (ends found, episodes extended, ring overwrites)
        size = min(size, capacity, steps.batch_size[0] - time)
        if size <= 0:
            break
        rb.extend(steps[time : time + size])
        time += size
        valid = brute_spans(steps["episode"][:time].tolist(), capacity, length, strict)
        live = torch.nonzero(sampler.priority_values()).flatten().tolist()
        assert sorted(live) == sorted(s % capacity for s in valid)
        if valid:
            index, _extras = sampler.draw(64 * length)
            for row in index.view(64, length).tolist():
                s = next(t for t in valid if t % capacity == row[0])
                assert row == slots_of_start(s, valid[s], length, capacity)
        else:
            with pytest.raises(ValueError, match=f"no episode in the buffer has {length}"):
                sampler.draw(length)


def reference_update(
    prio: dict[int, float], items: list[int], p: list[float], length: int
) -> float:
    """Slice by slice, in order: the start gets the max over its real (non-padding) items.

    Returns the largest slice priority of the call.
    """
    top = 0.0
    for k in range(0, len(items), length):
        sl, pl = items[k : k + length], p[k : k + length]
        real = [pl[0]] + [pl[j] for j in range(1, length) if sl[j] != sl[j - 1]]
        prio[sl[0]] = max(real)
        top = max(top, max(real))
    return top


@pytest.mark.parametrize("strict", [True, False])
def test_update_routing_against_a_reference(strict: bool) -> None:
    capacity, length = 32, 4
    gen = torch.Generator().manual_seed(1)
    sampler = PrioritizedSliceSampler(
        capacity, 0.5, 0.4, slice_len=length, strict_length=strict, generator=gen
    )
    rb = ReplayBuffer(TensorStorage(capacity), sampler=sampler)
    fill(rb, [6, 2, 9, 3, 7, 10], [20, 17])  # wraps; short episodes padded when not strict
    expected = {i: float(v) for i, v in enumerate(sampler.priorities().tolist())}
    g = torch.Generator().manual_seed(5)
    seen = sampler.max_priority
    for _ in range(20):
        index, _ = sampler.draw(8 * length)  # duplicates likely
        p = torch.rand(index.shape[0], generator=g, dtype=torch.float64) * 5
        rb.update_priority(index, p)
        top = reference_update(expected, index.tolist(), p.tolist(), length)
        seen = max(seen, top)
        got = sampler.priorities().tolist()
        assert got == [expected[i] for i in range(capacity)]
    assert sampler.max_priority == seen


def test_bad_updates_change_nothing() -> None:
    sampler = PrioritizedSliceSampler(16, 1.0, 0.5, slice_len=2, generator=torch.Generator())
    rb = ReplayBuffer(TensorStorage(16), sampler=sampler)
    rb.extend(episodes([4, 4, 4]))
    before = sampler.priorities(), sampler.priority_values()
    cases = [
        ([0, 1, 2, 3], [1.0, float("nan"), 1.0, 1.0], "expected finite values"),
        ([0, 1, 2, 3], [1.0, 1.0, -2.0, 1.0], "expected values >= 0"),
        ([0, 1, 12, 13], [1.0, 1.0, 1.0, 1.0], "outside the filled range"),
        ([0, 1, 2, 3], [1.0, 1.0, 1.0, float("inf")], "expected finite values"),
    ]
    for index, p, message in cases:
        with pytest.raises(ValueError, match=message):
            rb.update_priority(index, p)
            sampler.check_errors()  # where device trees report
        assert torch.equal(sampler.priorities(), before[0])
        assert torch.equal(sampler.priority_values(), before[1])
    with pytest.raises(ValueError, match="3 items are not whole slices"):
        rb.update_priority([0, 1, 2], 1.0)


def test_num_slices_rebuilds_masses_for_each_length() -> None:
    gen = torch.Generator().manual_seed(0)
    sampler = PrioritizedSliceSampler(30, 1.0, 0.0, num_slices=2, eps=0.0, generator=gen)
    rb = ReplayBuffer(TensorStorage(30), sampler=sampler)
    rb.extend(episodes([3, 5, 4]))
    for length in (2, 4, 5, 2):
        index = sampler.draw(2 * length)[0].view(2, length)
        valid = brute_spans([0] * 3 + [1] * 5 + [2] * 4, 30, length, True)
        assert set(index[:, 0].tolist()) <= set(valid)
        live = torch.nonzero(sampler.priority_values()).flatten().tolist()
        assert sorted(live) == sorted(valid)


def test_resume_and_pickle_continue_the_draws() -> None:
    gen = torch.Generator().manual_seed(3)
    sampler = PrioritizedSliceSampler(24, 0.6, 0.4, slice_len=3, generator=gen)
    rb = ReplayBuffer(TensorStorage(24), sampler=sampler)
    steps = episodes([5, 8, 4, 9, 6])
    rb.extend(steps[:20])
    rb.extend(steps[20:])
    index, _ = sampler.draw(12)
    rb.update_priority(index, torch.arange(12.0))
    state = sampler.state_dict()
    clone = pickle.loads(pickle.dumps(sampler))
    expected = [sampler.draw(12) for _ in range(3)]
    other = PrioritizedSliceSampler(24, 0.6, 0.4, slice_len=3, generator=torch.Generator())
    ReplayBuffer(rb.storage, sampler=other)
    other.load_state_dict(state)
    for again in (other, clone):
        for (a, ea), (b, eb) in zip(expected, [again.draw(12) for _ in range(3)], strict=True):
            assert torch.equal(a, b) and torch.equal(ea["weight"], eb["weight"])


def test_triton_kernels_match_the_numba_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fused kernels (Triton's interpreter on CPU) against the numba trees, same seed
    pytest.importorskip("triton")
    from rbdata.samplers import prioritized as prioritized_module

    results = []
    for device_path, kernels in ((False, None), (True, "triton")):
        monkeypatch.setattr(prioritized_module, "_DEVICE_PATH_ON_CPU", device_path)
        monkeypatch.setattr(prioritized_module, "_DEVICE_KERNELS", kernels)
        gen = torch.Generator().manual_seed(2)
        sampler = PrioritizedSliceSampler(40, 0.6, 0.4, slice_len=3, generator=gen)
        rb = ReplayBuffer(TensorStorage(40), sampler=sampler)
        fill(rb, [7, 2, 12, 1, 9, 5, 11, 8], [25, 28])
        index, _ = sampler.draw(24)
        rb.update_priority(index, torch.linspace(0.0, 3.0, 24, dtype=torch.float64))
        results.append((sampler.priority_values(), sampler.draw(300)))
    (values_a, (index_a, extras_a)), (values_b, (index_b, extras_b)) = results
    assert torch.equal(values_a, values_b)
    assert torch.equal(index_a, index_b) and torch.equal(extras_a["weight"], extras_b["weight"])


def test_checkpoint_round_trip(tmp_path: Any) -> None:
    gen = torch.Generator().manual_seed(4)
    sampler = PrioritizedSliceSampler(30, 0.6, 0.4, slice_len=2, generator=gen)
    rb = ReplayBuffer(TensorStorage(30), sampler=sampler)
    fill(rb, [5, 3, 8, 6, 9], [20, 11])
    index, _ = sampler.draw(8)
    rb.update_priority(index, torch.arange(8.0))
    rb.dumps(tmp_path / "ckpt")
    expected = [sampler.draw(8)[0] for _ in range(3)]
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    assert isinstance(loaded.sampler, PrioritizedSliceSampler)
    assert torch.equal(loaded.sampler.priorities(), sampler.priorities())
    got = [loaded.sampler.draw(8)[0] for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
