"""Hardening of samplers, writers and the buffer (issue 11: items 1, 10, 11, 16, 18).

Crash tests run the risky call in a child process and assert on its exit code: on the code
before these fixes they die with SIGSEGV (or corrupt memory silently).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _child import run_child
from tensordict import TensorDict

from rbdata import (
    MaxValueWriter,
    PrioritizedSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorStorage,
    UniformSampler,
)
from rbdata.samplers import _slices, _sumtree
from rbdata.samplers import prioritized as prioritized_module

ROOT = Path(__file__).resolve().parents[1]


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


@pytest.fixture(params=["numba", "torch"])
def tree_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run on the numba kernels and on the device path's torch kernels (set before construction).

    The device path (forced onto CPU trees) reports a refused call's error at a later call
    or at ``check_errors``, which does nothing on CPU trees (their calls raise).
    """
    if request.param == "torch":
        # the device path on CPU trees, with the torch reference kernels
        monkeypatch.setattr(prioritized_module, "_DEVICE_PATH_ON_CPU", True)
        monkeypatch.setattr(prioritized_module, "_DEVICE_KERNELS", "torch")
    return str(request.param)


# --- item 1: a prioritized sampler smaller than its storage ---------------------------------
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
# tree or a table, i.e. die with SIGSEGV or corrupt memory.
CRASH_SECTIONS = {
    # a plain Sized source has no capacity: it is checked by len at construction, then grows
    "growing_source": """
        from rbdata import PrioritizedSampler
        source = list(range(8))
        sampler = PrioritizedSampler(8, 0.6, 0.4, data_source=source)
        source.extend(range(200_000))
        for index in (torch.arange(200_000), list(range(200_000))):
            try:
                sampler.update_priority(index, 1.0)
            except ValueError as err:
                print("refused:", err)
        print("total", float(sampler.priority_values().sum()))
    """,
    "sumtree_update": """
        from rbdata.samplers import _sumtree
        tree = _sumtree.new_tree(10, "sum")
        for index, values in (
            (torch.tensor([10**9]), torch.tensor([1.0])),
            (torch.tensor([-(10**9)]), torch.tensor([1.0])),
            (torch.tensor([0, 1, 2]), torch.tensor([1.0])),
            (torch.tensor([[0]]), torch.tensor([1.0])),
        ):
            try:
                _sumtree.update(tree, index, values, "sum")
                print("accepted")
            except (IndexError, ValueError) as err:
                print(type(err).__name__, err)
        print("root", float(tree[_sumtree.ROOT]))
    """,
    "slice_draw": """
        from rbdata.samplers import _slices
        cumsum, shift, stops = _slices.segments(torch.tensor([4]).numpy(), 10, 100, 3, True)
        for r in (torch.tensor([0, 10**9]), torch.tensor([-(10**9)]), torch.tensor([6])):
            try:
                _slices.draw(cumsum, shift, stops, r, 3, 0, 100, True)
                print("accepted")
            except ValueError as err:
                print(err)
        print(_slices.draw(cumsum, shift, stops, torch.tensor([5]), 3, 0, 100, True)[0].tolist())
    """,
}


@pytest.fixture(scope="module")
def crash_sections() -> tuple[int, str, dict[str, list[str]]]:
    """Run every section in one child; return its exit code, stderr and each section's lines.

    A section that crashes the child leaves that section and the later ones without output.
    """
    code = "import torch\n" + "".join(
        f"print('### {name}', flush=True)\n" + textwrap.dedent(body)
        for name, body in CRASH_SECTIONS.items()
    )
    result = run_child(code)
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in result.stdout.splitlines():
        if line.startswith("### "):
            current = out.setdefault(line[4:], [])
        else:
            current.append(line)
    return result.returncode, result.stderr, out


def test_update_priority_past_capacity_with_a_growing_source_does_not_crash(
    crash_sections: tuple[int, str, dict[str, list[str]]],
) -> None:
    returncode, stderr, out = crash_sections
    assert returncode == 0, stderr[-2000:]
    assert out["growing_source"] == [
        "refused: index: 8 is outside the filled range [0, 8)",
        "refused: index: 8 is outside the filled range [0, 8)",
        "total 0.0",  # nothing was written
    ]


