"""Issue 22 §4: what an ArrowStorage returns (strings included) it takes back as a write.

``rb.extend(rb.storage[[0, 1]])`` failed with "missing key 'text'": a gathered batch holds its
strings as a ``NonTensorStack`` (a TensorDict with no entries of its own), which the write path
walked into and lost. The same held for a TensorDict built from a list of ``str`` (its strings
were silently dropped from the layout). Expectations are the rows written, computed here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from rbdata import ListStorage, ReplayBuffer, TensorStorage
from rbdata.storages import ArrowStorage


def batch(ids: list[int]) -> dict[str, Any]:
    """Fixed, nested, ragged and string fields, each a function of the id."""
    return {
        "obs": torch.tensor([[i, -i] for i in ids], dtype=torch.float32).view(-1, 2),
        "next": {"reward": torch.tensor(ids, dtype=torch.float64)},
        "boxes": [torch.full((i % 3, 2), float(i)) for i in ids],
        "text": [f"say {i}" * (i % 3) for i in ids],
    }


def plain(data: Any) -> dict[str, list[Any]]:
    """Rows of a written dict or a read TensorDict as plain Python values, by key."""
    boxes = data["boxes"]
    boxes = list(boxes.unbind()) if isinstance(boxes, torch.Tensor) else boxes
    text = data["text"]
    return {
        "obs": data["obs"].tolist(),
        "reward": data["next"]["reward"].tolist(),
        "boxes": [b.tolist() for b in boxes],
        "text": list(text.tolist() if isinstance(text, NonTensorStack) else text),
    }


def concat(*parts: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {key: [v for part in parts for v in part[key]] for key in parts[0]}


@pytest.mark.parametrize("chunk_size", [2, 4, 64])
def test_a_returned_batch_with_strings_goes_back_in(chunk_size: int) -> None:
    rb = ReplayBuffer(ArrowStorage(64, chunk_size=chunk_size), batch_size=2)
    rb.extend(batch([0, 1, 2, 3, 4]))
    got = rb.storage[[0, 1]]
    assert plain(got) == plain(batch([0, 1]))
    assert rb.extend(got).tolist() == [5, 6]  # "missing key 'text'" before
    again = rb.storage[[5, 6]]
    assert plain(again) == plain(batch([0, 1]))
    assert rb.extend(again).tolist() == [7, 8]  # and once more, from what it returned
    every = rb.storage[torch.arange(9)]
    assert plain(every) == plain(batch([0, 1, 2, 3, 4, 0, 1, 0, 1]))
    rb.storage.close()


def test_a_returned_item_and_a_list_of_items_go_back_in() -> None:
    rb = ReplayBuffer(ArrowStorage(16, chunk_size=4))
    rb.extend(batch([0, 1, 2]))
    item = rb.storage[2]
    assert item["text"] == "say 2say 2"
    assert rb.add(item) == 3
    assert plain(rb.storage[torch.arange(4)]) == plain(batch([0, 1, 2, 2]))
    rb.storage.close()
    # a list of items is stacked into one batch (strings into a NonTensorStack)
    rb = ReplayBuffer(ArrowStorage(16, chunk_size=4))
    rb.extend({"obs": torch.arange(3.0), "text": ["a", "b", "c"]})
    assert rb.extend([rb.storage[2], rb.storage[0]]).tolist() == [3, 4]
    got = rb.storage[torch.arange(5)]
    assert got["obs"].tolist() == [0.0, 1.0, 2.0, 2.0, 0.0]
    assert got["text"].tolist() == ["a", "b", "c", "c", "a"]
    rb.storage.close()


def test_a_returned_batch_survives_a_reopen(tmp_path: Any) -> None:
    """Written through the journal and the chunk files: the strings are in both."""
    storage = ArrowStorage(16, path=tmp_path / "rb", chunk_size=4)
    storage.set(slice(0, 3), batch([0, 1, 2]))
    storage.set(slice(3, 6), storage[[2, 1, 0]])
    storage.close()
    again = ArrowStorage.open(tmp_path / "rb")
    assert plain(again[torch.arange(6)]) == plain(batch([0, 1, 2, 2, 1, 0]))
    again.close()


def test_a_tensordict_of_strings_keeps_its_strings() -> None:
    """``TensorDict({"text": [...]})`` holds a NonTensorStack: a string leaf, not dropped."""
    data = batch([0, 1, 2])
    td = TensorDict(data, batch_size=[3])
    assert isinstance(td.get("text"), NonTensorStack)
    storage = ArrowStorage(16, chunk_size=4)
    storage.set(slice(0, 3), td)
    assert storage.layout is not None
    assert ("text",) in storage.layout.keys
    assert plain(storage[[0, 1, 2]]) == plain(data)
    # a batch-wide non-tensor value (set_non_tensor) is the same string for every item
    more = TensorDict({"obs": torch.zeros(2, 2), "next": {"reward": torch.zeros(2)}}, [2])
    more["boxes"] = torch.nested.nested_tensor(
        [torch.zeros(1, 2), torch.zeros(0, 2)], layout=torch.jagged
    )
    more.set_non_tensor("text", "same")
    storage.set(slice(3, 5), more)
    assert storage[[3, 4]]["text"].tolist() == ["same", "same"]
    storage.close()


@pytest.mark.parametrize("make", [lambda: TensorStorage(8), lambda: ListStorage(8)])
def test_storages_without_strings_refuse_them_instead_of_dropping_them(make: Any) -> None:
    storage = make()
    td = TensorDict({"obs": torch.zeros(3, 2), "text": ["a", "b", "c"]}, batch_size=[3])
    with pytest.raises(TypeError, match=r"key 'text'.*got NonTensorStack.*ArrowStorage"):
        storage.set(slice(0, 3), td)
    assert len(storage) == 0 and storage.layout is None  # nothing written, nothing dropped
    storage.set(slice(0, 3), td.exclude("text"))  # the tensors alone are fine
    assert storage[[0, 1, 2]]["obs"].shape == (3, 2)
