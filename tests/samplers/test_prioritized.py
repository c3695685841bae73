"""PrioritizedSampler: frequencies, weights, priorities, bad input, buffer and DataLoader use."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from storage_contract import transitions
from torch.utils.data import DataLoader

from rbdata import BatchSampler, PrioritizedSampler, ReplayBuffer, TensorStorage
from rbdata.samplers import prioritized as prioritized_module


@pytest.fixture(autouse=True)
def _every_tree_path(tree_path: str) -> str:
    """Every test runs on both tree paths (``tree_path`` in conftest.py)."""
    return tree_path


def make(n: int = 10, capacity: int = 16, seed: int = 0, **kwargs: object) -> ReplayBuffer:
    sampler = PrioritizedSampler(
        capacity,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,  # type: ignore[arg-type]
    )
    rb = ReplayBuffer(TensorStorage(capacity), sampler=sampler)
    rb.extend(transitions(n))
    return rb


CHI2_999 = {9: 27.88, 4: 18.47}  # 99.9% quantiles of chi-square


@pytest.mark.parametrize("stratified", [False, True])
def test_frequencies_follow_priorities_to_the_alpha(stratified: bool) -> None:
    alpha, draws = 0.7, 100_000
    rb = make(alpha=alpha, beta=0.4, eps=0.0, stratified=stratified)
    priorities = torch.arange(1.0, 11.0)
    rb.update_priority(torch.arange(10), priorities)
    idx = torch.cat([rb.sample(1000)["index"] for _ in range(draws // 1000)])
    counts = torch.bincount(idx, minlength=10).double()
    p = priorities.double() ** alpha
    expected = draws * p / p.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_999[9]


def test_weights_match_the_formula() -> None:
    alpha, beta, eps = 0.6, 0.4, 1e-3
    rb = make(n=5, alpha=alpha, beta=beta, eps=eps)
    prio = torch.tensor([0.5, 2.0, 1.0, 3.0, 0.1], dtype=torch.float64)
    rb.update_priority([0, 1, 2, 3, 4], prio)
    batch = rb.sample(64)
    p_all = (prio + eps) ** alpha
    probs = p_all / p_all.sum()
    n = 5
    w_all = (n * probs) ** (-beta)
    expected = (w_all / w_all.max())[batch["index"]]
    torch.testing.assert_close(batch["weight"], expected.float())
    assert float(batch["weight"].max()) <= 1.0


def test_zero_priority_is_never_sampled_with_eps_zero() -> None:
    rb = make(n=4, alpha=1.0, beta=1.0, eps=0.0)
    rb.update_priority([0, 1, 2, 3], [0.0, 2.0, 0.0, 4.0])
    batch = rb.sample(20_000)
    assert set(batch["index"].tolist()) == {1, 3}
    # normalised by the smallest *positive* value (2.0): weight = (v / 2)^-1
    expected = torch.where(batch["index"] == 1, 1.0, 0.5)
    torch.testing.assert_close(batch["weight"], expected)
    rb.update_priority([1, 3], 0.0)
    with pytest.raises(ValueError, match="every priority in the buffer is zero"):
        rb.sample(4)
        rb.sampler.check_errors()  # type: ignore[attr-defined]  # where device trees report


def test_new_items_get_the_highest_priority_seen() -> None:
    rb = make(n=3, alpha=1.0, beta=0.0, eps=0.0)
    sampler = rb.sampler
    assert isinstance(sampler, PrioritizedSampler)
    assert sampler.priority_values([0, 1, 2]).tolist() == [1.0, 1.0, 1.0]
    rb.update_priority([0, 1], [5.0, 0.5])
    rb.extend(transitions(2, 3))
    assert sampler.priority_values([0, 1, 2, 3, 4]).tolist() == [5.0, 0.5, 1.0, 5.0, 5.0]
    fixed = make(n=2, alpha=1.0, beta=0.0, eps=0.0, default_priority=0.25)
    fixed.update_priority([0], 9.0)
    fixed.add(transitions(1, 2)[0])
    assert fixed.sampler.priority_values([0, 1, 2]).tolist() == [9.0, 0.25, 0.25]  # type: ignore[attr-defined]


def test_overwritten_slots_get_a_fresh_priority() -> None:
    rb = make(n=16, capacity=16, alpha=1.0, beta=0.0, eps=0.0)
    rb.update_priority(torch.arange(16), torch.zeros(16))
    rb.update_priority([3], [2.0])
    rb.extend(transitions(2, 16))  # overwrites slots 0 and 1
    assert rb.sampler.priority_values([0, 1, 2, 3]).tolist() == [2.0, 2.0, 0.0, 2.0]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "convert",
    [torch.tensor, np.array, list, lambda x: torch.tensor(x, dtype=torch.int32)],
    ids=["tensor", "ndarray", "list", "int32"],
)
def test_update_priority_input_types_and_duplicates(convert: object) -> None:
    rb = make(alpha=1.0, beta=0.0, eps=0.0)
    rb.update_priority(convert([2, 5, 2]), convert([1, 7, 3]))  # type: ignore[operator]
    assert rb.sampler.priority_values([2, 5]).tolist() == [3.0, 7.0]  # type: ignore[attr-defined]
    rb.update_priority(convert([4, 6]), 0.5)  # type: ignore[operator]
    assert rb.sampler.priority_values([4, 6]).tolist() == [0.5, 0.5]  # type: ignore[attr-defined]
    rb.update_priority(7, 4.0)  # one index, one priority
    rb.update_priority(torch.tensor(8), torch.tensor(2.0, dtype=torch.float32))
    assert rb.sampler.priority_values([7, 8]).tolist() == [4.0, 2.0]  # type: ignore[attr-defined]
    for floats in ([1.5], np.array([1.5]), torch.tensor([1.5])):
        with pytest.raises(TypeError, match="index: expected integers"):
            rb.update_priority(floats, 1.0)


def test_every_input_form_stores_the_same_values() -> None:
    index = [9, 3, 0, 3, 7]
    priority = [0.25, 1.5, 2.0, 0.75, 3.0]
    expected = make(alpha=0.6, beta=0.4)
    expected.update_priority(index, priority)  # lists: the general conversion path
    wide_index = torch.tensor([[i, -1] for i in index])
    wide = torch.tensor([[p, -1.0] for p in priority], dtype=torch.float64)
    forms = {
        "float32 tensors": (torch.tensor(index), torch.tensor(priority)),
        "float64 tensors": (torch.tensor(index), torch.tensor(priority, dtype=torch.float64)),
        "[B, 1] priorities": (torch.tensor(index), torch.tensor(priority).unsqueeze(1)),
        "non-contiguous": (wide_index[:, 0], wide[:, 0]),
        "ndarrays": (np.array(index), np.array(priority, dtype=np.float32)),
        "requires grad": (torch.tensor(index), torch.tensor(priority, requires_grad=True)),
    }
    want = expected.sampler.state_dict()
    for name, (idx, prio) in forms.items():
        rb = make(alpha=0.6, beta=0.4)
        rb.update_priority(idx, prio)
        got = rb.sampler.state_dict()
        assert torch.equal(got["sum_tree"], want["sum_tree"]), name
        assert torch.equal(got["min_tree"], want["min_tree"]), name
        assert got["max_priority"] == want["max_priority"] == 3.0, name


@pytest.mark.parametrize(
    ("index", "priority", "pattern"),
    [
        ([0, 1], [1.0, float("nan")], r"priority: expected finite values, got nan"),
        ([0, 1], [float("inf"), 1.0], r"priority: expected finite values, got inf"),
        ([0, 1], [1.0, -0.5], r"priority: expected values >= 0, got -0.5"),
        ([0, 10], [1.0, 1.0], r"index: 10 is outside the filled range \[0, 10\)"),
        ([-1], [1.0], r"index: -1 is outside the filled range"),
        ([0, 1, 2], [1.0, 2.0], r"priority: expected 3 values \(one per index\), got 2"),
    ],
)
@pytest.mark.parametrize("as_tensors", [False, True], ids=["lists", "tensors"])
def test_bad_update_leaves_the_tree_unchanged(
    index: list, priority: list, pattern: str, as_tensors: bool
) -> None:
    rb = make(alpha=0.6, beta=0.4)
    rb.update_priority([0, 1, 2], [3.0, 4.0, 5.0])
    sampler = rb.sampler
    assert isinstance(sampler, PrioritizedSampler)
    before = sampler.state_dict()
    with pytest.raises(ValueError, match=pattern):
        if as_tensors:  # the in-place kernel path of the training loop
            rb.update_priority(torch.tensor(index), torch.tensor(priority, dtype=torch.float32))
        else:
            rb.update_priority(index, priority)
        sampler.check_errors()  # device trees report a refusal here; CPU ones raise above
    after = sampler.state_dict()
    assert torch.equal(before["sum_tree"], after["sum_tree"])
    assert torch.equal(before["min_tree"], after["min_tree"])
    assert before["max_priority"] == after["max_priority"]


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"alpha": -1.0, "beta": 0.4}, ValueError, "alpha must be a finite number >= 0"),
        ({"alpha": 0.6, "beta": float("nan")}, ValueError, "beta must be a finite number"),
        ({"alpha": 0.6, "beta": 0.4, "eps": -1e-3}, ValueError, "eps must be"),
        ({"alpha": "high", "beta": 0.4}, TypeError, "alpha must be a number"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        PrioritizedSampler(8, **kwargs)


def test_stratified_draws_one_per_segment() -> None:
    rb = make(n=8, capacity=8, alpha=1.0, beta=0.0, eps=0.0, stratified=True)
    for _ in range(20):
        assert sorted(rb.sample(8)["index"].tolist()) == list(range(8))


def test_state_dict_resumes_identically() -> None:
    rb = make(n=10, alpha=0.6, beta=0.4)
    rb.update_priority(torch.arange(10), torch.rand(10) + 0.1)
    state = rb.sampler.state_dict()
    expected = [rb.sample(16)["index"].tolist() for _ in range(3)]
    other = PrioritizedSampler(16, alpha=0.6, beta=0.4)
    other.load_state_dict(state)
    clone = ReplayBuffer(rb.storage, sampler=other)
    assert [clone.sample(16)["index"].tolist() for _ in range(3)] == expected
    with pytest.raises(ValueError, match="the state is for 16 slots, this sampler has 8"):
        PrioritizedSampler(8, alpha=0.6, beta=0.4).load_state_dict(state)


def test_torch_reference_path_draws_the_same(
    monkeypatch: pytest.MonkeyPatch, tree_path: str
) -> None:
    if tree_path == "torch":
        pytest.skip("compares the two paths itself")
    prio = torch.rand(10) * 3

    def run() -> tuple[list[int], torch.Tensor]:
        rb = make(n=10, alpha=0.6, beta=0.4, seed=7)
        rb.update_priority(torch.arange(10), prio)
        batch = rb.sample(64)
        return batch["index"].tolist(), batch["weight"]

    fast = run()
    monkeypatch.setattr(prioritized_module, "_DEVICE_PATH_ON_CPU", True)
    monkeypatch.setattr(prioritized_module, "_DEVICE_KERNELS", "torch")
    slow = run()
    assert fast[0] == slow[0]
    torch.testing.assert_close(fast[1], slow[1])


def test_dataloader_batch_sampler_carries_index_and_weight() -> None:
    rb = make(n=10, alpha=1.0, beta=0.5, eps=0.0)
    rb.update_priority(torch.arange(10), torch.arange(1.0, 11.0))
    batches = BatchSampler(rb.sampler, batch_size=4, num_batches=3)  # type: ignore[arg-type]
    loader = DataLoader(rb.storage, batch_sampler=batches)
    seen = list(loader)
    assert len(seen) == 3
    for batch in seen:
        assert batch.batch_size == (4,)
        assert batch["id"].tolist() == batch["index"].tolist()
        expected = (torch.arange(1.0, 11.0)[batch["index"]] / 1.0) ** -0.5
        torch.testing.assert_close(batch["weight"], expected)
        rb.update_priority(batch["index"], torch.ones(4))
    # the sampler also plugs in as a plain sampler (ints, no weights)
    plain = DataLoader(rb.storage, sampler=rb.sampler, batch_size=5)
    assert sum(len(b) for b in plain) == 10


def test_reset_by_empty() -> None:
    rb = make(n=10, alpha=1.0, beta=0.0, eps=0.0)
    rb.update_priority([0], 100.0)
    rb.empty()
    rb.extend(transitions(2))
    assert rb.sampler.max_priority == 1.0  # type: ignore[attr-defined]
    assert rb.sampler.priority_values([0, 1, 2]).tolist() == [1.0, 1.0, 0.0]  # type: ignore[attr-defined]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_sampler_matches_cpu() -> None:
    def run(device: str) -> tuple[list[int], torch.Tensor]:
        sampler = PrioritizedSampler(
            64, alpha=0.6, beta=0.4, device=device, generator=torch.Generator().manual_seed(3)
        )
        rb = ReplayBuffer(TensorStorage(64), sampler=sampler)
        rb.extend(transitions(50))
        rb.update_priority(torch.arange(50), torch.arange(50.0) + 1)
        batch = rb.sample(128)
        return batch["index"].tolist(), batch["weight"].cpu()

    cpu, gpu = run("cpu"), run("cuda")
    assert cpu[0] == gpu[0]
    torch.testing.assert_close(cpu[1], gpu[1])


def test_read_only_arrays_are_accepted() -> None:
    rb = make(alpha=1.0, beta=0.0, eps=0.0)
    index, priority = np.array([1, 2]), np.array([3.0, 4.0])
    index.flags.writeable = False
    priority.flags.writeable = False
    rb.update_priority(index, priority)
    assert rb.sampler.priority_values([1, 2]).tolist() == [3.0, 4.0]  # type: ignore[attr-defined]


def test_per_step_adds_set_the_same_priorities_as_batch_extends() -> None:
    # on_write of one slot takes a kernel call of its own; the reference writes the same
    # items in batches (the general on_write), with the same priority updates in between
    cap = 16

    def buffer() -> ReplayBuffer:
        return ReplayBuffer(TensorStorage(cap), PrioritizedSampler(cap, alpha=0.7, beta=0.5))

    rb, ref = buffer(), buffer()
    for round_ in range(3):
        for k in range(11):
            rb.add({"x": np.float32(k)})
        ref.extend({"x": np.arange(11, dtype=np.float32)})
        for r in (rb, ref):
            r.update_priority([round_, 5], [0.5 + round_, 3.0 * (round_ + 1)])
    assert torch.equal(rb.sampler.priority_values(), ref.sampler.priority_values())
    assert rb.sampler.min() == ref.sampler.min()
    assert rb.sampler.max_priority == ref.sampler.max_priority == 9.0


def test_priorities_computed_with_grad_are_taken_without_a_warning() -> None:
    rb = make(alpha=0.7, beta=0.5)
    q = torch.rand(4, requires_grad=True)
    td = (q - 0.5).abs() + 0.1  # requires_grad, as a TD error is
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rb.update_priority(torch.arange(4), td)  # a tensor
        rb.update_priority(torch.arange(4), td[:, None])  # (n, 1)
        rb.update_priority(torch.arange(4), td[0])  # one value for all
        rb.update_priority(2, td[1])  # an int index
        rb.update_priority([0, 1, 2, 3], list(td))  # a list of 0-d tensors: raised before
        rb.sampler.check_priority(torch.arange(4), td)
    expected = (td.detach().double() + rb.sampler.eps) ** rb.sampler.alpha
    assert torch.allclose(rb.sampler.priority_values(torch.arange(4)).double(), expected)
    assert q.grad is None