def test_sumtree_update_checks_slots_and_lengths_before_the_kernel(
    crash_sections: tuple[int, str, dict[str, list[str]]],
) -> None:
    returncode, stderr, out = crash_sections
    assert returncode == 0, stderr[-2000:]
    assert out["sumtree_update"] == [
        "IndexError index 1000000000 is out of range for a tree of 64 slots",
        "IndexError index -1000000000 is out of range for a tree of 64 slots",
        "ValueError values: expected 3 values (one per index), got 1",
        "ValueError index: expected a 1-D integer tensor, got torch.int64 (1, 1)",
        "root 0.0",
    ]


def test_slice_draw_refuses_draws_outside_the_tables(
    crash_sections: tuple[int, str, dict[str, list[str]]],
) -> None:
    returncode, stderr, out = crash_sections
    assert returncode == 0, stderr[-2000:]
    assert out["slice_draw"] == [
        "r: draw 1000000000 is outside [0, 6), the number of slice starts",
        "r: draw -1000000000 is outside [0, 6), the number of slice starts",
        "r: draw 6 is outside [0, 6), the number of slice starts",
        "[7, 8, 9]",
    ]


def test_slice_draw_refuses_tables_of_different_lengths() -> None:
    cumsum, shift, stops = _slices.segments(np.array([4, 7]), 10, 100, 2, True)
    with pytest.raises(ValueError, match="one length"):
        _slices.draw(cumsum, shift[:1], stops, torch.tensor([0]), 2, 0, 100, True)


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


