"""The fused Triton tree kernels against the numba kernels (issue 23).

Without a GPU the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set by the
tests' conftest), on CPU tensors; with one, on CUDA tensors. The expectations are independent
of the kernels: the numba kernels of ``_kernels`` (the CPU sampler), a brute-force
``last write wins`` dictionary, and ``_sumtree.rebuild`` (every inner node recomputed from the
leaves with the pairwise float64 sums).

- Trees: bit for bit the numba kernels' for the same updates (duplicates across programs,
  zeros, every capacity shape from one slot to several levels, float32 and float64). In the
  interpreter ``pow`` is numpy's (libm, as numba's), so leaves are equal too; on a GPU
  libdevice's ``pow`` may differ in the last float64 bit, so the leaves are compared to
  rounding and the inner nodes exactly against a rebuild from the kernels' own leaves.
- Draws: the same indices as the numba kernel for the same uniforms, weights within 1 ulp.
- Refusals: a bad call changes nothing, its first failing item is recorded, and the
  workspace (stamps, counts, marks) is back at rest after every call, refused or not.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rbdata.samplers._trees import numba_kernels as _kernels
from rbdata.samplers._trees import sumtree as _sumtree
from rbdata.samplers._trees.device import triton_ready

# marked ``cuda`` so that ``make test-cuda`` (``pytest -m cuda``) runs them on a GPU too; without
# one they run everywhere, in Triton's interpreter
pytestmark = pytest.mark.cuda

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
if not triton_ready(DEVICE):
    pytest.skip("triton is not installed (or not in interpreter mode)", allow_module_level=True)

from rbdata.samplers._trees import triton_ops as _triton_tree  # noqa: E402 - after the skip

EXACT_POW = _triton_tree.INTERPRET  # numpy's pow is libm's, as numba's


class Trees:
    """One pair of trees updated by the Triton kernels, one by the numba kernels."""

    def __init__(self, capacity: int, alpha: float, eps: float, dtype: torch.dtype) -> None:
        self.capacity, self.alpha, self.eps, self.dtype = capacity, alpha, eps, dtype
        self.vmax = float(torch.finfo(dtype).max)
        self.pmax = _sumtree.largest_base(self.vmax, alpha)
        self.sum = _sumtree.new_tree(capacity, "sum", dtype, DEVICE)
        self.min = _sumtree.new_block_min_tree(capacity, dtype, DEVICE)
        self.ref_sum = _sumtree.new_tree(capacity, "sum", dtype)
        self.ref_min = _sumtree.new_block_min_tree(capacity, dtype)
        self.workspace = _triton_tree.Workspace(self.sum, self.min)
        self.workspace.constants(eps, alpha, self.pmax, self.vmax)
        self.max_t = torch.ones((), dtype=torch.float64, device=DEVICE)
        self.err = torch.zeros(7, dtype=torch.float64, device=DEVICE)

    def update(self, index: torch.Tensor, priority: torch.Tensor, filled: int | None = None) -> int:
        """Both kernels; the numba kernel's refusal code (0: accepted)."""
        filled = self.capacity if filled is None else filled
        _triton_tree.update(
            self.sum,
            self.min,
            self.workspace,
            index.to(DEVICE),
            priority.to(DEVICE),
            filled=filled,
            alpha=self.alpha,
            max_t=self.max_t,
            err=self.err,
        )
        p = priority.double().expand(index.shape[0]).contiguous()
        code, _, _ = _kernels._nb_set_priorities(
            self.ref_sum.numpy(),
            self.ref_min.numpy(),
            np.asarray(_sumtree.layout(self.ref_sum), dtype=np.int64),
            index.numpy().astype(np.int64),
            p.numpy(),
            filled,
            self.eps,
            self.alpha,
            self.vmax,
            self.pmax,
        )
        return int(code)

    def check(self) -> None:
        got_sum, got_min = self.sum.cpu(), self.min.cpu()
        leaf0 = _sumtree.leaf_offset(got_sum)
        if EXACT_POW:
            assert torch.equal(got_sum, self.ref_sum), "sum tree differs from numba's"
            assert torch.equal(got_min, self.ref_min), "block-min tree differs from numba's"
        else:  # leaves to libdevice's pow rounding, inner nodes exactly from those leaves
            torch.testing.assert_close(got_sum[leaf0:], self.ref_sum[leaf0:], rtol=2e-7, atol=0)
        rebuilt_sum, rebuilt_min = got_sum.clone(), torch.full_like(got_min, math.inf)
        _sumtree.rebuild(rebuilt_sum, rebuilt_min)
        assert torch.equal(got_sum, rebuilt_sum), "inner sums are not the pairwise sums"
        assert torch.equal(got_min, rebuilt_min), "block minima are not the leaves' minima"
        ws = self.workspace
        assert bool((ws.stamp == -1).all()), "a slot stamp was left behind"
        assert not bool(ws.count.any()) and not bool(ws.touched.any()), "counts left behind"
        assert int(ws.done) == 0 and int(ws.acc_bad) == 2**62 and float(ws.acc_sum) == 0.0


