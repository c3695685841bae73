"""Issue 22 §4: what an ArrowStorage returns (strings included) it takes back as a write.

``rb.extend(rb.storage[[0, 1]])`` failed with "missing key 'text'": a gathered batch holds its
strings as a ``NonTensorStack`` (a TensorDict with no entries of its own), which the write path
walked into and lost. The same held for a TensorDict built from a list of ``str`` (its strings
were silently dropped from the layout). Expectations are the rows written, computed here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
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


# --- model-based findings: a list of items with strings; the caller's ragged rows ----------


@pytest.mark.parametrize("chunk_size", [1, 4])
def test_a_list_of_item_dicts_with_strings_is_one_batch(chunk_size: int) -> None:
    """``extend([{..., "note": "a"}, ...])`` failed with "data must be ... got list"."""
    rb = ReplayBuffer(ArrowStorage(8, chunk_size=chunk_size))
    items = [
        {"obs": torch.full((2,), float(i)), "next": {"note": f"n{i}"}, "note": "ab"[i]}
        for i in range(2)
    ]
    assert rb.extend(items).tolist() == [0, 1]
    assert [rb.storage[i]["note"] for i in range(2)] == ["a", "b"]
    assert [rb.storage[i]["next", "note"] for i in range(2)] == ["n0", "n1"]
    assert rb.storage[[0, 1]]["obs"].tolist() == [[0.0, 0.0], [1.0, 1.0]]
    # and again once the layout is known, from TensorDict items too
    assert rb.extend([TensorDict(items[1], []), items[0]]).tolist() == [2, 3]
    got = rb.storage[torch.arange(4)]
    assert got["note"].tolist() == ["a", "b", "b", "a"]
    assert got["obs"][:, 0].tolist() == [0.0, 1.0, 1.0, 0.0]
    rb.storage.close()


def test_a_list_of_items_with_ragged_rows() -> None:
    """A ragged key's values become ragged rows; any other key must agree in shape."""
    items = [{"obs": torch.zeros(2), "tok": torch.arange(n)} for n in (3, 1, 2)]
    storage = ArrowStorage(8, chunk_size=4, ragged=["tok"])
    storage.set(slice(0, 3), items)
    assert [storage[i]["tok"].tolist() for i in range(3)] == [[0, 1, 2], [0], [0, 1]]
    storage.close()
    # declared ragged: a leaf of ragged rows even when the first items' lengths agree
    storage = ArrowStorage(8, chunk_size=4, ragged=["tok"])
    storage.set(slice(0, 2), [{"tok": torch.arange(2)}, {"tok": torch.ones(2, dtype=torch.long)}])
    assert storage.layout is not None and storage.layout.leaves[0].kind == "ragged"
    storage.set(slice(2, 4), [{"tok": torch.arange(1)}, {"tok": torch.arange(3)}])
    assert [storage[i]["tok"].tolist() for i in range(4)] == [[0, 1], [1, 1], [0], [0, 1, 2]]
    storage.close()
    # stored as ragged by an earlier batch: a later list of items is ragged rows too
    storage = ArrowStorage(8, chunk_size=4)
    storage.set(slice(0, 2), {"tok": [torch.arange(2), torch.arange(1)]})
    storage.set(slice(2, 4), [{"tok": torch.arange(3)}, {"tok": torch.arange(1)}])
    assert [storage[i]["tok"].tolist() for i in range(4)] == [[0, 1], [0], [0, 1, 2], [0]]
    storage.close()


def test_a_list_of_items_whose_undeclared_key_varies_is_refused_naming_it() -> None:
    storage = ArrowStorage(8, chunk_size=4)
    items = [{"obs": torch.zeros(2), "tok": torch.arange(n)} for n in (3, 1)]
    with pytest.raises(ValueError, match=r"item 1 .*key 'tok' has shape \(1,\).*ragged=\['tok'\]"):
        storage.set(slice(0, 2), items)
    mixed = [{"obs": torch.zeros(2), "note": "a"}, {"obs": torch.zeros(2), "note": torch.ones(1)}]
    with pytest.raises(ValueError, match=r"item 1 .*key 'note' is a Tensor, item 0 holds a str"):
        storage.set(slice(0, 2), mixed)
    with pytest.raises(ValueError, match=r"item 1 .*lacks key 'note'"):
        storage.set(slice(0, 2), [mixed[0], {"obs": torch.zeros(2)}])
    assert len(storage) == 0 and storage.layout is None  # nothing written
    storage.close()


def _mutate(value: Any) -> None:
    """Overwrite every element of the caller's rows (tensors, arrays or a list of them)."""
    for row in value if isinstance(value, list) else [value]:
        row[...] = -7


@pytest.mark.parametrize("kind", ["tensor", "numpy", "jagged"])
@pytest.mark.parametrize("write", ["extend", "set_slots", "add"])
def test_the_storage_copies_the_callers_rows(tmp_path: Any, kind: str, write: str) -> None:
    """Changing the input after the write changed the stored ragged row (and the file)."""
    path = tmp_path / "rb"
    rb = ReplayBuffer(ArrowStorage(8, path=path, chunk_size=4))
    rows = [[1, 2], [3]]
    tok: Any = [torch.tensor(r) for r in rows]
    if kind == "numpy":
        tok = [np.array(r) for r in rows]
    obs = np.zeros((2, 3), np.float32) if kind == "numpy" else torch.zeros(2, 3)
    text = ["a", "b"]
    # one row first (the layout), then rows 1 and 2: chunk 0 stays in memory, unsealed
    rb.extend({"obs": torch.ones(1, 3), "tokens": [torch.arange(1)], "text": ["x"]})
    data = {"obs": obs, "tokens": tok, "text": text}
    if kind == "jagged":
        data["tokens"] = torch.nested.nested_tensor(tok, layout=torch.jagged)
    if write == "extend":
        rb.extend(data)
    elif write == "set_slots":
        rb.storage.set([2, 1], data)  # slot by slot (the non-contiguous path)
    else:
        for i in range(2):
            rb.add({"obs": obs[i], "tokens": tok[i], "text": text[i]})
    _mutate(tok)
    if kind == "jagged":
        data["tokens"].values().fill_(-7)
    _mutate(obs)
    text[0] = "changed"
    expected = {"obs": [[0.0] * 3] * 2, "tokens": rows, "text": ["a", "b"]}

    slots = [2, 1] if write == "set_slots" else [1, 2]

    def stored(storage: Any) -> dict[str, Any]:
        got = storage[slots]
        return {
            "obs": got["obs"].tolist(),
            "tokens": [t.tolist() for t in got["tokens"].unbind()],
            "text": got["text"].tolist(),
        }

    assert stored(rb.storage) == expected
    rb.storage.close()
    again = ArrowStorage.open(path)
    assert stored(again) == expected  # what reached the chunk files
    again.close()


def test_stored_ragged_rows_are_read_only() -> None:
    """``column`` of a chunk held in memory gives the stored rows: they cannot be changed."""
    storage = ArrowStorage(8, chunk_size=4)
    storage.set(slice(0, 2), {"tok": [torch.arange(2), torch.arange(1)]})
    row = storage.column("tok")[0]
    with pytest.raises(ValueError, match="read-only"):
        row[0] = 5
    assert storage[0]["tok"].tolist() == [0, 1]
    storage.close()
