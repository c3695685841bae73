"""``rbdata.MixedBuffer``: exact per-batch counts, rows from the right source, priority routing,
weights, empty sources, layouts and errors that change nothing.

Expectations are independent of the code under test: counts from a seat-by-seat Hamilton
reference in exact arithmetic (``_mixed_data.reference_counts``), rows identified by an
``"id"`` that says which source and row they came from, priorities read back from each
source's own sampler.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from _mixed_data import prioritized_buffer, reference_counts, rows, storage
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rbdata import (
    EmptyBufferError,
    MixedBuffer,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorStorage,
    UniformSampler,
)
from rbdata.errors import IndexOutOfRangeError
from rbdata.mixed import largest_remainder

WEIGHT = st.one_of(st.just(0.0), st.floats(0.0, 10.0), st.integers(0, 5))


# --- counts ---------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.lists(WEIGHT, min_size=1, max_size=5), st.integers(0, 600))
def test_largest_remainder_matches_the_reference(weights: list[float], total: int) -> None:
    if not any(weights):
        with pytest.raises(ValueError, match="positive"):
            largest_remainder(weights, total)
        return
    counts = largest_remainder(weights, total)
    assert counts == reference_counts(weights, total)
    assert sum(counts) == total
    wsum = math.fsum(weights)
    for w, c in zip(weights, counts, strict=True):
        assert abs(c - w / wsum * total) < 1 + 1e-9
        assert c == 0 or w > 0


def _three(sizes: tuple[int, int, int] = (50, 60, 70)) -> dict[str, TensorStorage]:
    return {f"s{i}": storage(n, 1000 * i) for i, n in enumerate(sizes)}


@settings(max_examples=60, deadline=None)
@given(st.lists(WEIGHT, min_size=3, max_size=3), st.integers(1, 300))
def test_each_batch_takes_exact_counts_from_the_right_sources(
    weights: list[float], batch_size: int
) -> None:
    if not any(weights):
        weights = [0.0, 0.0, 1.0]
    sources = _three()
    names = list(sources)
    mixed = MixedBuffer(
        sources, dict(zip(names, weights, strict=True)), generator=torch.Generator().manual_seed(0)
    )
    batch = mixed.sample(batch_size)
    expected = reference_counts(weights, batch_size)
    assert torch.bincount(batch["source"], minlength=3).tolist() == expected
    # source after source, each row the row of its source at its combined index
    assert batch["source"].tolist() == [i for i, c in enumerate(expected) for _ in range(c)]
    position, local = mixed.locate(batch["index"])
    assert torch.equal(position, batch["source"])
    assert torch.equal(batch["id"], (position * 1000 + local).double())
    assert bool((local < torch.tensor([50, 60, 70])[position]).all())
    assert mixed.counts(batch_size) == dict(zip(names, expected, strict=True))


def test_weights_are_assignable_between_calls_and_annealed_to_zero() -> None:
    offline, online = storage(100, 0), storage(100, 1000)
    mixed = MixedBuffer({"offline": offline, "online": online}, {"offline": 1, "online": 1})
    for step in range(11):
        w = 1 - step / 10
        mixed.weights = {"offline": w, "online": 1 - w}
        counts = torch.bincount(mixed.sample(256)["source"], minlength=2).tolist()
        assert counts == reference_counts([w, 1 - w], 256)
    assert counts == [0, 256] and dict(mixed.weights) == {"offline": 0.0, "online": 1.0}
    with pytest.raises(TypeError):  # the mapping is read-only: assign a new dict
        mixed.weights["offline"] = 1.0  # type: ignore[index]


def test_an_empty_source_gets_nothing_until_it_has_data() -> None:
    online = ReplayBuffer(TensorStorage(1000))
    mixed = MixedBuffer(
        {"offline": storage(100, 0), "online": online}, {"offline": 0.5, "online": 0.5}
    )
    assert mixed.sample(10)["source"].tolist() == [0] * 10  # its share goes to the others
    online.extend(rows(3, 5000))
    batch = mixed.sample(10)
    assert batch["source"].tolist() == [0] * 5 + [1] * 5
    assert bool((batch["id"][5:] >= 5000).all())
    mixed.weights = {"offline": 0.0, "online": 1.0}
    assert mixed.sample(4)["source"].tolist() == [1] * 4


def test_no_data_where_the_weight_is_raises_empty_buffer() -> None:
    online = ReplayBuffer(TensorStorage(10))
    mixed = MixedBuffer(
        {"offline": storage(10, 0), "online": online}, {"offline": 0.0, "online": 1.0}
    )
    with pytest.raises(EmptyBufferError, match=r"'online' \(weight 1, empty\)"):
        mixed.sample(4)


# --- priorities -------------------------------------------------------------------------------
def test_update_priority_routes_each_row_to_its_source() -> None:
    a = prioritized_buffer(64, 40, 0, seed=1)
    b = storage(30, 1000)
    c = prioritized_buffer(32, 20, 2000, seed=2)
    mixed = MixedBuffer({"a": a, "b": b, "c": c}, {"a": 1, "b": 1, "c": 1}, batch_size=60)
    batch = mixed.sample()
    assert set(batch.keys()) >= {"weight", "index", "source"}
    assert bool((batch["weight"][batch["source"] == 1] == 1).all())  # uniform rows: weight 1
    new = torch.rand(60) + 0.1
    mixed.update_priority(batch["index"], new)
    # independent expectation: the last priority given to each (source, row); alpha = 1
    expected: dict[tuple[int, int], float] = {}
    for src, idx, p in zip(
        batch["source"].tolist(), batch["index"].tolist(), new.tolist(), strict=True
    ):
        offset = (0, 64, 94)[src]
        expected[(src, idx - offset)] = p
    for pos, rb in ((0, a), (2, c)):
        values = rb.sampler.priority_values()
        for (src, row), p in expected.items():
            if src == pos:
                assert values[row].item() == pytest.approx(p, rel=1e-6)


def test_update_priority_checks_everything_before_any_change() -> None:
    a = prioritized_buffer(16, 10, 0, seed=1)
    c = prioritized_buffer(16, 4, 100, seed=2)
    mixed = MixedBuffer({"a": a, "c": c}, {"a": 1, "c": 1})
    before = (a.sampler.priority_values(), c.sampler.priority_values())
    bad = [
        (IndexError, "row 5 of source 'c', which holds 4", [0, 16 + 5], [1.0, 2.0]),
        (IndexError, r"\[0, 32\)", [0, 32], [1.0, 2.0]),
        (IndexError, r"\[0, 32\)", [0, -1], [1.0, 2.0]),
        (ValueError, "finite", [0, 17], [1.0, float("nan")]),
        (ValueError, ">= 0", [0, 17], [1.0, -1.0]),
        (ValueError, "expected 1 or 2", [0, 17], [1.0, 2.0, 3.0]),
        (TypeError, "integers", [0.5, 17], [1.0, 2.0]),
    ]
    for error, match, index, priority in bad:
        with pytest.raises(error, match=match):
            mixed.update_priority(index, priority)
        assert torch.equal(a.sampler.priority_values(), before[0])
        assert torch.equal(c.sampler.priority_values(), before[1])
    mixed.update_priority(torch.tensor([[3], [17]]), 4.0)  # any shape, a scalar for all
    assert a.sampler.priority_values()[3] == 4.0 and c.sampler.priority_values()[1] == 4.0


@pytest.mark.usefixtures("tree_path")
def test_an_overflow_in_a_later_source_changes_no_source() -> None:
    # float32 trees: two priorities of 3e38 in source "c" overflow its total (3.4e38)
    def make(start: float) -> ReplayBuffer:
        sampler = PrioritizedSampler(4, alpha=1.0, beta=0.5, dtype=torch.float32)
        rb = ReplayBuffer(TensorStorage(4), sampler)
        rb.extend(rows(4, start))
        return rb

    a, c = make(0), make(100)
    mixed = MixedBuffer({"a": a, "c": c}, {"a": 1, "c": 1})
    before = (a.sampler.priority_values(), c.sampler.priority_values())
    with pytest.raises(ValueError, match=r"total overflow.*nothing was changed"):
        mixed.update_priority([0, 4, 5], [7.0, 3e38, 3e38])
    a.sampler.check_errors()  # the device path: nothing deferred either
    c.sampler.check_errors()
    assert torch.equal(a.sampler.priority_values(), before[0])
    assert torch.equal(c.sampler.priority_values(), before[1])
    mixed.update_priority([0, 4, 5], [7.0, 1e38, 1e38])  # fits: both sources written
    assert a.sampler.priority_values()[0] == 7.0
    assert c.sampler.priority_values()[:2].tolist() == pytest.approx([1e38, 1e38], rel=1e-6)


@pytest.mark.parametrize(
    "index",
    [torch.tensor([0.0]), [0.5], np.array([0.5]), 0.5],
    ids=["tensor", "list", "array", "float"],
)
def test_every_update_priority_path_names_the_index_argument(index: object) -> None:
    rb = prioritized_buffer(8, 4, 0, seed=1)
    mixed = MixedBuffer({"a": rb, "b": storage(4, 100)}, {"a": 1, "b": 1})
    slices = PrioritizedSliceSampler(8, slice_len=2, alpha=1.0, beta=0.5)
    paths = [rb.update_priority, rb.sampler.update_priority, mixed.update_priority]
    paths += [slices.update_priority, rb.sampler.check_priority]
    before = rb.sampler.priority_values()
    for update in paths:
        with pytest.raises(TypeError, match=r"^index: expected integers"):
            update(index, 1.0)
    assert torch.equal(rb.sampler.priority_values(), before)


def test_update_priority_without_any_prioritized_source() -> None:
    mixed = MixedBuffer({"a": storage(4, 0), "b": storage(4, 10)}, {"a": 1, "b": 1})
    with pytest.raises(TypeError, match="no source samples with priorities"):
        mixed.update_priority([0], [1.0])


# --- layouts ----------------------------------------------------------------------------------
def test_sources_with_different_layouts_name_the_keys() -> None:
    a = storage(4, 0)
    wide = TensorStorage(4)  # "obs" of another shape
    wide.set(slice(0, 4), {"id": torch.zeros(4, dtype=torch.float64), "obs": torch.zeros(4, 5)})
    single = TensorStorage(4)  # "id" of another dtype
    single.set(slice(0, 4), {"id": torch.zeros(4), "obs": torch.zeros(4, 3)})
    with_info = TensorStorage(4)
    with_info.set(slice(0, 4), {**rows(4, 0).to_dict(), "info": {"x": torch.zeros(4)}})
    with pytest.raises(
        ValueError, match=r"sources 'a' and 'b' differ: shape of 'obs': \[3\] vs \[5\]"
    ):
        MixedBuffer({"a": a, "b": wide}, {"a": 1, "b": 1})
    with pytest.raises(ValueError, match=r"dtype of 'id': torch\.float64 vs torch\.float32"):
        MixedBuffer({"a": a, "b": single}, {"a": 1, "b": 1})
    with pytest.raises(ValueError, match=r"keys only in 'b': \('info', 'x'\).*drop_info=True"):
        MixedBuffer({"a": a, "b": with_info}, {"a": 1, "b": 1})
    mixed = MixedBuffer({"a": a, "b": with_info}, {"a": 1, "b": 1}, drop_info=True)
    assert "info" not in mixed.sample(4).keys()
    mixed = MixedBuffer({"a": a, "b": wide}, {"a": 1, "b": 1}, keys=["id"])
    assert list(mixed.sample(4).keys()) == ["id", "index", "source"]
    with pytest.raises(ValueError, match="has no key 'nope'"):
        MixedBuffer({"a": a, "b": wide}, {"a": 1, "b": 1}, keys=["id", "nope"])


def test_a_source_filled_later_is_checked_when_it_gets_data() -> None:
    online = ReplayBuffer(TensorStorage(10))
    mixed = MixedBuffer({"a": storage(4, 0), "b": online}, {"a": 1, "b": 1}, keys=["id"])
    assert list(mixed.sample(2).keys()) == ["id", "index", "source"]
    online.extend({"obs": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="sources\\['b'\\] has no key 'id'"):
        mixed.sample(2)


# --- arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("weights", "error", "match"),
    [
        ({"a": 1}, ValueError, "missing 'b'"),
        ({"a": 1, "b": 1, "c": 1}, ValueError, "unknown 'c'"),
        ({"a": -1, "b": 1}, ValueError, "finite and >= 0"),
        ({"a": float("inf"), "b": 1}, ValueError, "finite and >= 0"),
        ({"a": True, "b": 1}, TypeError, "real number"),
        ({"a": "1", "b": 1}, TypeError, "real number"),
        ({"a": 0, "b": 0.0}, ValueError, "at least one"),
        ([1, 1], TypeError, "dict"),
    ],
)
def test_bad_weights_change_nothing(weights: object, error: type, match: str) -> None:
    sampler = PrioritizedSampler(4, alpha=1, beta=1)
    with pytest.raises(error, match=match):
        MixedBuffer({"a": storage(4, 0), "b": storage(4, 9)}, weights, samplers={"a": sampler})
    assert sampler.data_source is None  # nothing was bound
    mixed = MixedBuffer({"a": storage(4, 0), "b": storage(4, 9)}, {"a": 1, "b": 3})
    with pytest.raises(error, match=match):
        mixed.weights = weights  # type: ignore[assignment]
    assert dict(mixed.weights) == {"a": 1.0, "b": 3.0}


def test_bad_sources_and_samplers() -> None:
    a = storage(4, 0)
    rb = ReplayBuffer(TensorStorage(4))
    with pytest.raises(TypeError, match="must be a ReplayBuffer, an offline dataset"):
        MixedBuffer({"a": [1, 2]}, {"a": 1})
    with pytest.raises(ValueError, match="non-empty dict"):
        MixedBuffer({}, {})
    with pytest.raises(ValueError, match="no source called 'z'"):
        MixedBuffer({"a": a}, {"a": 1}, samplers={"z": UniformSampler()})
    with pytest.raises(ValueError, match="same storage"):
        MixedBuffer({"a": a, "b": a}, {"a": 1, "b": 1})
    with pytest.raises(ValueError, match="own sampler"):
        MixedBuffer({"a": rb}, {"a": 1}, samplers={"a": UniformSampler()})
    with pytest.raises(ValueError, match="samples in epochs"):
        MixedBuffer({"a": a}, {"a": 1}, samplers={"a": SamplerWithoutReplacement()})
    with pytest.raises(ValueError, match="another data_source"):
        MixedBuffer({"a": a}, {"a": 1}, samplers={"a": UniformSampler(storage(4, 0))})
    with pytest.raises(ValueError, match="transform"):
        MixedBuffer({"a": ReplayBuffer(TensorStorage(4), transform=lambda x: x)}, {"a": 1})
    with pytest.raises(TypeError, match="drop_info"):
        MixedBuffer({"a": a}, {"a": 1}, drop_info=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        MixedBuffer({"a": a}, {"a": 1}).sample()


def test_a_failed_draw_leaves_every_generator_as_it_was() -> None:
    first = storage(40, 0)
    done = torch.zeros(40, 1, dtype=torch.bool)
    done[9::10] = True
    second = TensorStorage(40)
    second.set(slice(0, 40), {**rows(40, 1000).to_dict(), "next": {"done": done}})
    slices = SliceSampler(slice_len=4, generator=torch.Generator().manual_seed(3))
    mixed = MixedBuffer(
        {"a": first, "b": second}, {"a": 1, "b": 1}, samplers={"b": slices}, keys=["id", "obs"]
    )
    states = [s.generator.get_state() for s in mixed.samplers.values()]
    with pytest.raises(ValueError):
        mixed.sample(10)  # 5 rows for the slice source: no multiple of 4
    assert all(
        torch.equal(s.generator.get_state(), old)
        for s, old in zip(mixed.samplers.values(), states, strict=True)
    )
    batch = mixed.sample(16)
    steps = batch["id"][8:].reshape(2, 4)
    assert bool((steps.diff() == 1).all()) and batch["slice"][:8].tolist() == [-1] * 8


# --- state ------------------------------------------------------------------------------------
def _pair(seed: int) -> MixedBuffer:
    return MixedBuffer(
        {"a": prioritized_buffer(64, 50, 0, seed), "b": storage(30, 1000)},
        {"a": 0.3, "b": 0.7},
        generator=torch.Generator().manual_seed(seed),
    )


def test_state_dict_round_trip_resumes_the_sequence(tmp_path: Path) -> None:
    mixed = _pair(1)
    mixed.sample(32)
    mixed.update_priority(torch.arange(50), torch.arange(50) % 5 + 1.0)
    mixed.weights = {"a": 0.6, "b": 0.4}
    path = tmp_path / "state.pt"
    torch.save(mixed.state_dict(), path)
    expected = [mixed.sample(32)["index"].tolist() for _ in range(5)]
    other = _pair(99)  # other seeds, other priorities, other weights
    other.load_state_dict(torch.load(path, weights_only=True))
    assert dict(other.weights) == {"a": 0.6, "b": 0.4}
    assert [other.sample(32)["index"].tolist() for _ in range(5)] == expected


def test_a_bad_state_changes_nothing() -> None:
    mixed = _pair(1)
    good = mixed.state_dict()
    broken = {"weights": good["weights"], "samplers": dict(good["samplers"])}
    broken["samplers"]["b"] = {"generator": "nope"}
    before = [s.generator.get_state() for s in mixed.samplers.values()]
    with pytest.raises(ValueError, match=r"state\['samplers'\]\['b'\]"):
        mixed.load_state_dict(broken)
    assert all(
        torch.equal(s.generator.get_state(), old)
        for s, old in zip(mixed.samplers.values(), before, strict=True)
    )
    with pytest.raises(ValueError, match="weights"):
        mixed.load_state_dict({"weights": {"a": 1}, "samplers": good["samplers"]})
    with pytest.raises(ValueError, match="expected a dict"):
        mixed.load_state_dict([])  # type: ignore[arg-type]


def _kinds(first: str, second: str) -> MixedBuffer:
    """Sources "a" and "b" of 16 rows sampled by a ``first`` and a ``second`` sampler."""

    def sampler(kind: str, capacity: int) -> object:
        gen = torch.Generator().manual_seed(3)
        if kind == "prioritized":
            return PrioritizedSampler(capacity, alpha=1.0, beta=0.5, generator=gen)
        return UniformSampler(generator=gen)

    sources = {"a": storage(16, 0), "b": storage(16, 100)}
    samplers = {"a": sampler(first, 16), "b": sampler(second, 16)}
    return MixedBuffer(sources, {"a": 1, "b": 1}, samplers=samplers)


@pytest.mark.parametrize(
    ("saved", "loaded", "name"),
    [
        (("uniform", "uniform"), ("uniform", "prioritized"), "b"),
        (("uniform", "prioritized"), ("uniform", "uniform"), "b"),
        (("uniform", "uniform"), ("prioritized", "uniform"), "a"),
        (("prioritized", "uniform"), ("uniform", "uniform"), "a"),
    ],
)
def test_a_state_of_another_sampler_kind_is_refused_and_changes_nothing(
    saved: tuple[str, str], loaded: tuple[str, str], name: str
) -> None:
    state = _kinds(*saved).state_dict()
    mixed = _kinds(*loaded)
    if "prioritized" in loaded:
        mixed.update_priority([0, 16], [5.0, 6.0])
    mixed.weights = {"a": 0.25, "b": 0.75}
    before = mixed.state_dict()
    expected = type(mixed.samplers[name]).__name__
    with pytest.raises(ValueError, match=rf"\['{name}'\]: expected the state of a {expected}"):
        mixed.load_state_dict(state)
    after = mixed.state_dict()
    assert after["weights"] == before["weights"]
    for source, own in before["samplers"].items():
        assert set(after["samplers"][source]) == set(own)
        for key, value in own.items():
            now = after["samplers"][source][key]
            assert torch.equal(value, now) if isinstance(value, torch.Tensor) else value == now


def test_a_state_of_other_sources_says_how_to_load_it() -> None:
    state = _kinds("uniform", "uniform").state_dict()
    other = MixedBuffer({"a": storage(4, 0), "c": storage(4, 10)}, {"a": 1, "c": 1})
    with pytest.raises(
        ValueError,
        match=r"saved from a mixture of the sources \['a', 'b'\], this one has \['a', 'c'\]: "
        r"load it into a mixture built with the same sources",
    ):
        other.load_state_dict(state)


# --- random operation sequences against a plain model -------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_random_sequences_match_a_plain_model(seed: int) -> None:
    """Random extends, weight changes, samples, priority updates and state round trips.

    The model is plain Python: each source's filled length, the weights and the expected
    counts from the Hamilton reference (empty sources count as weight 0).
    """
    rng = torch.Generator().manual_seed(seed)
    online = prioritized_buffer(64, 0, 5000, seed)
    mixed = MixedBuffer(
        {"offline": storage(40, 0), "online": online, "other": storage(25, 9000, 30)},
        {"offline": 1.0, "online": 1.0, "other": 0.5},
        generator=torch.Generator().manual_seed(seed),
    )
    model = {"lens": [40, 0, 25], "weights": [1.0, 1.0, 0.5], "written": 0}
    offsets = [0, 40, 104]
    for _ in range(60):
        op = int(torch.randint(5, (), generator=rng))
        if op == 0:  # the agent writes a few steps (the ring wraps at 64)
            k = int(torch.randint(1, 9, (), generator=rng))
            online.extend(rows(k, 5000 + model["written"]))
            model["written"] += k
            model["lens"][1] = min(64, model["written"])
        elif op == 1:  # new weights (sometimes a zero)
            w = (torch.randint(0, 4, (3,), generator=rng).double() / 2).tolist()
            if not any(w):
                with pytest.raises(ValueError):
                    mixed.weights = dict(zip(("offline", "online", "other"), w, strict=True))
                continue
            mixed.weights = dict(zip(("offline", "online", "other"), w, strict=True))
            model["weights"] = w
        elif op == 2:  # a state round trip: the copy continues exactly like the original
            state = mixed.state_dict()
            expected = mixed.sample(17)["index"]
            mixed.load_state_dict(state)
            assert torch.equal(mixed.sample(17)["index"], expected)
        else:  # a sample, checked against the model; then priorities for its rows
            n = int(torch.randint(1, 50, (), generator=rng))
            effective = [
                w if size else 0.0 for w, size in zip(model["weights"], model["lens"], strict=True)
            ]
            if not any(effective):
                with pytest.raises(EmptyBufferError):
                    mixed.sample(n)
                continue
            batch = mixed.sample(n)
            counts = torch.bincount(batch["source"], minlength=3).tolist()
            assert counts == reference_counts(effective, n)
            position, local = mixed.locate(batch["index"])
            lens = torch.tensor(model["lens"])
            assert bool((local < lens[position]).all())
            assert torch.equal(batch["index"], local + torch.tensor(offsets)[position])
            fixed = position != 1  # the storages' rows say where they came from
            base = torch.tensor([0.0, 0.0, 9000.0])[position]
            assert torch.equal(batch["id"][fixed], (base + local)[fixed].double())
            mixed.update_priority(batch["index"], torch.rand(n, generator=rng) + 0.01)


def test_an_out_of_range_index_raises_index_error_as_a_replay_buffer_does() -> None:
    mixed = MixedBuffer({"a": storage(10, 0), "b": storage(5, 100, capacity=8)}, {"a": 1, "b": 1})
    rb = ReplayBuffer(TensorStorage(20))
    rb.extend(rows(10))
    assert torch.equal(mixed[3]["id"], torch.tensor(3.0, dtype=torch.float64))
    assert mixed[torch.tensor([0, 11])]["id"].tolist() == [0.0, 101.0]
    for buffer in (mixed, rb):
        for index in (len(buffer), torch.tensor([10**6]), -len(buffer) - 1, 10**6):
            with pytest.raises(IndexError, match=r"out of range|holds 5 items"):
                buffer[index]
    with pytest.raises(IndexError, match="holds 5 items"):  # a row not yet filled
        mixed[16]


def test_priorities_computed_with_grad_route_without_a_warning() -> None:
    mixed = MixedBuffer(
        {"a": prioritized_buffer(10, 5, 0, 1), "b": prioritized_buffer(10, 5, 100, 0)},
        {"a": 1, "b": 1},
    )
    td = (torch.rand(3, requires_grad=True) - 0.5).abs() + 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mixed.update_priority(torch.tensor([0, 12, 13]), td)
        mixed.update_priority(torch.tensor([1, 11]), td[0])
        mixed.update_priority(torch.tensor([2, 14]), list(td[:2]))  # raised before
    assert mixed.samplers["b"].priority_values(torch.tensor([4])).item() > 0


def test_an_index_out_of_range_is_one_error_from_buffer_mixture_and_sampler() -> None:
    """rb[i], rb.update_priority, mixed[i] and mixed.update_priority raise one class.

    It is an IndexError (as indexing raises) and a ValueError (as update_priority raised).
    """
    a = prioritized_buffer(16, 10, 0, seed=1)
    slices = ReplayBuffer(TensorStorage(16), PrioritizedSliceSampler(16, 1.0, 0.5, slice_len=2))
    done = torch.zeros(10, dtype=torch.bool)
    slices.extend(TensorDict({"obs": torch.arange(10.0), ("next", "done"): done}, [10]))
    mixed = MixedBuffer({"a": a, "c": prioritized_buffer(16, 4, 100, seed=2)}, {"a": 1, "c": 1})
    calls = [
        lambda: a[10],
        lambda: a.update_priority([3, 10], [1.0, 1.0]),
        lambda: slices.update_priority(torch.arange(12), 1.0),
        lambda: mixed[32],
        lambda: mixed[[0, 16 + 4]],
        lambda: mixed.update_priority([0, 16 + 4], [1.0, 2.0]),
        lambda: mixed.update_priority([0, 32], [1.0, 2.0]),
    ]
    before = a.sampler.priority_values()
    for call in calls:
        with pytest.raises(IndexOutOfRangeError) as caught:
            call()
        assert isinstance(caught.value, IndexError) and isinstance(caught.value, ValueError)
        assert torch.equal(a.sampler.priority_values(), before)