SHAPES = [1, 5, 8, 9, 64, 65, 513, 4097]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("capacity", SHAPES)
def test_updates_build_the_numba_kernels_trees(capacity: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(capacity)
    trees = Trees(capacity, alpha=0.6, eps=1e-8, dtype=dtype)
    top = 1.0  # the initial highest priority
    for step in range(6):
        n = int(torch.randint(1, 600, (), generator=gen))  # several programs of 128 lanes
        index = torch.randint(capacity, (n,), generator=gen)  # duplicates across programs
        priority = torch.rand(n, generator=gen, dtype=torch.float64) * 5
        if step % 2:
            priority[torch.rand(n, generator=gen) < 0.4] = 0.0  # zeros: out of the block-min
        if step == 3:
            priority = priority.float()  # float32 priorities read as they are
        assert trees.update(index, priority) == 0
        trees.check()
        top = max(top, float(priority.max()))
    assert float(trees.err[0]) == 0.0
    assert float(trees.max_t) == top


def test_duplicates_last_write_wins_against_a_dictionary() -> None:
    capacity, n = 300, 1000
    gen = torch.Generator().manual_seed(3)
    trees = Trees(capacity, alpha=1.0, eps=0.0, dtype=torch.float64)
    index = torch.randint(0, 40, (n,), generator=gen)  # heavy duplication, spread over 8 blocks
    priority = torch.arange(n, dtype=torch.float64) + 1.0
    trees.update(index, priority)
    last = {int(i): float(p) for i, p in zip(index, priority, strict=True)}  # the last one wins
    leaves = trees.sum.cpu()[_sumtree.leaf_offset(trees.sum) :]
    for slot in range(capacity):
        assert float(leaves[slot]) == last.get(slot, 0.0)
    trees.check()


@pytest.mark.parametrize(("alpha", "beta"), [(0.6, 0.4), (1.0, 1.0), (0.0, 0.0), (0.7, 0.0)])
@pytest.mark.parametrize("stratified", [False, True])
@pytest.mark.parametrize("capacity", [1, 9, 4097])
def test_draws_are_the_numba_kernels_draws(
    capacity: int, alpha: float, beta: float, stratified: bool
) -> None:
    gen = torch.Generator().manual_seed(7)
    trees = Trees(capacity, alpha=alpha, eps=1e-8, dtype=torch.float32)
    n = min(capacity, 700)
    index = torch.randperm(capacity, generator=gen)[:n]
    priority = torch.rand(n, generator=gen, dtype=torch.float64) * 3
    priority[::5] = 0.0
    trees.update(index, priority)
    batch = 517
    u = torch.rand(batch, generator=gen, dtype=torch.float64)
    got_index, got_weight = _triton_tree.draw(
        trees.sum, trees.min, trees.workspace, u.to(DEVICE), beta, stratified, trees.err
    )
    targets = (torch.arange(batch, dtype=torch.float64) + u) / batch if stratified else u
    want_index, want_weight = _sumtree.draw(
        trees.ref_sum, trees.ref_min, targets * float(trees.ref_sum[_sumtree.ROOT]), beta
    )
    assert torch.equal(got_index.cpu(), want_index)
    got, want = got_weight.cpu(), want_weight  # within 1 ulp of float32
    assert bool(((got - want).abs() <= torch.finfo(torch.float32).eps * want.abs()).all())
    assert float(trees.err[0]) == 0.0


def test_uniforms_at_the_edges_take_the_last_positive_slot() -> None:
    trees = Trees(64, alpha=1.0, eps=0.0, dtype=torch.float32)
    trees.update(torch.tensor([3, 17, 40]), torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64))
    u = torch.tensor([0.0, 1.0 - 2**-53, 1.0, 0.999999999], dtype=torch.float64)
    got, _ = _triton_tree.draw(
        trees.sum, trees.min, trees.workspace, u.to(DEVICE), 0.0, False, trees.err
    )
    want, _ = _sumtree.draw(trees.ref_sum, trees.ref_min, u * float(trees.ref_sum[7]), 0.0)
    assert got.cpu().tolist() == want.tolist() and set(want.tolist()) <= {3, 17, 40}