def test_numba_boundscheck_needs_its_own_cache_dir(tmp_path: Path) -> None:
    """The command line of the bounds-checked kernel run really checks bounds.

    numba's on-disk cache (``cache=True``) does not key on ``NUMBA_BOUNDSCHECK``: a kernel
    compiled without checks would be reused, so the run points ``NUMBA_CACHE_DIR`` at a
    directory of its own. A kernel called directly with a slot far past the tree must then
    raise ``IndexError`` instead of writing to a wild address.
    """
    code = """
        import numpy as np, torch
        from rbdata.samplers import _sumtree
        tree = _sumtree.new_tree(10, "sum", torch.float64)
        offsets = np.asarray(_sumtree.layout(tree), dtype=np.int64)
        try:
            _sumtree._nb_update(
                tree.numpy(), offsets, np.array([10**9], np.int64), np.array([1.0]), True
            )
            print("unchecked")
        except IndexError as err:
            print("IndexError:", err)
    """
    env = {"NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    result = run_child(code, env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "IndexError: index is out of bounds"


# --- item 10: a sampler that refuses a write refuses it before the write ---------------------
def _episodes(returns: list[float], start: int = 0) -> TensorDict:
    n = len(returns)
    return TensorDict(
        {
            "obs": torch.arange(start, start + n).float().unsqueeze(1),
            "ret": torch.tensor(returns, dtype=torch.float64),
            "next": {"done": torch.ones(n, 1, dtype=torch.bool)},
        },
        [n],
    )


@pytest.mark.parametrize("method", ["extend", "add"])
def test_slice_sampler_refusal_leaves_storage_writer_and_sampler_unchanged(method: str) -> None:
    rb = ReplayBuffer(TensorStorage(8), SliceSampler(slice_len=1), MaxValueWriter("ret"))
    rb.extend(_episodes([1, 2, 3, 4, 5, 6, 7, 0]))  # the lowest rank is in slot 7
    data = rb.storage[:].clone()
    writer_state = rb.writer.state_dict()
    sampler_state = rb.sampler.state_dict()
    new = _episodes([10.0], start=100)  # replaces slot 7; the time order expects slot 0
    with pytest.raises(ValueError, match="a write at slot 7 does not continue the time order"):
        if method == "extend":
            rb.extend(new)
        else:
            rb.add(new[0])
    assert len(rb) == 8
    stored = rb.storage[:]
    assert torch.equal(stored["obs"], data["obs"])  # slot 7 still holds obs 7
    assert torch.equal(stored["ret"], data["ret"])
    after = rb.writer.state_dict()
    assert torch.equal(after["ranks"], writer_state["ranks"])
    assert torch.equal(after["stamps"], writer_state["stamps"])
    assert (after["count"], after["next_stamp"]) == (
        writer_state["count"],
        writer_state["next_stamp"],
    )
    got = rb.sampler.state_dict()
    assert (got["time"], got["base"]) == (sampler_state["time"], sampler_state["base"])
    assert torch.equal(got["ends"], sampler_state["ends"])


def test_slice_sampler_missing_episode_key_writes_nothing() -> None:
    rb = ReplayBuffer(TensorStorage(8), SliceSampler(slice_len=2))
    with pytest.raises(ValueError, match=r"no key \('next', 'done'\)"):
        rb.extend(transitions(4))
    assert len(rb) == 0
    assert rb.writer.state_dict() == {"cursor": None}
    assert rb.sampler.state_dict()["time"] == 0


def test_first_write_refused_leaves_max_value_writer_unread() -> None:
    storage = TensorStorage(8)
    rb = ReplayBuffer(storage, SliceSampler(slice_len=1), MaxValueWriter("ret"))
    bad = TensorDict({"ret": torch.tensor([1.0, 2.0])}, [2])  # no ("next", "done")
    with pytest.raises(ValueError, match="no key"):
        rb.extend(bad)
    assert len(storage) == 0
    assert rb.writer.state_dict()["ranks"] is None  # still "not read yet"


# --- item 11: priorities that overflow the tree ----------------------------------------------
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


@pytest.mark.parametrize("option", ["default_priority", "max_priority"])
def test_priority_options_that_overflow_the_tree_are_refused(option: str) -> None:
    with pytest.raises(ValueError, match=f"{option}: 1e\\+39 .* not finite"):
        PrioritizedSampler(8, 1.0, 0.4, **{option: 1e39})  # type: ignore[arg-type]
    PrioritizedSampler(8, 1.0, 0.4, dtype=torch.float64, **{option: 1e39})  # type: ignore[arg-type]


# --- item 16: the message says the lengths differ ---------------------------------------------
def test_update_priority_with_empty_index_says_the_lengths_differ(tree_path: str) -> None:
    sampler = PrioritizedSampler(8, 1.0, 0.4, data_source=range(4))
    sampler.update_priority(torch.arange(4), 2.0)
    before = tree_state(sampler)
    with pytest.raises(ValueError, match=r"expected 0 values .* got 1: .*different lengths"):
        sampler.update_priority([], [1.0])
    sampler.update_priority([], [])  # an empty update is no error
    assert_same_trees(before, sampler)


# --- item 18: integer-like batch sizes, bool options, checked writer ----------------------
def test_integer_like_batch_sizes_are_accepted() -> None:
    rb = ReplayBuffer(TensorStorage(16), batch_size=np.int64(3))  # type: ignore[arg-type]
    rb.extend(transitions(10))
    assert rb.sample(np.int64(4))["obs"].shape == (4, 1)  # type: ignore[arg-type]
    assert rb.sample()["obs"].shape == (3, 1)
    uniform = UniformSampler(range(10))
    assert uniform.sample(np.int32(5)).shape == (5,)  # type: ignore[arg-type]
    prioritized = PrioritizedSampler(16, 1.0, 0.4, data_source=range(10))
    prioritized.update_priority(torch.arange(10), 1.0)
    assert prioritized.sample(np.int64(4)).shape == (4,)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        rb.sample(np.float64(4.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        uniform.sample(True)


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: UniformSampler(replacement="no"), "replacement"),
        (lambda: UniformSampler(replacement=0), "replacement"),
        (lambda: SamplerWithoutReplacement(drop_last="yes"), "drop_last"),
        (lambda: SliceSampler(slice_len=2, strict_length="no"), "strict_length"),
        (lambda: PrioritizedSampler(8, 1.0, 0.4, stratified="no"), "stratified"),
    ],
)
def test_bool_options_must_be_bools(build: Any, name: str) -> None:
    with pytest.raises(TypeError, match=f"{name} must be a bool, got"):
        build()


def test_replay_buffer_checks_writer_and_transform() -> None:
    sampler = UniformSampler()
    with pytest.raises(TypeError, match=r"writer must be an rbdata Writer .* got object"):
        ReplayBuffer(TensorStorage(4), sampler, writer=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="transform must be callable, got int"):
        ReplayBuffer(TensorStorage(4), sampler, transform=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        ReplayBuffer(TensorStorage(4), sampler, batch_size=0)
    assert sampler.data_source is None  # refused before the sampler was bound
    assert UniformSampler(replacement=np.bool_(False)).replacement is False
