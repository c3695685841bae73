"""The storage contract over every storage, plus storage-specific behaviour."""

from __future__ import annotations

import pytest
import torch
from contracts import StorageContract, assert_rows_are, transitions

from rbdata.storages import ArrowStorage, ListStorage, MemmapStorage, Storage, TensorStorage
from rbdata.storages import arrow as arrow_module


class TestTensorStorage(StorageContract):
    def make(self, capacity: int) -> Storage:
        return TensorStorage(capacity)


class TestMemmapStorage(StorageContract):
    def make(self, capacity: int) -> Storage:
        return MemmapStorage(capacity)


class TestArrowStorage(StorageContract):
    gather_function = (arrow_module, "_gather_rows")  # every fixed leaf in one kernel call
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
    from torch.utils.data import default_collate

    rows = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])]
    torch.testing.assert_close(default_collate(rows), torch.stack(rows))
    gathered = torch.arange(6.0).view(3, 2)
    assert default_collate(gathered) is gathered  # a gathered batch passes through


def test_list_storage_batch_of_mixed_objects_comes_back_as_a_list() -> None:
    # default_collate raises KeyError (dicts with other keys) or ValueError (a number beside
    # a tensor) for these; the storage then returns the items as they are
    storage = ListStorage(4)
    storage.set([0, 1, 2, 3], [{"a": 1}, {"b": 2}, 3.25, torch.arange(3)])
    assert storage[[0, 1]] == [{"a": 1}, {"b": 2}]
    number, tensor = storage[[2, 3]]
    assert number == 3.25 and torch.equal(tensor, torch.arange(3))
