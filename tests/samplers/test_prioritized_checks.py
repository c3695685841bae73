"""PrioritizedSampler checks: a sampler smaller than its storage, loaded states, priorities
that overflow the tree, clear messages; a refused call leaves the trees as they were."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rbdata import PrioritizedSampler, ReplayBuffer, TensorStorage
from rbdata.samplers._trees import sumtree as _sumtree


def transitions(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"obs": torch.arange(start, start + n).float().unsqueeze(1)}, [n])


def tree_state(sampler: PrioritizedSampler) -> tuple[torch.Tensor, torch.Tensor, float]:
    state = sampler.state_dict()
    return state["sum_tree"], state["min_tree"], state["max_priority"]


def assert_same_trees(before: tuple[Any, ...], sampler: PrioritizedSampler) -> None:
    after = tree_state(sampler)
    assert torch.equal(before[0], after[0])
    assert torch.equal(before[1], after[1])
    assert before[2] == after[2]


# --- a prioritized sampler smaller than its storage ---------------------------------
def test_buffer_refuses_a_prioritized_sampler_smaller_than_its_storage() -> None:
    sampler = PrioritizedSampler(8, 0.6, 0.4)
    with pytest.raises(ValueError, match=r"capacity: PrioritizedSampler has 8 slots.*100000"):
        ReplayBuffer(TensorStorage(100_000), sampler=sampler)
    assert sampler.data_source is None  # nothing was bound


def test_attach_refuses_a_larger_storage_and_binds_nothing() -> None:
    sampler = PrioritizedSampler(64, 0.6, 0.4)
    with pytest.raises(ValueError, match=r"64 slots, fewer than the 100 items"):
        sampler.attach(TensorStorage(100))
    assert sampler.data_source is None
    sampler.attach(TensorStorage(64))  # the storage's own capacity is fine (so is less)
    PrioritizedSampler(64, 0.6, 0.4).attach(TensorStorage(10))


def test_data_source_larger_than_capacity_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"64 slots, fewer than the 100 items"):
        PrioritizedSampler(64, 0.6, 0.4, data_source=TensorStorage(100))


# The risky calls of the tests below, each in its own section of one child interpreter (one
# interpreter start instead of three); before the fixes each section could write far past a
def test_loaded_state_with_mass_past_the_capacity_is_refused() -> None:
    sampler = PrioritizedSampler(10, 1.0, 0.4)
    sampler.update_priority(torch.arange(10), 1.0)
    state = sampler.state_dict()
    tree = state["sum_tree"].clone()
    tree[_sumtree.leaf_offset(tree) + 40] = 5.0  # a padding leaf (slot 40 of 64)
    fresh = PrioritizedSampler(10, 1.0, 0.4)
    before = tree_state(fresh)
    with pytest.raises(ValueError, match="past the sampler's 10 slots"):
        fresh.load_state_dict({**state, "sum_tree": tree})
    assert_same_trees(before, fresh)


def test_loaded_state_inner_nodes_are_recomputed_from_the_leaves() -> None:
    sampler = PrioritizedSampler(100, 1.0, 0.4, generator=torch.Generator().manual_seed(0))
    sampler.update_priority(torch.arange(100), torch.rand(100, dtype=torch.float64))
    state = sampler.state_dict()
    tampered = state["sum_tree"].clone()
    tampered[_sumtree.ROOT + 1 : _sumtree.leaf_offset(tampered)] = 1e6  # inner nodes only
    fresh = PrioritizedSampler(100, 1.0, 0.4)
    fresh.load_state_dict({**state, "sum_tree": tampered})
    assert torch.equal(fresh.state_dict()["sum_tree"], state["sum_tree"])
    assert torch.equal(fresh.state_dict()["min_tree"], state["min_tree"])


def test_restored_sampler_with_mass_past_the_storage_length_is_refused_at_attach() -> None:
    sampler = PrioritizedSampler(16, 1.0, 0.4)
    sampler.update_priority(torch.arange(12), 1.0)  # a state for 12 items
    restored = PrioritizedSampler(16, 1.0, 0.4)
    restored.load_state_dict(sampler.state_dict())
    storage = TensorStorage(16)
    storage.set(slice(0, 4), transitions(4))  # the storage holds only 4
    with pytest.raises(ValueError, match="past the 4 items of the storage"):
        ReplayBuffer(storage, sampler=restored)
    assert restored.data_source is None


def test_priorities_set_before_binding_past_the_storage_length_are_refused() -> None:
    sampler = PrioritizedSampler(16, 1.0, 0.4)
    sampler.update_priority(torch.arange(16), 1.0)  # unbound: every slot may be set
    storage = TensorStorage(16)
    storage.set(slice(0, 4), transitions(4))
    with pytest.raises(ValueError, match="slots past the 4 items of the storage"):
        ReplayBuffer(storage, sampler=sampler)  # would draw slots 4-15, which hold nothing
    assert sampler.data_source is None


# --- priorities that overflow the tree ----------------------------------------------
@pytest.mark.parametrize(
    ("alpha", "priority", "dtype"),
    [(1.0, 3e38, torch.float32), (0.6, 1e300, torch.float32), (1.1, 1e300, torch.float64)],
)
@pytest.mark.parametrize("as_tensors", [False, True], ids=["lists", "tensors"])
def test_priority_whose_value_overflows_the_tree_is_refused(
    tree_path: str, alpha: float, priority: float, dtype: torch.dtype, as_tensors: bool
) -> None:
    sampler = PrioritizedSampler(16, alpha, 0.4, dtype=dtype, data_source=range(10))
    sampler.update_priority(torch.arange(10), 1.0)
    before = tree_state(sampler)
    if priority == 3e38:  # (3e38 + eps) ** 1 fits a float32; ten of them do not
        index: Any = list(range(10))
        pattern = "the tree's total overflow"
    else:
        index = [3]
        pattern = r"not finite in the tree's float"
    values = [priority] * len(index)
    with pytest.raises(ValueError, match=pattern):
        if as_tensors:
            sampler.update_priority(torch.tensor(index), torch.tensor(values, dtype=torch.float64))
        else:
            sampler.update_priority(index, values)
        sampler.check_errors()  # device trees report a refusal here; CPU ones raise above
    assert_same_trees(before, sampler)
    # what fits is still accepted: 1e300 ** 0.6 = 1e180 in a float64 tree
    wide = PrioritizedSampler(16, 0.6, 0.4, dtype=torch.float64, data_source=range(10))
    wide.update_priority(torch.arange(10), 1e300)
    assert float(wide.priority_values(0)) == pytest.approx((1e300 + 1e-8) ** 0.6)


def test_total_overflow_is_undone_exactly_with_duplicates(tree_path: str) -> None:
    sampler = PrioritizedSampler(16, 1.0, 0.4, data_source=range(16))
    sampler.update_priority(torch.arange(16), torch.arange(16, dtype=torch.float64) * 1e36)
    before = tree_state(sampler)
    with pytest.raises(ValueError, match="total overflow"):
        sampler.update_priority([2, 2, 5, 2], [1e38, 3e38, 3e38, 0.5])
        sampler.check_errors()  # device trees report a refusal here; CPU ones raise above
    assert_same_trees(before, sampler)


def test_default_priority_of_new_items_never_overflows() -> None:
    # CPU trees refuse the write itself; device trees write the items and refuse their
    # priorities on the device (test_prioritized_device.py: overflowing new items)
    storage = TensorStorage(32)
    sampler = PrioritizedSampler(32, 1.0, 0.4)
    rb = ReplayBuffer(storage, sampler)
    rb.extend(transitions(10))
    rb.update_priority(torch.arange(10), 3e37)  # total 3e38: fits; the max is now 3e37
    before, data = tree_state(sampler), storage[:].clone()
    with pytest.raises(ValueError, match=r"default priority .* overflow"):
        rb.extend(transitions(10, start=10))  # ten more at 3e37 would make it 6e38
    assert len(rb) == 10 and torch.equal(storage[:]["obs"], data["obs"])
    assert rb.writer.state_dict() == {"cursor": 10}
    assert_same_trees(before, sampler)
    index = rb.sample(4000)["index"]  # still a proper distribution over the ten items
    assert set(index.tolist()) == set(range(10))


def test_per_step_adds_give_the_trees_of_one_batched_write_and_refuse_as_it_does() -> None:
    """``add`` (one slot: its own kernel entry and bound) against ``extend`` of the same items.

    Priorities updated between the writes, so that "the highest seen" changes; the same
    trees and highest priority on both paths. Near the top of float32, an ``add`` whose
    default priority would overflow the total is refused, nothing written, as ``extend``.
    """
    stepped, batched = (PrioritizedSampler(16, 0.7, 0.4) for _ in range(2))
    rb_step = ReplayBuffer(TensorStorage(16), stepped)
    rb_batch = ReplayBuffer(TensorStorage(16), batched)
    for start, priorities in [(0, [2.0, 0.5]), (5, [7.0]), (11, [0.25, 3.0, 9.0])]:
        batch = transitions(5, start)
        for k in range(5):
            rb_step.add(batch[k])
        rb_batch.extend(batch)
        slots = torch.arange(len(priorities))
        for rb in (rb_step, rb_batch):
            rb.update_priority(slots, torch.tensor(priorities))
        assert_same_trees(tree_state(batched), stepped)
    near = ReplayBuffer(TensorStorage(32), PrioritizedSampler(32, 1.0, 0.4))
    near.extend(transitions(10))
    near.update_priority(torch.arange(10), 3.3e37)  # total 3.3e38: one more item overflows it
    before = tree_state(near.sampler)
    with pytest.raises(ValueError, match=r"default priority .* overflow"):
        near.add(transitions(1, start=10)[0])
    assert len(near) == 10 and near.writer.state_dict() == {"cursor": 10}
    assert_same_trees(before, near.sampler)


@pytest.mark.parametrize("option", ["default_priority", "max_priority"])
def test_priority_options_that_overflow_the_tree_are_refused(option: str) -> None:
    with pytest.raises(ValueError, match=f"{option}: 1e\\+39 .* not finite"):
        PrioritizedSampler(8, 1.0, 0.4, **{option: 1e39})  # type: ignore[arg-type]
    PrioritizedSampler(8, 1.0, 0.4, dtype=torch.float64, **{option: 1e39})  # type: ignore[arg-type]


# --- the message says the lengths differ ---------------------------------------------
def test_update_priority_with_empty_index_says_the_lengths_differ(tree_path: str) -> None:
    sampler = PrioritizedSampler(8, 1.0, 0.4, data_source=range(4))
    sampler.update_priority(torch.arange(4), 2.0)
    before = tree_state(sampler)
    with pytest.raises(ValueError, match=r"expected 0 values .* got 1: .*different lengths"):
        sampler.update_priority([], [1.0])
    sampler.update_priority([], [])  # an empty update is no error
    assert_same_trees(before, sampler)


@pytest.mark.usefixtures("tree_path")
def test_check_priority_raises_what_update_priority_would_and_changes_nothing() -> None:
    sampler = PrioritizedSampler(8, alpha=1.0, beta=0.5, dtype=torch.float32)
    rb = ReplayBuffer(TensorStorage(8), sampler)
    rb.extend(transitions(4))
    rb.update_priority([0, 1], [3e38, 1.0])
    bad = [
        ([0, 4], [1.0, 1.0], "index: 4 is outside the filled range"),
        ([0, 1], [1.0, float("nan")], "expected finite values"),
        ([0, 1], [1.0, -2.0], "expected values >= 0"),
        ([1, 2], [1.0, 1e39], "not finite in the tree's float32"),
        ([1, 2], [1.0, 1e38], "total overflow"),  # 3e38 + 1e38: past float32
    ]
    for index, priority, match in bad:
        before = tree_state(sampler)
        with pytest.raises(ValueError, match=match):
            sampler.check_priority(index, priority)
        assert_same_trees(before, sampler)
        with pytest.raises(ValueError, match=match):  # the update refuses it as well
            sampler.update_priority(index, priority)
            sampler.check_errors()  # the device path reports it here
        assert_same_trees(before, sampler)
    with pytest.raises(TypeError, match="index: expected integers"):
        sampler.check_priority(torch.tensor([0.0]), [1.0])
    before = tree_state(sampler)
    sampler.check_priority([0, 2, 0], [1.0, 2.0, 5.0])  # fine: 3e38 at slot 0 replaced
    assert_same_trees(before, sampler)
