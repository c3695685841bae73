"""Index arithmetic and layout checks against brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbdata._core.index import as_index_tensor, as_int_index, normalize_int, ring_runs
from rbdata._core.layout import Layout


@given(capacity=st.integers(1, 64), data=st.data())
def test_ring_runs_match_brute_force(capacity: int, data: st.DataObject) -> None:
    cursor = data.draw(st.integers(0, capacity - 1))
    n = data.draw(st.integers(0, capacity))
    runs = ring_runs(cursor, n, capacity)
    assert len(runs) <= 2
    flat = [i for run in runs for i in range(run.start, run.stop)]
    assert flat == [(cursor + k) % capacity for k in range(n)]


@given(length=st.integers(1, 50), data=st.data())
def test_as_index_tensor_matches_python_indexing(length: int, data: st.DataObject) -> None:
    idx = data.draw(st.lists(st.integers(-length, length - 1), max_size=20))
    reference = list(range(length))
    expected = [reference[i] for i in idx]
    for form in (idx, torch.tensor(idx, dtype=torch.long), np.array(idx, dtype=np.int64)):
        assert as_index_tensor(form, length).tolist() == expected
    assert normalize_int(idx[0], length) == expected[0] if idx else True


@given(length=st.integers(0, 30), bad=st.integers(1, 100), negative=st.booleans())
def test_as_index_tensor_out_of_range(length: int, bad: int, negative: bool) -> None:
    index = -length - bad if negative else length + bad - 1
    with pytest.raises(IndexError, match=rf"index {index} is out of range .* length {length}"):
        as_index_tensor([0, index] if length else [index], length)


def test_as_index_tensor_rejects_non_integers() -> None:
    with pytest.raises(TypeError, match=r"^index: expected integers, got a boolean mask"):
        as_index_tensor(torch.tensor([True]), 3)
    with pytest.raises(
        TypeError, match=r"^index: expected integers, got a tensor of dtype float32$"
    ):
        as_index_tensor(torch.tensor([1.0]), 3)
    with pytest.raises(
        TypeError, match=r"^index: expected integers, got an array of dtype float64$"
    ):
        as_index_tensor(np.array([1.0]), 3)
    with pytest.raises(TypeError, match=r"^index: expected integers \(an int, .*\), got <object"):
        as_index_tensor(object(), 3)
    with pytest.raises(TypeError, match=r"^rows: expected integers"):
        as_index_tensor([0.5], 3, name="rows")


def test_layout_json_roundtrip_and_unknown_dtype() -> None:
    data = {"a": torch.zeros(2, 3, dtype=torch.uint8), "n": {"b": torch.zeros(2, dtype=torch.bool)}}
    layout = Layout.from_data(data, batched=True)
    assert Layout.from_json(layout.to_json()) == layout
    assert layout.item_nbytes == 3 + 1
    bad = layout.to_json()
    bad["leaves"][0]["dtype"] = "Tensor"
    with pytest.raises(ValueError, match="unknown dtype 'Tensor'"):
        Layout.from_json(bad)


def test_layout_errors_name_the_key() -> None:
    layout = Layout.from_data({"a": torch.zeros(2, 3), "b": torch.zeros(2)}, batched=True)
    with pytest.raises(
        ValueError, match=r"key 'b': expected batch size 4 like the other keys, got 5"
    ):
        layout.split({"a": torch.zeros(4, 3), "b": torch.zeros(5)}, batched=True)
    with pytest.raises(ValueError, match="expected a TensorDict or dict like the first write"):
        layout.split(torch.zeros(4, 3), batched=True)
    with pytest.raises(TypeError, match="key 'a': expected a numeric array"):
        layout.split({"a": np.array(["x"] * 4), "b": torch.zeros(4)}, batched=True)
    with pytest.raises(ValueError, match="key 'a': a batch needs a leading batch dimension"):
        Layout.from_data({"a": torch.tensor(1.0)}, batched=True)


@given(length=st.integers(0, 20), spare=st.integers(0, 20), data=st.data())
def test_write_indices_count_negatives_from_len_like_python(
    length: int, spare: int, data: st.DataObject
) -> None:
    # slots of a storage holding ``length`` items in ``length + spare`` slots: non-negative
    # up to the capacity, negative from ``length`` (what a Python list of the items does)
    capacity = max(1, length + spare)
    idx = data.draw(st.lists(st.integers(-length - 3, capacity + 2), max_size=12))
    items = list(range(length))
    valid = all(-length <= i < capacity for i in idx)
    for form in (idx, torch.tensor(idx, dtype=torch.long), np.array(idx, dtype=np.int64)):
        if valid:
            got = as_index_tensor(form, capacity, negative_base=length).tolist()
            assert got == [items[i] if i < 0 else i for i in idx]
        else:
            with pytest.raises(IndexError, match="out of range"):
                as_index_tensor(form, capacity, negative_base=length)


def test_as_int_index_takes_integer_scalars_only() -> None:
    for scalar in (2, np.int32(2), np.uint8(2), torch.tensor(2), np.array(2, dtype=np.int16)):
        assert as_int_index(scalar) == 2 and type(as_int_index(scalar)) is int
    for batch in ([2], (2,), torch.tensor([2]), np.array([2]), slice(2, 3)):
        assert as_int_index(batch) is None
    for other in (True, np.bool_(True), torch.tensor(True), torch.tensor(2.0), np.float64(2)):
        assert as_int_index(other) is None
