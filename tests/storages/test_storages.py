"""The storage contract over every storage, plus storage-specific behaviour."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from storage_contract import StorageContract, assert_rows_are, transitions
from tensordict import TensorDict
from torch.utils.data import BatchSampler, DataLoader, default_collate
from torch.utils.data._utils.collate import default_collate_fn_map

from rbdata.storages import (
    ArrowStorage,
    ListStorage,
    MemmapStorage,
    Storage,
    TensorStorage,
    _collate,
)
from rbdata.storages.arrow import _chunks as arrow_chunks


class TestTensorStorage(StorageContract):
    def make(self, capacity: int) -> Storage:
        return TensorStorage(capacity)


class TestMemmapStorage(StorageContract):
    def make(self, capacity: int) -> Storage:
        return MemmapStorage(capacity)


class TestArrowStorage(StorageContract):
    gather_function = (arrow_chunks, "gather_rows")  # every fixed leaf in one kernel call
    gather_per_leaf = False

    def make(self, capacity: int) -> Storage:
        return ArrowStorage(capacity, chunk_size=3)  # small chunks: writes and reads cross them


class TestListStorage(StorageContract):
    vectorised = False

    def make(self, capacity: int) -> Storage:
        return ListStorage(capacity)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
@pytest.mark.parametrize("cls", [ListStorage, TensorStorage, MemmapStorage, ArrowStorage])
def test_capacity_must_be_positive_int(cls: type, bad: object) -> None:
    with pytest.raises(ValueError, match=rf"max_size must be a positive integer, got {bad!r}"):
        cls(bad)


def test_list_storage_keeps_arbitrary_objects() -> None:
    storage = ListStorage(4)
    storage.set([0, 1, 2], [{"a": 1}, "text", None])
    assert storage[0] == {"a": 1} and storage[1] == "text" and storage[2] is None
    assert storage[[1, 2]] == ["text", None]
    numbers = ListStorage(4)
    numbers.set([0, 1], [3, 4])
    torch.testing.assert_close(numbers[[1, 0]], torch.tensor([4, 3]))  # collated where possible


def test_list_storage_extend_with_list_of_tensordicts() -> None:
    storage = ListStorage(8)
    items = [transitions(1, i)[0] for i in range(3)]
    storage.set(slice(0, 3), items)
    assert_rows_are(storage[[2, 0]], [2, 0])


def test_tensor_storage_rejects_objects() -> None:
    with pytest.raises(TypeError, match=r"data must be a torch\.Tensor"):
        TensorStorage(4).set(0, "text")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tensor_storage_on_cuda() -> None:
    storage = TensorStorage(16, device="cuda")
    storage.set(slice(0, 8), transitions(8))
    batch = storage[torch.tensor([7, 1], device="cuda")]
    assert batch.device.type == "cuda" and batch["id"].device.type == "cuda"
    assert batch["id"].tolist() == [7, 1]


def test_default_collate_still_stacks_lists_of_tensors() -> None:
    rows = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])]
    torch.testing.assert_close(default_collate(rows), torch.stack(rows))
    gathered = torch.arange(6.0).view(3, 2)
    marked = _collate.mark_for_default_collate(gathered)
    assert default_collate(marked) is gathered  # a gathered batch passes through


def test_import_leaves_torch_collate_entries_alone() -> None:
    # a fresh interpreter: torch's entries for torch's own types, before and after the import
    code = textwrap.dedent(
        """
        from torch.utils.data._utils.collate import default_collate_fn_map as m
        torch_entries = dict(m)
        import tensordict  # registers entries for its own types
        before = dict(m)
        import rbdata
        from rbdata.storages import _collate
        assert {k: m[k] for k in torch_entries} == torch_entries, "torch's entry replaced"
        assert {k: m[k] for k in before} == before, "an entry was replaced"
        assert list(m)[: len(before)] == list(before), "entries were reordered"
        added = [k for k in m if k not in before]
        assert added == [_collate._FirstOfGathered], added
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _loader_batches(storage: Storage, **kwargs: Any) -> list[Any]:
    sampler = BatchSampler(list(range(len(storage)))[::-1], 3, drop_last=False)
    return list(DataLoader(storage, batch_sampler=sampler, **kwargs))