BAD = [
    ("index past filled", [0, 12, 3], [1.0, 1.0, 1.0], 1, 12.0, 1.0),
    ("negative index", [0, -1], [1.0, 1.0], 1, -1.0, 1.0),
    ("nan", [0, 1, 2], [1.0, float("nan"), -1.0], 2, 1.0, float("nan")),
    ("inf", [0, 1], [float("inf"), 1.0], 2, 0.0, float("inf")),
    ("negative", [0, 1, 2], [1.0, 2.0, -0.5], 3, 2.0, -0.5),
    ("value overflow", [4, 5], [1.0, 1e30], 4, 5.0, 1e30),
    ("total overflow", [2, 2, 5], [2e38, 3e38, 3e38], 5, -1.0, 0.0),
]


@pytest.mark.parametrize(
    ("name", "index", "priority", "code", "at", "p"), BAD, ids=[b[0] for b in BAD]
)
def test_a_refused_update_changes_nothing_and_records_its_first_failing_item(
    name: str, index: list, priority: list, code: int, at: float, p: float
) -> None:
    alpha = 2.0 if name == "value overflow" else 1.0
    trees = Trees(16, alpha=alpha, eps=0.0, dtype=torch.float32)
    trees.update(torch.arange(10), torch.full((10,), 2.0, dtype=torch.float64), filled=10)
    before = trees.sum.clone(), trees.min.clone(), float(trees.max_t)
    ref_code = trees.update(torch.tensor(index), torch.tensor(priority, dtype=torch.float64), 10)
    assert ref_code == code  # the numba kernel refuses it for the same reason
    assert torch.equal(trees.sum, before[0]) and torch.equal(trees.min, before[1])
    assert float(trees.max_t) == before[2]
    record = trees.err.cpu().tolist()
    assert record[:3] == [1.0, float(code), at] and record[4] == 9.0
    assert record[3] == p or (math.isnan(p) and math.isnan(record[3]))
    trees.check()
    # only the first refusal is kept; an accepted call afterwards works and keeps it
    trees.update(torch.tensor([0]), torch.tensor([-3.0], dtype=torch.float64), 10)
    trees.update(torch.tensor([1]), torch.tensor([4.0], dtype=torch.float64), 10)
    assert trees.err.cpu().tolist()[:2] == [1.0, float(code)]
    assert float(trees.max_t) == 4.0
    trees.check()


def test_new_items_take_one_device_priority_for_every_slot() -> None:
    trees = Trees(200, alpha=0.5, eps=1e-8, dtype=torch.float32)
    trees.update(torch.tensor([0]), torch.tensor([9.0], dtype=torch.float64))
    slots = torch.arange(10, 170)
    _triton_tree.update(
        trees.sum,
        trees.min,
        trees.workspace,
        slots.to(DEVICE),
        trees.max_t.reshape(1),  # the scalar form: one priority for all (here 9.0, the max)
        filled=200,
        alpha=0.5,
        max_t=trees.max_t,
        err=trees.err,
    )
    want = torch.full((160,), 9.0, dtype=torch.float64)
    trees.update(slots, want, filled=200)  # the reference (the triton side writes it twice)
    trees.check()


