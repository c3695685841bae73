"""Issue 37 (5): torchrl 0.15's ``storage.as_dataset()`` and ``tensordict_collate`` port as is."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

import rbdata
from rbdata import ArrowStorage, ListStorage, MemmapStorage, TensorStorage, tensordict_collate
from rbdata.storages import FrameStackStorage, Storage


def _items(n: int) -> TensorDict:
    t = torch.arange(n)
    return TensorDict(
        {"obs": t.float().unsqueeze(1).repeat(1, 3), "t": t, ("next", "reward"): -t.float()},
        batch_size=[n],
    )


STORAGES: dict[str, Callable[[Path], Storage]] = {
    "tensor": lambda p: TensorStorage(64),
    "memmap": lambda p: MemmapStorage(64, path=p / "memmap"),
    "arrow": lambda p: ArrowStorage(64, chunk_size=8),
    "list": lambda p: ListStorage(64),
    "frames": lambda p: FrameStackStorage(64, 4),
}


@pytest.mark.parametrize("kind", list(STORAGES))
def test_as_dataset_is_the_storage(kind: str, tmp_path: Path) -> None:
    storage = STORAGES[kind](tmp_path)
    try:
        assert storage.as_dataset() is storage
        assert storage.as_dataset().as_dataset() is storage
    finally:
        close = getattr(storage, "close", None)
        if callable(close):
            close()


def test_as_dataset_of_a_closed_storage_raises(tmp_path: Path) -> None:
    storage = MemmapStorage(8, path=tmp_path / "closed")
    storage.close()
    with pytest.raises(ValueError, match="closed"):
        storage.as_dataset()


def _same(a: TensorDict, b: TensorDict) -> bool:
    keys = set(a.keys(True, True))
    return keys == set(b.keys(True, True)) and all(torch.equal(a[k], b[k]) for k in keys)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["tensor", "memmap"])
def test_dataloader_over_as_dataset_reads_every_item_once(
    kind: str, num_workers: int, tmp_path: Path
) -> None:
    n = 37  # not a multiple of the batch size: the last batch is short
    storage = STORAGES[kind](tmp_path)
    try:
        storage.set(slice(0, n), _items(n))
        loader = DataLoader(
            storage.as_dataset(),
            batch_size=8,
            shuffle=True,
            collate_fn=tensordict_collate,
            num_workers=num_workers,
        )
        for _ in range(2):  # two epochs
            batches = list(loader)
            assert [b.batch_size[0] for b in batches] == [8, 8, 8, 8, 5]
            assert all(isinstance(b, TensorDict) for b in batches)
            seen = torch.cat([b["t"] for b in batches])
            assert sorted(seen.tolist()) == list(range(n))  # every item exactly once
            for batch in batches:
                assert _same(batch, storage[batch["t"]])  # the values of direct indexing
    finally:
        close = getattr(storage, "close", None)
        if callable(close):
            close()


def test_dataloader_over_plain_tensors(tmp_path: Path) -> None:
    storage = TensorStorage(20)
    data = torch.arange(40.0).view(20, 2)
    storage.set(slice(0, 20), data)
    loader = DataLoader(
        storage.as_dataset(), batch_size=6, shuffle=True, collate_fn=tensordict_collate
    )
    batches = list(loader)
    rows = torch.cat(batches)
    assert [len(b) for b in batches] == [6, 6, 6, 2]
    assert sorted((rows[:, 0] // 2).long().tolist()) == list(range(20))
    for batch in batches:
        assert torch.equal(batch, storage[(batch[:, 0] // 2).long()])


def test_collate_of_single_tensordict_items_is_torch_stack() -> None:
    data = _items(5)
    items = [data[i] for i in range(5)]
    collated = tensordict_collate(items)
    assert isinstance(collated, TensorDict) and _same(collated, torch.stack(items))
    assert _same(collated, data)
    # the same with a dataset without __getitems__: DataLoader passes it single items
    stacked = list(DataLoader(items, batch_size=2, collate_fn=tensordict_collate))
    assert [b.batch_size[0] for b in stacked] == [2, 2, 1]
    assert _same(torch.cat(stacked), data)


def test_collate_of_single_tensors_stacks_them() -> None:
    rows = [torch.full((3,), float(i)) for i in range(4)]
    assert torch.equal(tensordict_collate(rows), torch.stack(rows))
    assert torch.equal(tensordict_collate(tuple(rows)), torch.stack(rows))


def test_collate_passes_a_gathered_batch_untouched() -> None:
    storage = TensorStorage(8)
    storage.set(slice(0, 8), _items(8))
    batch = storage[[3, 1, 4]]
    assert tensordict_collate(batch) is batch
    from rbdata.storages import _collate

    assert tensordict_collate(_collate.mark_for_default_collate(batch)) is batch


def test_list_storage_batches_are_not_collated_twice() -> None:
    storage = ListStorage(4)
    items: list[Any] = [[1, 2], [3, 4], [5, 6], [7, 8]]
    storage.set(slice(0, 4), items)
    loader = DataLoader(storage.as_dataset(), batch_size=4, collate_fn=tensordict_collate)
    (batch,) = list(loader)
    expected = storage[[0, 1, 2, 3]]
    assert type(batch) is type(expected) is list  # default_collate transposed the lists, once
    assert len(batch) == len(expected) and all(map(torch.equal, batch, expected))


def test_tensordict_collate_is_exported_lazily() -> None:
    assert "tensordict_collate" in rbdata.__all__
    from rbdata.storages import tensordict_collate as in_storages

    assert rbdata.tensordict_collate is in_storages is tensordict_collate