@pytest.mark.parametrize("make", [TensorStorage, ListStorage])
def test_default_collate_returns_the_gathered_batch_without_indexing_it(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = make(10)
    storage.set(slice(0, 10), transitions(10))
    # the marked batch's entry is taken, and TensorDict indexing never runs during collate
    calls = []
    entry = default_collate_fn_map[_collate._FirstOfGathered]
    monkeypatch.setitem(
        default_collate_fn_map,
        _collate._FirstOfGathered,
        lambda batch, **kw: calls.append(1) or entry(batch, **kw),
    )
    expected = [storage[idx] for idx in ([9, 8, 7], [6, 5, 4], [3, 2, 1], [0])]
    for kwargs in ({}, {"collate_fn": default_collate}):
        calls.clear()
        batches = _loader_batches(storage, **kwargs)
        assert len(calls) == len(expected)
        for got, want in zip(batches, expected, strict=True):
            assert type(got) is type(want)
            assert (got == want).all()
    # other collate functions get the plain batch, identical to an indexed read
    wrapped = _loader_batches(storage, collate_fn=lambda b: default_collate(b))
    identity = _loader_batches(storage, collate_fn=lambda b: b)
    for a, b, want in zip(wrapped, identity, expected, strict=True):
        assert type(a) is type(b) is type(want)
        assert (a == want).all() and (b == want).all()


def test_a_marked_batch_indexed_by_anything_else_reads_the_batch() -> None:
    storage = TensorStorage(6)
    storage.set(slice(0, 6), transitions(6))
    batch = storage[[5, 4, 3]]
    marked = _collate.mark_for_default_collate(batch)
    assert type(marked) is not TensorDict and len(marked) == 3
    for index, ids in ((1, 4), (slice(0, 2), [5, 4]), ("id", [5, 4, 3])):
        got = marked[index]
        got_ids = got if isinstance(got, torch.Tensor) else got["id"]
        assert got_ids.tolist() == ids
    # default_collate called on a marked batch directly returns the batch, plain
    out = default_collate(_collate.mark_for_default_collate(batch))
    assert out is batch and type(out) is TensorDict and out["id"].tolist() == [5, 4, 3]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_default_collate_returns_what_an_indexed_read_returns(num_workers: int) -> None:
    # whatever __getitems__ gathered comes back once, never collated a second time
    storage = ListStorage(6)
    items = [[1, 2], [3, 4], [5, 6], [7, 8]]  # default_collate transposes a batch of lists
    storage.set(slice(0, 4), items)
    sampler = BatchSampler([2, 0, 3, 1], 2, drop_last=False)
    loader = DataLoader(storage, batch_sampler=sampler, num_workers=num_workers)
    for got, idx in zip(loader, ([2, 0], [3, 1]), strict=True):
        want = storage[idx]
        assert type(got) is type(want) and len(got) == len(want) == 2
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
    tensors = TensorStorage(6)
    tensors.set(slice(0, 6), torch.arange(12.0).view(6, 2))
    got = list(DataLoader(tensors, batch_sampler=[[4, 1], [0]], num_workers=num_workers))
    assert [type(b) for b in got] == [torch.Tensor, torch.Tensor]
    assert torch.equal(got[0], tensors[[4, 1]]) and torch.equal(got[1], tensors[[0]])


def test_list_storage_batch_of_mixed_objects_comes_back_as_a_list() -> None:
    # default_collate raises KeyError (dicts with other keys) or ValueError (a number beside
    # a tensor) for these; the storage then returns the items as they are
    storage = ListStorage(4)
    storage.set([0, 1, 2, 3], [{"a": 1}, {"b": 2}, 3.25, torch.arange(3)])
    assert storage[[0, 1]] == [{"a": 1}, {"b": 2}]
    number, tensor = storage[[2, 3]]
    assert number == 3.25 and torch.equal(tensor, torch.arange(3))