def test_an_all_zero_tree_draws_slot_0_and_records_it() -> None:
    trees = Trees(32, alpha=1.0, eps=0.0, dtype=torch.float32)
    index, _ = _triton_tree.draw(
        trees.sum,
        trees.min,
        trees.workspace,
        torch.rand(5, dtype=torch.float64).to(DEVICE),
        0.4,
        False,
        trees.err,
    )
    assert index.cpu().tolist() == [0] * 5
    assert trees.err.cpu().tolist()[0] == 6.0


# --- the sampler on Triton trees against the sampler on numba trees ---------------------------
def same(want: torch.Tensor, got: torch.Tensor) -> None:
    """Bit for bit in the interpreter; to libdevice's ``pow`` rounding on a GPU."""
    if EXACT_POW:
        assert torch.equal(want, got)
    else:
        torch.testing.assert_close(got, want, rtol=2.0**-23, atol=0.0)


def test_random_sequences_match_the_numba_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adds, extends (the ring wraps), good and bad updates, draws, reset and state round trips
    in a random order: the same trees, draws and errors as the CPU sampler (the device one
    reports a bad call at ``check_errors``, the CPU one at once)."""
    from rbdata import PrioritizedSampler, ReplayBuffer, TensorStorage
    from rbdata.samplers import prioritized

    def build(device_path: bool) -> ReplayBuffer:
        monkeypatch.setattr(prioritized, "_DEVICE_PATH_ON_CPU", device_path and not CUDA)
        monkeypatch.setattr(prioritized, "_DEVICE_KERNELS", "triton" if device_path else None)
        sampler = PrioritizedSampler(
            70, 0.7, 0.5, generator=torch.Generator().manual_seed(5), dtype=torch.float32
        )
        storage = TensorStorage(70, device=DEVICE if device_path else "cpu")
        return ReplayBuffer(storage, sampler)

    cpu, dev = build(False), build(True)
    assert getattr(dev.sampler._trees, "kernels", None) == "triton"
    rng = np.random.default_rng(0)
    for _ in range(120):
        op = rng.integers(6)
        if op == 0:
            k = int(rng.integers(1, 30))
            for rb in (cpu, dev):
                rb.extend({"x": torch.arange(k, dtype=torch.float32)})
        elif op == 1:
            for rb in (cpu, dev):
                rb.add({"x": torch.tensor(1.0)})
        elif op == 2 and len(cpu):
            k = int(rng.integers(1, 200))
            index = torch.from_numpy(rng.integers(0, len(cpu), k))
            priority = torch.from_numpy(rng.random(k) * 4)
            bad = rng.integers(5)
            if bad == 1:
                priority[int(rng.integers(k))] = float(rng.choice([np.nan, -1.0, np.inf]))
            elif bad == 2:
                index[int(rng.integers(k))] = len(cpu) + int(rng.integers(3))
            try:
                cpu.update_priority(index, priority)
                cpu_error = None
            except ValueError as error:
                cpu_error = str(error)
            dev.update_priority(index, priority)
            if cpu_error is None:
                dev.sampler.check_errors()
            else:
                with pytest.raises(ValueError) as raised:
                    dev.sampler.check_errors()
                assert str(raised.value).startswith(cpu_error)
        elif op == 3 and len(cpu):
            a, b = cpu.sample(64), dev.sample(64)
            assert torch.equal(a["index"], b["index"].cpu())
            same(a["weight"], b["weight"].cpu())
        elif op == 4:
            state = dev.sampler.state_dict()
            dev.sampler.load_state_dict(state)
        else:
            want, got = cpu.sampler.state_dict(), dev.sampler.state_dict()
            same(want["sum_tree"], got["sum_tree"].cpu())
            same(want["min_tree"], got["min_tree"].cpu())
            assert want["max_priority"] == got["max_priority"]
