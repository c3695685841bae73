"""The prioritized sampler's device path (issue 12): placements, CPU equivalence, no host sync.

Runs everywhere: the batched torch tree ops against the numba kernels (bit for bit), and the
sampler's device path -- the code that runs on CUDA: priorities checked on the device, errors
reported at a later call, new items queued -- forced onto CPU trees. Tests marked ``cuda``
run the same on a GPU (``make test-cuda``): the three placements through ``ReplayBuffer``
and ``DataLoader``, equivalence with the CPU sampler, and a sample + update cycle under
``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from storage_contract import transitions
from torch.utils.data import DataLoader

from rbdata import BatchSampler, MemmapStorage, PrioritizedSampler, ReplayBuffer, TensorStorage
from rbdata.samplers import prioritized as prioritized_module
from rbdata.samplers._trees import numba_kernels as _kernels
from rbdata.samplers._trees import sumtree as _sumtree
from rbdata.samplers._trees import torch_ops as _torch_tree
from rbdata.samplers._trees.cpu import CpuTrees
from rbdata.samplers._trees.device import DeviceTrees, triton_ready

CUDA = torch.cuda.is_available()


KERNELS = ["triton", "torch"]


def use_kernels(monkeypatch: pytest.MonkeyPatch, kernels: str) -> None:
    """Samplers built from here take the device (CUDA) code path with ``kernels``.

    Without a GPU: on CPU trees, the Triton kernels in Triton's interpreter (the tests'
    conftest sets ``TRITON_INTERPRET=1``).
    """
    if kernels == "triton" and not triton_ready(torch.device("cpu")):
        pytest.skip("triton is not installed (or not in interpreter mode without a GPU)")
    monkeypatch.setattr(prioritized_module, "_DEVICE_PATH_ON_CPU", True)
    monkeypatch.setattr(prioritized_module, "_DEVICE_KERNELS", kernels)


@pytest.fixture(params=KERNELS)
def device_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Samplers built inside the test take the device code path on CPU trees, each kernel set."""
    use_kernels(monkeypatch, str(request.param))
    return str(request.param)


def device_trees(sampler: Any) -> DeviceTrees:
    trees = sampler._trees
    assert isinstance(trees, DeviceTrees)
    return trees


