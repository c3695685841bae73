"""Sum/min tree functions against brute force; numba kernels against the torch reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rbdata.samplers import _sumtree

CAPACITIES = st.sampled_from([1, 2, 3, 5, 7, 8, 13, 16, 31, 64, 100])


def _apply(ops: list[tuple[list[int], list[int]]], capacity: int, fast: bool) -> tuple:
    s = _sumtree.new_tree(capacity, "sum")
    m = _sumtree.new_tree(capacity, "min")
    for index, values in ops:
        idx = torch.tensor(index, dtype=torch.long)
        val = torch.tensor(values, dtype=torch.float64)
        if fast:
            _sumtree.update_pair(s, m, idx, val, val)
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


@settings(max_examples=150, deadline=None)
@given(update_sequences())
def test_roots_and_nodes_match_brute_force(case: tuple) -> None:
    capacity, ops = case
    expected = _brute_force(capacity, ops)
    for fast in (False, True):
        s, m = _apply(ops, capacity, fast)
        p = _sumtree.leaf_count(capacity)
        values = [0.0 if math.isnan(v) else v for v in expected]
        assert s[p : p + capacity].tolist() == values
        assert float(s[1]) == sum(values)
        written = [v for v in expected if not math.isnan(v)]
        assert float(m[1]) == min(written)
        for node in range(1, p):  # every internal node combines its children
            assert s[node] == s[2 * node] + s[2 * node + 1]
            assert m[node] == min(m[2 * node], m[2 * node + 1])


@settings(max_examples=150, deadline=None)
@given(update_sequences(), st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=20))
def test_prefix_search_matches_cumsum(case: tuple, fractions: list[float]) -> None:
    capacity, ops = case
    s, _ = _apply(ops, capacity, fast=True)
    total = float(s[1])
    if total == 0:
        return
    p = _sumtree.leaf_count(capacity)
    leaves = s[p : p + capacity]
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
    targets = torch.rand(100_000, dtype=torch.float64) * s[1]
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
    targets = torch.rand(4096, generator=gen, dtype=torch.float64) * cpu[1]
    torch.testing.assert_close(
        _sumtree.find(gpu, targets.cuda()).cpu(), _sumtree.find(cpu, targets)
    )
