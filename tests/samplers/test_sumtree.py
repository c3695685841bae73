"""Sum/min tree functions against brute force; numba kernels against the torch reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rbdata.samplers._trees import numba_kernels as _kernels
from rbdata.samplers._trees import sumtree as _sumtree

CAPACITIES = st.sampled_from([1, 2, 3, 5, 7, 8, 9, 13, 16, 31, 64, 65, 100, 513])


def _apply(ops: list[tuple[list[int], list[int]]], capacity: int, fast: bool) -> tuple:
    s = _sumtree.new_tree(capacity, "sum")
    m = _sumtree.new_tree(capacity, "min")
    for index, values in ops:
        idx = torch.tensor(index, dtype=torch.long)
        val = torch.tensor(values, dtype=torch.float64)
        if fast:
            _sumtree.update(s, idx, val, "sum")
            _sumtree.update(m, idx, val, "min")
        else:
            _sumtree.update_reference(s, idx, val, "sum")
            _sumtree.update_reference(m, idx, val, "min")
    return s, m


@st.composite
def update_sequences(draw: st.DrawFn) -> tuple[int, list[tuple[list[int], list[int]]]]:
    capacity = draw(CAPACITIES)
    ops = []
    for _ in range(draw(st.integers(1, 6))):
        index = draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=12))
        values = draw(st.lists(st.integers(0, 9), min_size=len(index), max_size=len(index)))
        ops.append((index, values))
    return capacity, ops


def _brute_force(capacity: int, ops: list[tuple[list[int], list[int]]]) -> list[float]:
    leaves = [0.0] * capacity
    written = [False] * capacity
    for index, values in ops:
        for i, v in zip(index, values, strict=True):  # sequential: last write wins
            leaves[i] = float(v)
            written[i] = True
    return [v if w else math.nan for v, w in zip(leaves, written, strict=True)]


CAPACITY_LIST = [1, 2, 3, 5, 7, 8, 9, 13, 16, 31, 64, 65, 100, 513]


def _check_internal_nodes(s: torch.Tensor, m: torch.Tensor) -> None:
    offsets = _sumtree.layout(s)
    for level in range(len(offsets) - 1):
        width = _sumtree.ARITY**level
        children_start = offsets[level + 1]
        for j in range(width):
            block_s = s[children_start + 8 * j : children_start + 8 * j + 8]
            block_m = m[children_start + 8 * j : children_start + 8 * j + 8]
            assert s[offsets[level] + j] == block_s.sum()
            assert m[offsets[level] + j] == block_m.min()


@settings(max_examples=150, deadline=None)
@given(update_sequences())
def test_roots_and_nodes_match_brute_force(case: tuple) -> None:
    capacity, ops = case
    expected = _brute_force(capacity, ops)
    for fast in (False, True):
        s, m = _apply(ops, capacity, fast)
        leaf0 = _sumtree.leaf_offset(s)
        values = [0.0 if math.isnan(v) else v for v in expected]
        assert s[leaf0 : leaf0 + capacity].tolist() == values
        assert float(s[_sumtree.ROOT]) == sum(values)
        written = [v for v in expected if not math.isnan(v)]
        assert float(m[_sumtree.ROOT]) == min(written)
        _check_internal_nodes(s, m)  # every internal node combines its 8 children


@pytest.mark.parametrize("capacity", CAPACITY_LIST)
def test_layout_aligns_children_to_cache_lines(capacity: int) -> None:
    tree = _sumtree.new_tree(capacity, "sum")
    offsets = _sumtree.layout(tree)
    assert offsets[0] == _sumtree.ROOT
    assert all(o % _sumtree.ARITY == 0 for o in offsets[1:])
    assert _sumtree.leaf_count(capacity) >= capacity
    assert tree.shape[0] == offsets[-1] + _sumtree.leaf_count(capacity)


@settings(max_examples=150, deadline=None)
@given(update_sequences(), st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=20))
def test_prefix_search_matches_cumsum(case: tuple, fractions: list[float]) -> None:
    capacity, ops = case
    s, _ = _apply(ops, capacity, fast=True)
    total = float(s[_sumtree.ROOT])
    if total == 0:
        return
    leaf0 = _sumtree.leaf_offset(s)
    leaves = s[leaf0 : leaf0 + capacity]
    cumsum = torch.cumsum(leaves, 0)
    targets = torch.tensor(fractions, dtype=torch.float64) * total
    expected = torch.searchsorted(cumsum, targets, right=True)
    assert _sumtree.find_reference(s, targets).tolist() == expected.tolist()
    assert _sumtree.find(s, targets).tolist() == expected.tolist()
    # a target rounded up to the total lands on the last positive slot, never on a zero
    edge = torch.tensor([total, total * (1 + 1e-12)], dtype=torch.float64)
    last_positive = int(torch.nonzero(leaves > 0).max())
    for found in (_sumtree.find(s, edge), _sumtree.find_reference(s, edge)):
        assert found.tolist() == [last_positive, last_positive]


def test_zero_slots_are_never_found() -> None:
    capacity = 1000
    s = _sumtree.new_tree(capacity, "sum")
    values = torch.zeros(capacity, dtype=torch.float64)
    values[::7] = torch.rand(len(values[::7]), dtype=torch.float64)
    _sumtree.update_reference(s, torch.arange(capacity), values, "sum")
    targets = torch.rand(100_000, dtype=torch.float64) * s[_sumtree.ROOT]
    found = _sumtree.find(s, targets)
    assert bool((values[found] > 0).all())
    torch.testing.assert_close(found, _sumtree.find_reference(s, targets), rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tree_matches_cpu() -> None:
    capacity = 10_007
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(capacity, (50_000,), generator=gen)
    val = torch.randint(0, 100, (50_000,), generator=gen).double()
    cpu = _sumtree.new_tree(capacity, "sum")
    gpu = _sumtree.new_tree(capacity, "sum", device="cuda")
    _sumtree.update(cpu, idx, val, "sum")
    _sumtree.update(gpu, idx.cuda(), val.cuda(), "sum")
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=0)
    targets = torch.rand(4096, generator=gen, dtype=torch.float64) * cpu[_sumtree.ROOT]
    torch.testing.assert_close(
        _sumtree.find(gpu, targets.cuda()).cpu(), _sumtree.find(cpu, targets)
    )


@settings(max_examples=100, deadline=None)
@given(
    update_sequences(),
    st.floats(0, 2),
    st.sampled_from([0.0, 1e-3]),
    st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=16),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_fused_kernels_match_the_reference(
    case: tuple, alpha: float, eps: float, fractions: list[float], dtype: torch.dtype
) -> None:
    capacity, ops = case

    def trees() -> tuple[torch.Tensor, torch.Tensor]:
        return (
            _sumtree.new_tree(capacity, "sum", dtype),
            _sumtree.new_block_min_tree(capacity, dtype),
        )

    fast, ref = trees(), trees()
    for index, values in ops:
        idx = torch.tensor(index, dtype=torch.long)
        prio = torch.tensor(values, dtype=torch.float64) / 3
        offsets = np.asarray(_sumtree.layout(fast[0]), dtype=np.int64)
        code, _, top = _kernels._nb_set_priorities(
            fast[0].numpy(),
            fast[1].numpy(),
            offsets,
            idx.numpy(),
            prio.numpy(),
            capacity,
            eps,
            alpha,
            float(torch.finfo(dtype).max),
            _sumtree.largest_base(float(torch.finfo(dtype).max), alpha),
        )
        assert code == 0 and top == float(prio.max())
        _sumtree.set_priorities_reference(ref[0], ref[1], idx, prio, eps, alpha)
        # float64 sums in the same order; ``p ** alpha`` of numba's libm and torch's may differ
        # by one ulp (seen: 3.0 ** 0.409...), so the trees agree to a few ulps, not in bits
        ulps = {"rtol": 8 * torch.finfo(torch.float64).eps, "atol": 0.0}
        torch.testing.assert_close(fast[0], ref[0], **ulps)
        torch.testing.assert_close(fast[1], ref[1], **ulps)  # minima of those values
        leaf0 = _sumtree.leaf_offset(ref[0])
        leaves = ref[0][leaf0 : leaf0 + capacity]
        positive = leaves[leaves > 0]
        expected_min = float(positive.min()) if positive.numel() else math.inf
        assert float(ref[1][_sumtree.ROOT]) == expected_min  # the smallest positive value
    if float(ref[0][_sumtree.ROOT]) > 0:
        targets = torch.tensor(fractions, dtype=torch.float64) * ref[0][_sumtree.ROOT]
        got, want = _sumtree.draw(*fast, targets, 0.4), _sumtree.draw_reference(*ref, targets, 0.4)
        assert torch.equal(got[0], want[0])
        torch.testing.assert_close(got[1], want[1], rtol=1e-12, atol=0.0)