def trees(capacity: int, dtype: torch.dtype, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    return (
        _sumtree.new_tree(capacity, "sum", dtype, device),
        _sumtree.new_block_min_tree(capacity, dtype, device),
    )


def levels(tree: torch.Tensor) -> _torch_tree.Levels:
    return _torch_tree.Levels(_sumtree.layout(tree), tree.shape[0], tree.device)


def nb_set(sum_tree: torch.Tensor, min_tree: torch.Tensor, idx: torch.Tensor, values: Any) -> None:
    """The numba kernel's update with alpha=1, eps=0: the values are stored as given."""
    vmax = float(torch.finfo(sum_tree.dtype).max)
    offsets = np.asarray(_sumtree.layout(sum_tree), dtype=np.int64)
    code, _, _ = _kernels._nb_set_priorities(
        sum_tree.numpy(),
        min_tree.numpy(),
        offsets,
        idx.numpy(),
        values.numpy(),
        sum_tree.shape[0] - offsets[-1],
        0.0,
        1.0,
        vmax,
        _sumtree.largest_base(vmax, 1.0),
    )
    assert code == 0


def nb_draw(
    sum_tree: torch.Tensor, min_tree: torch.Tensor, targets: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    index = torch.empty(targets.shape, dtype=torch.long)
    weight = torch.empty(targets.shape, dtype=torch.float32)
    offsets = np.asarray(_sumtree.layout(sum_tree), dtype=np.int64)
    min_root = float(min_tree[_sumtree.ROOT])
    _kernels._nb_draw(
        sum_tree.numpy(), offsets, min_root, targets.numpy(), beta, index.numpy(), weight.numpy()
    )
    return index, weight


def random_updates(
    capacity: int, rounds: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches with duplicates, zeros, a wide range of magnitudes, and a single slot."""
    gen = torch.Generator().manual_seed(seed)
    for r in range(rounds):
        n = 1 if r % 5 == 4 else int(torch.randint(1, 3 * capacity + 2, (1,), generator=gen))
        idx = torch.randint(capacity, (n,), generator=gen)
        exponent = torch.randint(-20, 20, (n,), generator=gen).double()
        values = torch.rand(n, generator=gen, dtype=torch.float64) * 2.0**exponent
        values[torch.rand(n, generator=gen) < 0.3] = 0.0
        yield idx, values


def targets_for(sum_tree: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Uniform targets plus the edges: 0 and just below the total (rounds up in float64)."""
    u = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    u[:4] = torch.tensor([0.0, 1.0 - 2.0**-53, 0.5, 1.0 - 2.0**-40], dtype=torch.float64)
    return u * sum_tree[_sumtree.ROOT]


# --- the batched torch ops against the numba kernels (pure functions) -------------------------
CAPACITIES = [1, 2, 7, 8, 9, 63, 64, 65, 513, 4097]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_batched_tree_ops_match_the_numba_kernels_bit_for_bit(
    capacity: int, dtype: torch.dtype
) -> None:
    nb, tt = trees(capacity, dtype), trees(capacity, dtype)
    sum_levels, min_levels = levels(tt[0]), levels(tt[1])
    scratch = _torch_tree.new_scratch(sum_levels.leaves, "cpu")
    for step, (idx, values) in enumerate(random_updates(capacity, 25, seed=capacity)):
        nb_set(*nb, idx, values)
        _torch_tree.set_values(*tt, sum_levels, min_levels, idx, values, scratch)
        assert torch.equal(nb[0], tt[0]), f"sum tree after update {step}"
        assert torch.equal(nb[1], tt[1]), f"min tree after update {step}"
        targets = targets_for(nb[0], 2000, seed=step)
        for beta in (0.0, 0.4, 1.0):
            want = nb_draw(*nb, targets, beta)
            got = _torch_tree.draw(tt[0], tt[1][_sumtree.ROOT], sum_levels, targets, beta)
            assert torch.equal(want[0], got[0]), f"indices after update {step}"
            # float64 pow of libm vs torch: at most one float32 ulp apart (bits, in practice)
            torch.testing.assert_close(got[1], want[1], rtol=2.0**-23, atol=0.0)


def test_all_zero_tree_descends_to_slot_0_like_the_kernel() -> None:
    tree, mins = trees(100, torch.float32)
    targets = torch.tensor([0.0, 0.5, 3.0], dtype=torch.float64)
    assert nb_draw(tree, mins, targets, 0.4)[0].tolist() == [0, 0, 0]
    assert _torch_tree.find(tree, levels(tree), targets).tolist() == [0, 0, 0]


def test_update_recomputes_only_the_touched_ancestors() -> None:
    tree, mins = trees(4096, torch.float64)  # 4 levels below the root
    sum_levels, min_levels = levels(tree), levels(mins)
    scratch = _torch_tree.new_scratch(sum_levels.leaves, "cpu")
    offsets = sum_levels.offsets
    # a sentinel in a node no update below touches: slot 0's path is 0 -> 0 -> 0 -> 0,
    # the sentinel sits at node 5 of level 2 (slots 320 .. 383)
    tree[offsets[2] + 5] = -123.0
    mins[offsets[1] + 5] = -7.0
    for slots in ([0], [0, 1, 2, 3], [7, 0, 7]):  # fewer slots than nodes at levels 1..3
        idx = torch.tensor(slots)
        _torch_tree.set_values(
            tree, mins, sum_levels, min_levels, idx, torch.ones(len(slots)), scratch
        )
        assert float(tree[offsets[2] + 5]) == -123.0  # never recomputed
        assert float(mins[offsets[1] + 5]) == -7.0
    leaves = tree[sum_levels.leaf0 :]
    assert leaves[:8].tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert float(tree[offsets[3]]) == 5.0  # slot 0's ancestors were recomputed
    assert float(tree[offsets[2]]) == 5.0


def test_duplicates_in_one_update_last_write_wins() -> None:
    tree, mins = trees(64, torch.float32)
    idx = torch.tensor([3, 9, 3, 3, 9, 40])
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dtype=torch.float64)
    scratch = _torch_tree.new_scratch(64, "cpu")
    scratch.fill_(10**6)  # stale content from earlier calls does not matter
    _torch_tree.set_values(tree, mins, levels(tree), levels(mins), idx, values, scratch)
    leaves = tree[_sumtree.leaf_offset(tree) :]
    assert (leaves[3].item(), leaves[9].item(), leaves[40].item()) == (4.0, 5.0, 6.0)
    assert float(tree[_sumtree.ROOT]) == 15.0
    assert float(mins[_sumtree.ROOT]) == 4.0


def test_keep_false_writes_nothing() -> None:
    tree, mins = trees(64, torch.float32)
    scratch = _torch_tree.new_scratch(64, "cpu")
    args = (levels(tree), levels(mins))
    _torch_tree.set_values(tree, mins, *args, torch.arange(10), torch.ones(10), scratch)
    before = tree.clone(), mins.clone()
    refused = torch.tensor(False)
    _torch_tree.set_values(
        tree, mins, *args, torch.tensor([3, 50]), torch.tensor([9.0, 9.0]), scratch, refused
    )
    assert torch.equal(tree, before[0]) and torch.equal(mins, before[1])


# --- the sampler's device path, forced onto CPU trees -----------------------------------------
def buffer(**kwargs: Any) -> ReplayBuffer:
    capacity = kwargs.pop("capacity", 64)
    storage = kwargs.pop("storage", None)
    if storage is None:
        storage = TensorStorage(capacity)
    sampler = PrioritizedSampler(
        capacity,
        kwargs.pop("alpha", 0.6),
        kwargs.pop("beta", 0.4),
        generator=torch.Generator().manual_seed(kwargs.pop("seed", 0)),
        **kwargs,
    )
    return ReplayBuffer(storage, sampler)


def run_workload(rb: ReplayBuffer, rounds: int = 25) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Extends, adds (the ring wraps), samples and updates with duplicates; the batches."""
    gen = torch.Generator().manual_seed(11)
    out = []
    rb.extend(transitions(20))
    for r in range(rounds):
        batch = rb.sample(48)
        out.append((batch["index"].cpu(), batch["weight"].cpu()))
        idx = batch["index"][:16]
        rb.update_priority(idx, (torch.rand(16, generator=gen) * 4).to(idx.device))
        rb.add(transitions(1, 100 + r)[0])
        rb.extend(transitions(3, 200 + 3 * r))
    return out


CASES = {
    "default": {},
    "stratified": {"stratified": True},
    "fixed default priority": {"default_priority": 0.3},
    "alpha 1, beta 1": {"alpha": 1.0, "beta": 1.0},
    "float64 trees": {"dtype": torch.float64},
}


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("case", list(CASES))
def test_device_path_matches_the_cpu_sampler(
    case: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = buffer(**CASES[case])
    use_kernels(monkeypatch, kernels)
    dev = buffer(**CASES[case])
    assert device_trees(dev.sampler).kernels == kernels
    for step, (a, b) in enumerate(zip(run_workload(cpu), run_workload(dev), strict=True)):
        assert torch.equal(a[0], b[0]), f"indices of batch {step}"
        torch.testing.assert_close(a[1], b[1], rtol=2.0**-23, atol=0.0)
    want, got = cpu.sampler.state_dict(), dev.sampler.state_dict()
    # same float64 sums and comparisons; ``pow`` may differ in the last float64 bit, which
    # (here, and almost always) rounds away in the float32 tree
    torch.testing.assert_close(got["sum_tree"], want["sum_tree"], rtol=2.0**-23, atol=0.0)
    torch.testing.assert_close(got["min_tree"], want["min_tree"], rtol=2.0**-23, atol=0.0)
    assert got["max_priority"] == want["max_priority"]
    assert torch.equal(got["generator"], want["generator"])


BAD_UPDATES = [
    ([0, 1], [1.0, float("nan")], r"priority: expected finite values, got nan"),
    ([0, 1], [float("inf"), 1.0], r"priority: expected finite values, got inf"),
    ([0, 1], [1.0, float("-inf")], r"priority: expected finite values, got -inf"),
    ([0, 1], [1.0, -0.5], r"priority: expected values >= 0, got -0.5"),
    ([0, 10], [1.0, 1.0], r"index: 10 is outside the filled range \[0, 10\)"),
    ([-1], [1.0], r"index: -1 is outside the filled range"),
    ([0, 1], [1.0, 1e30], r"priority: 1[.0-9]*e\+30 at index 1 gives .* not finite in the tree's"),
    ([2, 2, 5], [2e38, 3e38, 3e38], r"total overflow"),
]


@pytest.mark.usefixtures("device_path")
@pytest.mark.parametrize(("index", "priority", "pattern"), BAD_UPDATES)
@pytest.mark.parametrize("report", ["next update", "next sample", "check_errors"])
def test_device_path_refuses_a_bad_update_and_reports_it_later(
    index: list, priority: list, pattern: str, report: str
) -> None:
    rb = buffer(capacity=16, alpha=2.0 if "e\\+30" in pattern else 1.0)  # (1e30)**2: inf
    rb.extend(transitions(10))
    rb.update_priority([0, 1, 2], [3.0, 4.0, 5.0])
    sampler = rb.sampler
    assert isinstance(sampler, PrioritizedSampler)
    before = sampler.state_dict()
    rb.update_priority(torch.tensor(index), torch.tensor(priority))  # no error here
    after = sampler.state_dict()  # the refused call changed nothing
    assert torch.equal(before["sum_tree"], after["sum_tree"])
    assert torch.equal(before["min_tree"], after["min_tree"])
    assert before["max_priority"] == after["max_priority"]
    with pytest.raises(ValueError, match=pattern):
        if report == "next update":
            rb.update_priority([3], [1.0])
        elif report == "next sample":
            rb.sample(4)
        else:
            sampler.check_errors()
    sampler.check_errors()  # reported once, then forgotten
    rb.update_priority([3], [1.0])
    assert sampler.priority_values([3]).tolist() == [1.0]


@pytest.mark.usefixtures("device_path")
def test_device_path_only_the_first_refusal_is_kept() -> None:
    rb = buffer(capacity=16)
    rb.extend(transitions(10))
    device_trees(rb.sampler)._err_np[:] = 0  # (as if the GPU had not reported)
    rb.update_priority([0], [-1.0])
    device_trees(rb.sampler)._err_np[:] = 0
    rb.update_priority([0], [float("nan")])
    with pytest.raises(ValueError, match=r"got -1\.0"):
        rb.sampler.check_errors()  # type: ignore[attr-defined]


@pytest.mark.usefixtures("device_path")
def test_device_path_checks_shapes_and_types_at_once() -> None:
    rb = buffer(capacity=16)
    rb.extend(transitions(10))
    with pytest.raises(ValueError, match=r"expected 3 values \(one per index\), got 2"):
        rb.update_priority([0, 1, 2], [1.0, 2.0])
    with pytest.raises(TypeError, match="index: expected integers"):
        rb.update_priority(torch.tensor([1.5]), 1.0)
    with pytest.raises(TypeError, match="index: expected integers"):
        rb.update_priority([1.5], 1.0)
    rb.update_priority(torch.tensor([], dtype=torch.long), torch.tensor([]))
    rb.sampler.check_errors()  # type: ignore[attr-defined]


@pytest.mark.usefixtures("device_path")
@pytest.mark.parametrize(
    "form",
    ["tensors", "[B, 1]", "int32 index", "lists", "ndarrays", "scalar", "0-d tensor", "grad"],
)
def test_device_path_input_forms(form: str) -> None:
    rb = buffer(capacity=16, alpha=1.0, eps=0.0)
    rb.extend(transitions(10))
    index, priority = [4, 6, 4], [1.0, 2.0, 3.0]
    forms: dict[str, tuple[Any, Any]] = {
        "tensors": (torch.tensor(index), torch.tensor(priority)),
        "[B, 1]": (torch.tensor(index), torch.tensor(priority).unsqueeze(1)),
        "int32 index": (torch.tensor(index, dtype=torch.int32), torch.tensor(priority)),
        "lists": (index, priority),
        "ndarrays": (np.array(index), np.array(priority, dtype=np.float32)),
        "scalar": (index, 3.0),
        "0-d tensor": (torch.tensor(index), torch.tensor(3.0, dtype=torch.float64)),
        "grad": (torch.tensor(index), torch.tensor(priority, requires_grad=True)),
    }
    rb.update_priority(*forms[form])
    assert rb.sampler.priority_values([4, 6]).tolist()[0] == 3.0  # type: ignore[attr-defined]
    assert rb.sampler.max_priority == 3.0  # type: ignore[attr-defined]


@pytest.mark.usefixtures("device_path")
def test_device_path_all_zero_tree_draws_slot_0_and_reports_it() -> None:
    rb = buffer(capacity=16, alpha=1.0, beta=0.5, eps=0.0)
    rb.extend(transitions(8))
    rb.update_priority(torch.arange(8), torch.zeros(8))
    batch = rb.sample(5)  # nothing raises on the device path ...
    assert batch["index"].tolist() == [0] * 5
    with pytest.raises(ValueError, match="every priority in the buffer is zero"):
        rb.sample(5)  # ... the next call does


@pytest.mark.usefixtures("device_path")
def test_device_path_new_items_are_queued_and_applied_in_order() -> None:
    rb = buffer(capacity=8, alpha=1.0, eps=0.0)
    sampler = rb.sampler
    assert isinstance(sampler, PrioritizedSampler)
    rb.extend(transitions(4))
    assert len(device_trees(sampler)._pending_tensors) == 1  # queued, not applied yet
    assert sampler.priority_values([0, 3, 4]).tolist() == [1.0, 1.0, 0.0]
    rb.update_priority([1], [5.0])
    rb.add(transitions(1, 4)[0])
    rb.add(transitions(1, 5)[0])
    assert device_trees(sampler)._pending_slots == [4, 5]
    rb.update_priority([4], [0.5])  # the queued items come first: then 4 gets 0.5
    assert sampler.priority_values().tolist() == [1.0, 5.0, 1.0, 1.0, 0.5, 5.0, 0.0, 0.0]
    rb.extend(transitions(4, 6))  # wraps: slots 6, 7, 0, 1 get the highest priority, 5.0
    assert sampler.max_priority == 5.0
    assert sampler.priority_values().tolist() == [5.0, 5.0, 1.0, 1.0, 0.5, 5.0, 5.0, 5.0]


@pytest.mark.usefixtures("device_path")
def test_device_path_queues_a_copy_of_the_written_slots() -> None:
    rb = buffer(capacity=8, alpha=1.0, eps=0.0)
    rb.extend(transitions(2))
    rb.update_priority([0], [5.0])
    slots = rb.extend(transitions(2, 2))  # queued with the highest priority, 5.0
    slots.fill_(1)  # the caller reuses its tensor before the queue is applied
    assert rb.sampler.priority_values().tolist() == [5.0, 1.0, 5.0, 5.0, 0, 0, 0, 0]  # type: ignore[attr-defined]


@pytest.mark.usefixtures("device_path")
def test_device_path_overflowing_new_items_are_refused_and_reported() -> None:
    rb = buffer(capacity=32, alpha=1.0)
    rb.extend(transitions(10))
    rb.update_priority(torch.arange(10), 3e37)  # total 3e38: fits; the max is now 3e37
    before = rb.sampler.state_dict()
    rb.extend(transitions(10, 10))  # ten more at 3e37 would overflow: the device refuses
    after = rb.sampler.state_dict()
    assert torch.equal(before["sum_tree"], after["sum_tree"])
    with pytest.raises(ValueError, match="total overflow"):
        rb.sampler.check_errors()  # type: ignore[attr-defined]


@pytest.mark.usefixtures("device_path")
def test_device_path_state_round_trips_and_pickles() -> None:
    rb = buffer(capacity=32)
    run_workload(rb, rounds=3)
    sampler = rb.sampler
    assert isinstance(sampler, PrioritizedSampler)
    rb.add(transitions(1, 900)[0])  # a queued item travels too
    state = sampler.state_dict()
    clone = pickle.loads(pickle.dumps(sampler))
    device_trees(clone)
    assert torch.equal(clone.state_dict()["sum_tree"], state["sum_tree"])
    other = PrioritizedSampler(32, 0.6, 0.4)
    other.load_state_dict(state)
    assert torch.equal(other.state_dict()["sum_tree"], state["sum_tree"])
    assert other.max_priority == sampler.max_priority
    copy = ReplayBuffer(rb.storage, other)
    assert torch.equal(copy.sample(16)["index"], rb.sample(16)["index"])


def test_device_state_loads_into_the_numba_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prioritized_module, "_DEVICE_PATH_ON_CPU", True)
    dev = buffer(capacity=32)
    run_workload(dev, rounds=3)
    monkeypatch.setattr(prioritized_module, "_DEVICE_PATH_ON_CPU", False)
    cpu = buffer(capacity=32, storage=dev.storage, seed=5)
    cpu.sampler.load_state_dict(dev.sampler.state_dict())
    for _ in range(3):
        assert torch.equal(cpu.sample(32)["index"], dev.sample(32)["index"])


# --- placement --------------------------------------------------------------------------------
def test_device_none_follows_the_storage() -> None:
    sampler = PrioritizedSampler(16, 0.6, 0.4)
    assert sampler.device == torch.device("cpu") and sampler.config()["device"] is None
    ReplayBuffer(TensorStorage(16), sampler)
    assert sampler.device == torch.device("cpu") and isinstance(sampler._trees, CpuTrees)
    pinned = PrioritizedSampler(16, 0.6, 0.4, device="cpu")
    assert pinned.config()["device"] == "cpu"
    given = PrioritizedSampler(16, 0.6, 0.4, data_source=TensorStorage(16))
    assert given.device == torch.device("cpu")


@pytest.mark.skipif(CUDA, reason="checks the error without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")])
def test_asking_for_cuda_without_cuda_says_so(device: Any) -> None:
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        PrioritizedSampler(16, 0.6, 0.4, device=device)


def test_a_meta_device_is_refused() -> None:
    with pytest.raises(ValueError, match="'meta' device holds no data"):
        PrioritizedSampler(16, 0.6, 0.4, device="meta")


@pytest.mark.usefixtures("device_path")
@pytest.mark.parametrize("kind", ["tensor", "memmap"])
def test_device_path_through_replay_buffer_and_dataloader(kind: str) -> None:
    storage = TensorStorage(64) if kind == "tensor" else MemmapStorage(64)
    try:
        rb = buffer(capacity=64, storage=storage, alpha=1.0, beta=0.5, eps=0.0)
        rb.extend(transitions(40))
        rb.update_priority(torch.arange(40), torch.arange(1.0, 41.0))
        batch = rb.sample(32)
        assert torch.equal(batch["id"], batch["index"])
        torch.testing.assert_close(batch["weight"], (batch["index"] + 1.0) ** -0.5)
        loader = DataLoader(storage, batch_sampler=BatchSampler(rb.sampler, 16, num_batches=3))
        for got in loader:
            assert torch.equal(got["id"], got["index"])
            values = rb.sampler.priority_values()[:40]  # type: ignore[attr-defined]
            expected = (values[got["index"]] / values.min()) ** -0.5
            torch.testing.assert_close(got["weight"], expected)
            rb.update_priority(got["index"], torch.ones(16))
        rb.sampler.check_errors()  # type: ignore[attr-defined]
    finally:
        if kind == "memmap":
            storage.close()  # type: ignore[attr-defined]


# --- CUDA ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("capacity", [9, 4097, 100_003])
@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_tree_ops_match_the_numba_kernels(capacity: int, dtype: torch.dtype) -> None:
    nb, gpu = trees(capacity, dtype), trees(capacity, dtype, "cuda")
    sum_levels, min_levels = levels(gpu[0]), levels(gpu[1])
    scratch = _torch_tree.new_scratch(sum_levels.leaves, "cuda")
    for step, (idx, values) in enumerate(random_updates(capacity, 12, seed=capacity)):
        nb_set(*nb, idx, values)
        _torch_tree.set_values(*gpu, sum_levels, min_levels, idx.cuda(), values.cuda(), scratch)
        assert torch.equal(nb[0], gpu[0].cpu()), f"sum tree after update {step}"
        assert torch.equal(nb[1], gpu[1].cpu()), f"min tree after update {step}"
        targets = targets_for(nb[0], 20_000, seed=step)
        want = nb_draw(*nb, targets, 0.4)
        got = _torch_tree.draw(gpu[0], gpu[1][_sumtree.ROOT], sum_levels, targets.cuda(), 0.4)
        assert torch.equal(want[0], got[0].cpu()), f"indices after update {step}"
        torch.testing.assert_close(got[1].cpu(), want[1], rtol=2.0**-23, atol=0.0)


def _cuda_buffer(placement: str, seed: int = 0) -> ReplayBuffer:
    """One of the three placements, with a CPU generator (same draws as a CPU sampler)."""
    storage: Any = {
        "cuda storage + cuda sampler": lambda: TensorStorage(256, device="cuda"),
        "memmap storage + cuda sampler": lambda: MemmapStorage(256),
        "cuda storage + cpu sampler": lambda: TensorStorage(256, device="cuda"),
        "cpu reference": lambda: TensorStorage(256),
    }[placement]()
    device = {"memmap storage + cuda sampler": "cuda", "cuda storage + cpu sampler": "cpu"}
    sampler = PrioritizedSampler(
        256,
        0.6,
        0.4,
        device=device.get(placement),  # None: follows the storage
        generator=torch.Generator().manual_seed(seed),
    )
    return ReplayBuffer(storage, sampler)


PLACEMENTS = [
    "cuda storage + cuda sampler",
    "memmap storage + cuda sampler",
    "cuda storage + cpu sampler",
]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_placements_match_the_cpu_sampler(placement: str) -> None:
    reference, rb = _cuda_buffer("cpu reference"), _cuda_buffer(placement)
    sampler = rb.sampler
    assert isinstance(sampler, PrioritizedSampler)
    sampler_on = "cpu" if placement.endswith("cpu sampler") else "cuda"
    data_on = "cpu" if placement.startswith("memmap") else "cuda"
    assert sampler.device.type == sampler_on
    try:
        for r in range(6):
            for buf in (reference, rb):
                buf.extend(transitions(50, 60 * r))
            want, got = reference.sample(64), rb.sample(64)
            assert got["observation"].device.type == data_on
            # a GPU sampler's index and weight stay on the GPU; a CPU one's join the data
            extras_on = "cuda" if sampler_on == "cuda" else data_on
            assert got["index"].device.type == got["weight"].device.type == extras_on
            assert torch.equal(got["index"].cpu(), want["index"])
            assert torch.equal(got["id"].cpu(), want["id"])
            torch.testing.assert_close(got["weight"].cpu(), want["weight"], rtol=2e-7, atol=0)
            prio = torch.rand(64, generator=torch.Generator().manual_seed(r)) + 0.1
            reference.update_priority(want["index"], prio)
            if r % 2:  # CPU tensors on even rounds, the batch's own device on odd ones
                rb.update_priority(got["index"], prio.to(got["index"].device))
            else:
                rb.update_priority(got["index"].cpu(), prio)
        loader = DataLoader(rb.storage, batch_sampler=BatchSampler(sampler, 32, num_batches=2))
        ref_loader = DataLoader(
            reference.storage, batch_sampler=BatchSampler(reference.sampler, 32, num_batches=2)
        )
        for got, want in zip(loader, ref_loader, strict=True):
            assert torch.equal(got["index"].cpu(), want["index"])
            assert torch.equal(got["id"].cpu(), want["id"])
            assert got["observation"].device.type == data_on
        sampler.check_errors()
    finally:
        close = getattr(rb.storage, "close", None)
        if close is not None:
            close()


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_sampler_follows_a_cuda_storage_with_its_own_cuda_generator() -> None:
    sampler = PrioritizedSampler(64, 0.6, 0.4)
    rb = ReplayBuffer(TensorStorage(64, device="cuda"), sampler)
    assert sampler.device.type == "cuda" and sampler.generator.device.type == "cuda"
    assert sampler.config()["device"] is None
    rb.extend(transitions(10))
    batch = rb.sample(8)
    assert batch["index"].device.type == batch["weight"].device.type == "cuda"
    assert batch.device is not None and batch.device.type == "cuda"
    # a CPU generator's state (a checkpoint of a sampler made with one) brings its kind
    cpu_gen = torch.Generator().manual_seed(3)
    state = sampler.state_dict()
    state["generator"] = cpu_gen.get_state()
    sampler.load_state_dict(state)
    assert sampler.generator.device.type == "cpu"


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_sample_and_update_never_wait_for_the_gpu() -> None:
    capacity, batch_size = 100_000, 4096
    storage = TensorStorage(capacity, device="cuda")
    sampler = PrioritizedSampler(capacity, 0.6, 0.4)  # follows the storage: CUDA trees
    rb = ReplayBuffer(storage, sampler, batch_size=batch_size)
    data = {"obs": torch.randn(capacity, 32), "reward": torch.randn(capacity)}
    rb.extend(data)
    memmap_rb = ReplayBuffer(MemmapStorage(1000), PrioritizedSampler(1000, 0.6, 0.4, device="cuda"))
    memmap_rb.extend({"obs": torch.randn(1000, 4)})
    cpu_index = torch.randint(capacity, (batch_size,))
    cpu_prio = torch.rand(batch_size)

    def cycle() -> None:
        batch = rb.sample()  # draw + gather on the GPU
        td_error = batch["obs"].sum(1).abs() * batch["weight"]
        rb.update_priority(batch["index"], td_error)  # CUDA tensors
        rb.update_priority(cpu_index, cpu_prio)  # CPU tensors
        rb.update_priority(cpu_index.tolist()[:8], 2.0)  # a list and a scalar
        idx, extras = memmap_rb.sampler.draw(256)  # the draw of placement 2 (its gather waits)
        memmap_rb.update_priority(idx, extras["weight"])
        rb.extend({"obs": torch.randn(512, 32), "reward": torch.randn(512)})  # pinned copies

    for _ in range(3):  # warm-up: allocations, the pinned-memory pool, the first layouts
        cycle()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            cycle()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    sampler.check_errors()
    memmap_rb.sampler.check_errors()  # type: ignore[attr-defined]
    memmap_rb.storage.close()  # type: ignore[attr-defined]


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_bad_priority_is_refused_on_the_device_and_reported() -> None:
    rb = ReplayBuffer(TensorStorage(64, device="cuda"), PrioritizedSampler(64, 0.6, 0.4))
    rb.extend(transitions(10))
    before = rb.sampler.state_dict()
    rb.update_priority(torch.arange(3, device="cuda"), torch.tensor([1.0, math.nan, 2.0]).cuda())
    assert torch.equal(rb.sampler.state_dict()["sum_tree"], before["sum_tree"])
    with pytest.raises(ValueError, match="expected finite values, got nan"):
        rb.sampler.check_errors()  # type: ignore[attr-defined]


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_storage_extend_from_cpu_round_trips_the_data() -> None:
    storage = TensorStorage(1000, device="cuda")
    rb = ReplayBuffer(storage)
    source = transitions(700)
    rb.extend(source)
    rb.extend(transitions(700, 700))  # wraps: two runs
    rb.storage.set(torch.tensor([5, 3]), transitions(2, 5000))  # indexed write
    torch.cuda.synchronize()
    assert storage.buffers[0].device.type == "cuda"
    got = storage[torch.arange(1000)]
    expected = [*range(1000, 1400), *range(400, 1000)]
    expected[5], expected[3] = 5000, 5001
    ids = got["id"].cpu()
    assert ids.tolist() == expected
    torch.testing.assert_close(got["observation"][:, 0].cpu(), ids.float())


WITHOUT_TRITON = """
import sys, warnings
warnings.simplefilter("error")
sys.modules["triton"] = None  # as if it were not installed
import torch
import rbdata
from rbdata import PrioritizedSampler, ReplayBuffer, TensorStorage
from rbdata.samplers import prioritized
prioritized._DEVICE_PATH_ON_CPU = True
rb = ReplayBuffer(TensorStorage(64), PrioritizedSampler(64, 0.6, 0.4))
rb.extend({"x": torch.arange(40.0)})
rb.update_priority(torch.arange(40), torch.arange(40.0))
assert rb.sampler._trees.kernels == "torch", rb.sampler._trees.kernels
batch = rb.sample(32)
assert int(batch["index"].min()) >= 1  # slot 0 has priority 0 (eps=1e-8: never drawn here)
print("ok")
"""


def test_without_triton_the_torch_kernels_run_and_nothing_warns() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRITON], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok" and not done.stderr.strip()


def test_rbdata_triton_0_picks_the_torch_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prioritized_module, "_DEVICE_PATH_ON_CPU", True)
    monkeypatch.setenv("RBDATA_TRITON", "0")
    assert device_trees(PrioritizedSampler(16, 0.6, 0.4)).kernels == "torch"
    monkeypatch.delenv("RBDATA_TRITON")
    want = "triton" if triton_ready(torch.device("cpu")) else "torch"
    assert device_trees(PrioritizedSampler(16, 0.6, 0.4)).kernels == want
