"""ArrowStorage: zero-copy columns, ragged and string leaves, ring semantics, plain Arrow files.

The generic storage contract runs over ArrowStorage in ``test_storages.py``; this file covers
what only ArrowStorage does. Every expectation comes from an independent model: a per-id
record built in plain Python (:func:`expected`), the brute-force :func:`ring_model`, or the
files read back with pyarrow itself.
"""

from __future__ import annotations

import json
import pickle
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.ipc
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_contract import ring_model
from tensordict import TensorDict
from torch.utils.data import DataLoader

from rbdata import ReplayBuffer
from rbdata.storages import ArrowStorage

META = "_rbdata.json"
COLUMNS = ["id", "obs", "boxes", "text", "next.reward"]


# --- the reference model: every field of a record is a known function of its id -------------
def expected(i: int) -> dict[str, Any]:
    """The record with id ``i`` as plain Python values."""
    return {
        "id": i,
        "obs": [i + 0.0, i + 0.25, i + 0.5],
        "boxes": [[i * 10.0 + r + c / 4 for c in range(4)] for r in range(i % 4)],
        "text": f"item {i}" + "é" * (i % 3),  # non-ASCII: utf-8 in Arrow
        "next.reward": [i * 2.0],
    }


def batch_of(ids: list[int]) -> dict[str, Any]:
    """The records ``ids`` as a batch: ragged boxes as a list of tensors, text as a list."""
    records = [expected(i) for i in ids]
    return {
        "id": torch.tensor(ids, dtype=torch.int64),
        "obs": torch.tensor([r["obs"] for r in records], dtype=torch.float32).view(-1, 3),
        "boxes": [torch.tensor(r["boxes"], dtype=torch.float32).view(-1, 4) for r in records],
        "text": [r["text"] for r in records],
        "next": {"reward": torch.tensor([r["next.reward"] for r in records]).view(-1, 1)},
    }


def item_of(i: int) -> dict[str, Any]:
    """The record ``i`` as one item (no batch dimension)."""
    r = expected(i)
    return {
        "id": torch.tensor(i),
        "obs": torch.tensor(r["obs"]),
        "boxes": torch.tensor(r["boxes"], dtype=torch.float32).view(-1, 4),
        "text": r["text"],
        "next": {"reward": torch.tensor(r["next.reward"])},
    }


def check_item(item: Any, i: int) -> None:
    """``storage[int]``: tensors, the ragged field as a ``[L, 4]`` tensor, the text as a str."""
    r = expected(i)
    assert isinstance(item, TensorDict) and item.batch_size == ()
    assert int(item["id"]) == i
    assert item["obs"].tolist() == r["obs"]
    boxes = item["boxes"]
    assert type(boxes) is torch.Tensor and not boxes.is_nested
    assert boxes.shape == (i % 4, 4) and boxes.dtype == torch.float32
    assert boxes.tolist() == r["boxes"]
    assert item["text"] == r["text"] and type(item["text"]) is str
    assert item["next", "reward"].tolist() == r["next.reward"]


def check_batch(batch: Any, ids: list[int]) -> None:
    """A gathered batch: a jagged nested tensor for boxes, a ``NonTensorStack`` for text."""
    assert isinstance(batch, TensorDict) and batch.batch_size == (len(ids),)
    assert batch["id"].tolist() == ids
    assert batch["obs"].tolist() == [expected(i)["obs"] for i in ids]
    assert batch["next", "reward"].tolist() == [expected(i)["next.reward"] for i in ids]
    assert batch["text"].tolist() == [expected(i)["text"] for i in ids]
    if ids:
        boxes = batch["boxes"]
        assert boxes.is_nested and boxes.layout == torch.jagged
        rows = boxes.unbind()
        assert [tuple(b.shape) for b in rows] == [(i % 4, 4) for i in ids]
        assert [b.tolist() for b in rows] == [expected(i)["boxes"] for i in ids]


def check_all(storage: ArrowStorage, slot_ids: list[int | None]) -> None:
    """Every slot holds its model id, read item by item, as one batch and shuffled."""
    ids = [i for i in slot_ids if i is not None]
    assert len(storage) == len(ids) and slot_ids[: len(ids)] == ids  # filled from slot 0
    for slot, i in enumerate(ids):
        check_item(storage[slot], i)
    check_batch(storage.__getitems__(list(range(len(ids)))), ids)
    order = list(reversed(range(len(ids))))
    check_batch(storage[order], [ids[s] for s in order])


def chunk_files(path: Path) -> list[Path]:
    return sorted(path.glob("chunk-*.arrow"))


def snapshot(storage: ArrowStorage) -> tuple[Any, ...]:
    """Everything observable: length, cursor, layout, every item as Python, the files' bytes."""
    items = []
    for slot in range(len(storage)):
        item = storage[slot]
        items.append(
            {k: v if isinstance(v, str) else v.tolist() for k, v in item.items(True, True)}
        )
    files = {p.name: p.read_bytes() for p in storage.path.iterdir()}
    return len(storage), storage.next_slot, storage.layout, items, files


# --- 1. zero-copy columns ------------------------------------------------------------------
def test_column_views_the_mapped_arrow_buffer() -> None:
    storage = ArrowStorage(10, chunk_size=4)
    storage.set(slice(0, 10), batch_of(list(range(10))))
    storage.flush()
    for k, ids in enumerate([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]):
        batch = storage._cache.chunks[k].batch  # type: ignore[union-attr]
        assert batch.schema.names == COLUMNS
        for name in ("obs", "id"):
            column = storage.column(name, k)
            arrow = batch.column(batch.schema.get_field_index(name))
            values = arrow.flatten() if name == "obs" else arrow
            # the tensor starts at the Arrow values buffer of the memory-mapped record batch
            buffer = values.buffers()[1]
            assert column.data_ptr() == buffer.address + values.offset * column.element_size()
            assert np.shares_memory(column.numpy(), values.to_numpy(zero_copy_only=True))
            assert column.tolist() == [expected(i)[name] for i in ids]
        assert storage.column("text", k) == [expected(i)["text"] for i in ids]
        assert [b.tolist() for b in storage.column("boxes", k)] == [
            expected(i)["boxes"] for i in ids
        ]
        assert storage.column(("next", "reward"), k).tolist() == [
            expected(i)["next.reward"] for i in ids
        ]
    with pytest.raises(KeyError, match=r"no key \('nope',\)"):
        storage.column("nope")
    with pytest.raises(IndexError, match="chunk 3 holds no rows"):
        storage.column("obs", 3)
    storage.close()


# --- 2. ragged and string leaves -----------------------------------------------------------
def test_ragged_and_strings_across_chunks_and_single_items() -> None:
    storage = ArrowStorage(10, chunk_size=3)
    model: list[int | None] = [None] * 10
    storage.set(slice(0, 7), batch_of(list(range(7))))  # chunks 0, 1 and part of 2
    model[:7] = range(7)
    check_all(storage, model)
    storage.set(4, item_of(40))  # one item into the middle of a sealed chunk
    storage.set([8, 2, 5], batch_of([80, 20, 50]))  # scattered, three chunks
    model[4], model[8], model[2], model[5] = 40, 80, 20, 50
    model[7] = 7  # slot 7 was never written: the model gives it a placeholder id ...
    assert len(storage) == 9
    written = [s for s in range(9) if s != 7]
    for s in written:  # ... so slot 7 is left out of the comparison
        check_item(storage[s], model[s])  # type: ignore[arg-type]
    check_batch(storage[written[::-1]], [model[s] for s in written[::-1]])  # type: ignore[misc]
    storage.set(7, item_of(70))
    model[7] = 70
    check_all(storage, model)
    storage.flush()  # the same rows from the memory-mapped files
    check_all(storage, model)
    storage.set(slice(8, 10), batch_of([81, 91]))  # reopens a sealed chunk, fills the ring
    model[8:10] = [81, 91]
    check_all(storage, model)
    storage.close()


def jagged(ids: list[int]) -> torch.Tensor:
    return torch.nested.nested_tensor(batch_of(ids)["boxes"], layout=torch.jagged)


@pytest.mark.parametrize("flush", [False, True], ids=["in-memory", "flushed"])
def test_ragged_key_single_first_write_and_jagged_input(flush: bool) -> None:
    storage = ArrowStorage(6, chunk_size=2, ragged=("boxes",))
    storage.set(0, item_of(3))  # boxes [3, 4]: ragged (not a fixed [3, 4]) because of ragged=
    layout = storage.layout
    assert layout is not None
    leaf = layout.leaves[layout.keys.index(("boxes",))]
    assert (leaf.kind, leaf.shape, leaf.dtype) == ("ragged", (4,), torch.float32)
    storage.set(slice(1, 4), {**batch_of([5, 6, 9]), "boxes": jagged([5, 6, 9])})
    storage.set(4, item_of(2))  # an item of another length (2 rows)
    if flush:
        storage.flush()
    check_all(storage, [3, 5, 6, 9, 2, None])
    storage.close()


def test_jagged_nested_tensor_as_first_write() -> None:
    storage = ArrowStorage(5, chunk_size=2)
    storage.set(slice(0, 4), {**batch_of([1, 2, 3, 7]), "boxes": jagged([1, 2, 3, 7])})
    storage.flush()
    check_all(storage, [1, 2, 3, 7, None])
    storage.close()


def test_single_item_first_write_without_ragged_is_a_fixed_leaf() -> None:
    storage = ArrowStorage(4)
    storage.set(0, item_of(2))  # boxes [2, 4] and no ragged=: a fixed-shape leaf
    layout = storage.layout
    assert layout is not None
    leaf = layout.leaves[layout.keys.index(("boxes",))]
    assert (leaf.kind, leaf.shape) == ("tensor", (2, 4))
    assert leaf.kind == "tensor" and layout.leaves[layout.keys.index(("text",))].kind == "string"
    storage.close()


@settings(max_examples=25, deadline=None)
@given(
    capacity=st.integers(1, 9),
    chunk_size=st.integers(1, 4),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("one"), st.integers(0, 8)),
            st.tuples(st.just("batch"), st.lists(st.integers(0, 8), min_size=1, unique=True)),
            st.tuples(st.just("flush"), st.just(0)),
        ),
        min_size=1,
        max_size=8,
    ).filter(lambda ops: any(kind != "flush" for kind, _ in ops)),  # at least one write
)
def test_random_writes_match_a_per_slot_model(
    capacity: int, chunk_size: int, ops: list[tuple[str, Any]]
) -> None:
    storage = ArrowStorage(capacity, chunk_size=chunk_size, ragged=("boxes",))
    model: dict[int, int] = {}
    length, next_id, cursor = 0, 100, 0
    for kind, arg in ops:
        if kind == "flush":
            storage.flush()
            continue
        slots = [s % capacity for s in (arg if kind == "batch" else [arg])]
        slots = list(dict.fromkeys(slots))  # unique after the modulo
        ids = list(range(next_id, next_id + len(slots)))
        next_id += len(slots)
        if kind == "one":
            storage.set(slots[0], item_of(ids[0]))
        else:
            storage.set(slots, batch_of(ids))
        model.update(zip(slots, ids, strict=True))
        length = max(length, max(slots) + 1)
        # the ring's cursor moves only when the slots continue the ring at it
        if slots == [(cursor + j) % capacity for j in range(len(slots))]:
            cursor = (slots[-1] + 1) % capacity
        assert storage.next_slot == cursor
    assert len(storage) == length
    written = sorted(model)
    for s in written:
        check_item(storage[s], model[s])
    check_batch(storage.__getitems__(written[::-1]), [model[s] for s in written[::-1]])
    storage.flush()
    check_batch(storage[written], [model[s] for s in written])
    storage.close()


# --- 3. ring overwrite through a ReplayBuffer ----------------------------------------------
def ids_batch(start: int, n: int) -> dict[str, Any]:
    return batch_of(list(range(start, start + n)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), capacity=st.integers(1, 12), chunk_size=st.integers(1, 5))
def test_ring_keeps_exactly_the_newest_rows(
    data: st.DataObject, capacity: int, chunk_size: int
) -> None:
    sizes = data.draw(st.lists(st.integers(1, capacity), min_size=1, max_size=6))
    more = data.draw(st.integers(1, capacity))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rb"
        rb = ReplayBuffer(ArrowStorage(capacity, path=path, chunk_size=chunk_size))
        start = 0
        for size in sizes:
            rb.extend(ids_batch(start, size))
            start += size
        slots, cursor = ring_model(capacity, sizes)
        storage = rb.storage
        assert isinstance(storage, ArrowStorage)
        assert storage.next_slot == cursor
        check_all(storage, slots)  # before any flush: partly in memory
        storage.flush()
        check_all(storage, slots)
        storage.close()
        reopened = ArrowStorage.open(path)
        assert reopened.next_slot == cursor
        check_all(reopened, slots)
        again = ReplayBuffer(reopened)  # a new writer resumes at next_slot
        written = again.extend(ids_batch(start, more))
        assert written.tolist() == [(cursor + j) % capacity for j in range(more)]
        slots, cursor = ring_model(capacity, [*sizes, more])
        assert reopened.next_slot == cursor
        check_all(reopened, slots)
        reopened.close()


# --- 4. plain Arrow ------------------------------------------------------------------------
def rows_of(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


def expected_rows(ids: list[int]) -> list[dict[str, Any]]:
    return [expected(i) for i in ids]


@pytest.mark.parametrize("finish", ["flush", "close"])
def test_files_are_plain_arrow(tmp_path: Path, finish: str) -> None:
    path = tmp_path / "rb"
    rb = ReplayBuffer(ArrowStorage(10, path=path, chunk_size=4))
    rb.extend(ids_batch(0, 7))
    rb.extend(ids_batch(7, 6))  # wraps: slots 0..2 hold ids 10..12
    slots, _ = ring_model(10, [7, 6])
    storage = rb.storage
    n = len(storage)
    getattr(storage, finish)()
    assert sorted(p.name for p in path.iterdir()) == [
        "_holders.bin",  # who holds the directory (rbdata._core.holders); pyarrow skips it
        META,
        "chunk-000000.arrow",
        "chunk-000001.arrow",
        "chunk-000002.arrow",
    ]  # no temporary files left behind
    per_file = []
    for k, file in enumerate(chunk_files(path)):
        with pa.memory_map(str(file)) as source:
            reader = pa.ipc.open_file(source)
            assert reader.num_record_batches == 1
            table = reader.read_all()
        assert table.schema.names == COLUMNS
        assert rows_of(table) == expected_rows(slots[k * 4 : (k + 1) * 4])  # type: ignore[arg-type]
        per_file.append(table)
    schema = per_file[0].schema
    assert schema.field("id").type == pa.int64()
    assert schema.field("obs").type == pa.list_(pa.float32(), 3)  # fixed_size_list
    assert schema.field("boxes").type == pa.list_(pa.list_(pa.float32(), 4))
    assert schema.field("text").type == pa.string()
    dataset = pads.dataset(str(path), format="arrow")  # skips _rbdata.json by its name
    assert sorted(Path(f).name for f in dataset.files) == [
        f"chunk-00000{k}.arrow" for k in range(3)
    ]
    table = dataset.to_table()
    assert table.num_rows == n == 10
    assert sorted(rows_of(table), key=lambda r: r["id"]) == expected_rows(sorted(slots))  # type: ignore[arg-type]
    if finish == "flush":
        storage.close()


def test_partial_last_chunk_holds_only_filled_rows(tmp_path: Path) -> None:
    storage = ArrowStorage(10, path=tmp_path / "rb", chunk_size=4)
    storage.set(slice(0, 5), batch_of(list(range(5))))
    storage.flush()
    table = pads.dataset(str(tmp_path / "rb"), format="arrow").to_table()
    assert table.num_rows == len(storage) == 5
    assert sorted(rows_of(table), key=lambda r: r["id"]) == expected_rows(list(range(5)))
    storage.close()


# --- 5. reopen -----------------------------------------------------------------------------
def test_reopen_gives_same_items_layout_and_cursor(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    storage = ArrowStorage(10, path=path, chunk_size=3, ragged=("boxes",))
    storage.set(slice(0, 8), batch_of(list(range(8))))
    storage.set(5, item_of(55))
    before = snapshot(storage)
    layout, next_slot = storage.layout, storage.next_slot
    storage.close()
    assert path.is_dir()  # an explicit path is kept
    reopened = ArrowStorage.open(path)
    assert reopened.capacity == 10 and reopened.chunk_size == 3
    # set(5) replaced an item in place: the ring's cursor stays after the fill
    assert reopened.layout == layout and reopened.next_slot == next_slot == 8
    assert snapshot(reopened)[:4] == before[:4]
    check_all(reopened, [0, 1, 2, 3, 4, 55, 6, 7, None, None])
    reopened.set(slice(8, 10), batch_of([88, 99]))  # read/write
    reopened.close()
    again = ArrowStorage.open(path)
    assert again.next_slot == 0
    check_all(again, [0, 1, 2, 3, 4, 55, 6, 7, 88, 99])
    again.close()


def test_reopened_buffer_continues_the_ring(tmp_path: Path) -> None:
    rb = ReplayBuffer(ArrowStorage(10, path=tmp_path / "rb", chunk_size=4))
    rb.extend(ids_batch(0, 8))
    rb.extend(ids_batch(8, 5))  # wraps: the next slot is 3
    rb.storage.close()  # type: ignore[attr-defined]
    storage = ArrowStorage.open(tmp_path / "rb")
    again = ReplayBuffer(storage)
    assert again.extend(ids_batch(13, 2)).tolist() == [3, 4]
    assert again.add(item_of(15)) == 5
    slots, cursor = ring_model(10, [8, 5, 2, 1])
    assert storage.next_slot == cursor == 6
    check_all(storage, slots)
    storage.close()


def closed_storage(path: Path) -> None:
    storage = ArrowStorage(10, path=path, chunk_size=4)
    storage.set(slice(0, 9), batch_of(list(range(9))))
    storage.close()


def test_open_refuses_missing_chunk(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    closed_storage(path)
    (path / "chunk-000002.arrow").unlink()
    with pytest.raises(ValueError, match=r"chunk-000002\.arrow: missing; the metadata says 1 rows"):
        ArrowStorage.open(path)


def test_open_refuses_truncated_chunk(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    closed_storage(path)
    file = path / "chunk-000001.arrow"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{re.escape(str(file))}: not a readable Arrow"):
        ArrowStorage.open(path)


def test_open_refuses_chunk_with_fewer_rows(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    closed_storage(path)
    # a valid Arrow file, but 2 rows where the metadata says 4
    _rewrite_chunk(path / "chunk-000001.arrow", lambda table: table.slice(0, 2))
    with pytest.raises(ValueError, match=r"chunk-000001\.arrow: 2 rows, expected 4; truncated"):
        ArrowStorage.open(path)


def test_open_refuses_a_column_of_another_dtype(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    closed_storage(path)
    file = path / "chunk-000001.arrow"
    name = pa.ipc.open_file(str(file)).schema.names[0]
    # the same rows with the first column narrowed: the gather kernel must never see it
    _rewrite_chunk(file, lambda t: t.set_column(0, name, t[0].cast(_narrower(t[0].type))))
    with pytest.raises(ValueError, match=rf"chunk-000001\.arrow: column '{re.escape(name)}' holds"):
        ArrowStorage.open(path)


def _rewrite_chunk(file: Path, transform: Callable[[pa.Table], pa.Table]) -> None:
    """Replace a chunk file with a valid Arrow file holding ``transform`` of its table."""
    with pa.memory_map(str(file)) as source:
        table = transform(pa.ipc.open_file(source).read_all())
    with pa.OSFile(str(file), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def _narrower(arrow_type: pa.DataType) -> pa.DataType:
    if pa.types.is_fixed_size_list(arrow_type):
        return pa.list_(pa.int8(), arrow_type.list_size)
    return pa.int8()


def test_open_refuses_corrupt_or_foreign_metadata(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"is not a ArrowStorage: no _rbdata\.json"):
        ArrowStorage.open(tmp_path / "nothing")
    path = tmp_path / "rb"
    closed_storage(path)
    meta = json.loads((path / META).read_text())
    assert (meta["format"], meta["length"], meta["next"]) == ("rbdata.arrow", 9, 9)
    (path / META).write_text(json.dumps({**meta, "length": 11}))
    with pytest.raises(ValueError, match=r"length 11 / next slot 9 out of range"):
        ArrowStorage.open(path)
    (path / META).write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(ValueError, match=r"format version 99, expected 1"):
        ArrowStorage.open(path)
    (path / META).write_text(json.dumps({**meta, "format": "rbdata.memmap"}))
    with pytest.raises(ValueError, match=r"not an rbdata\.arrow directory"):
        ArrowStorage.open(path)
    (path / META).write_text("{not json")
    with pytest.raises(ValueError, match="corrupt metadata file"):
        ArrowStorage.open(path)


# --- 6. pickling and DataLoader workers ----------------------------------------------------
def test_pickle_roundtrip_with_ragged_and_strings() -> None:
    storage = ArrowStorage(10, chunk_size=3)
    storage.set(slice(0, 7), batch_of(list(range(7))))  # slot 6: only in memory until pickled
    payload = pickle.dumps(storage)
    assert len(payload) < 1_000  # the path, not the data
    clone = pickle.loads(payload)
    assert clone.path == storage.path and clone.next_slot == 7
    check_all(clone, [0, 1, 2, 3, 4, 5, 6, None, None, None])
    storage.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_over_ragged_and_strings(num_workers: int) -> None:
    storage = ArrowStorage(10, chunk_size=3)
    storage.set(slice(0, 10), batch_of(list(range(10))))
    loader = DataLoader(storage, batch_size=4, shuffle=True, num_workers=num_workers)
    seen = []
    for batch in loader:
        check_batch(batch, batch["id"].tolist())
        seen += batch["id"].tolist()
    assert sorted(seen) == list(range(10))
    storage.close()


# --- 7. bad input --------------------------------------------------------------------------
def replaced(key: str, value: Any) -> dict[str, Any]:
    return {**batch_of([50, 51]), key: value}


@pytest.mark.parametrize("flushed", [False, True], ids=["in-memory", "flushed"])
@pytest.mark.parametrize(
    ("index", "data", "error", "pattern"),
    [
        (
            slice(3, 5),
            replaced("boxes", [torch.ones(2, 4), torch.ones(1, 3)]),
            ValueError,
            r"'boxes': expected items of shape \[length, \*\[4\]\], got \[1, 3\]",
        ),
        (
            slice(3, 5),
            replaced("boxes", [torch.ones(2, 4), torch.tensor(1.0)]),
            ValueError,
            r"'boxes': expected items of shape \[length, \*\[4\]\], got \[\]",
        ),
        (
            slice(3, 5),
            replaced("boxes", torch.ones(2, 3, 4)),
            TypeError,
            r"'boxes': expected a list of tensors .* got Tensor",
        ),
        (
            slice(3, 5),
            replaced("boxes", [torch.ones(2, 4), torch.ones(1, 4, dtype=torch.complex64)]),
            TypeError,
            r"'boxes': expected dtype torch.float32 .* got torch.complex64",
        ),
        (
            slice(3, 5),
            replaced("text", ["fine", 7]),
            TypeError,
            r"'text': expected a list of str, got list",
        ),
        (
            slice(3, 5),
            replaced("text", "one string for two items"),
            TypeError,
            r"'text': expected a list of str, got str",
        ),
        (
            slice(3, 5),
            replaced("text", ["a", "b", "c"]),
            ValueError,
            r"'text': expected batch size 2 like the other keys, got 3",
        ),
        (
            slice(3, 5),
            replaced("id", torch.tensor([1.5, 2.5])),
            TypeError,
            r"'id': expected dtype torch.int64 .* got torch.float32",
        ),
        (
            slice(3, 5),
            replaced("obs", torch.zeros(2, 4)),
            ValueError,
            r"'obs': expected per-item shape \(3,\), got \(4,\)",
        ),
        (2, {**item_of(50), "text": 7}, TypeError, r"'text': expected a str, got int"),
        (
            2,
            {**item_of(50), "boxes": torch.ones(2, 5)},
            ValueError,
            r"'boxes': expected items of shape \[length, \*\[4\]\], got \[2, 5\]",
        ),
    ],
    ids=[
        "ragged-trailing-shape",
        "ragged-scalar",
        "ragged-dense-tensor",
        "ragged-dtype",
        "non-str",
        "str-for-batch",
        "string-batch-size",
        "fixed-dtype",
        "fixed-shape",
        "item-non-str",
        "item-ragged-shape",
    ],
)
def test_bad_write_leaves_storage_unchanged(
    flushed: bool, index: Any, data: Any, error: type, pattern: str
) -> None:
    storage = ArrowStorage(8, chunk_size=3)
    storage.set(slice(0, 5), batch_of([0, 1, 2, 3, 4]))
    if flushed:
        storage.flush()
    before = snapshot(storage)
    with pytest.raises(error, match=pattern):
        storage.set(index, data)
    assert snapshot(storage) == before
    check_all(storage, [0, 1, 2, 3, 4, None, None, None])
    storage.close()


@pytest.mark.parametrize("dtype", [torch.complex64, torch.bfloat16, torch.uint16])
@pytest.mark.parametrize("ragged", [False, True], ids=["fixed", "ragged"])
def test_unsupported_dtype_on_first_write(dtype: torch.dtype, ragged: bool) -> None:
    storage = ArrowStorage(8, chunk_size=3)
    value = torch.zeros(2, 3, dtype=dtype)
    data = {"ok": torch.zeros(2), "bad": list(value) if ragged else value}
    before = snapshot(storage)
    with pytest.raises(TypeError, match=rf"'bad': ArrowStorage cannot store dtype {dtype}"):
        storage.set(slice(0, 2), data)
    assert snapshot(storage) == before and storage.layout is None
    assert chunk_files(storage.path) == []
    storage.set(slice(0, 2), batch_of([0, 1]))  # the storage is still usable
    check_all(storage, [0, 1] + [None] * 6)
    storage.close()


# --- 8. dtypes -----------------------------------------------------------------------------
def test_small_dtypes_roundtrip(tmp_path: Path) -> None:
    gen = np.random.default_rng(0)
    n = 11
    ref = {
        "flag": gen.random((n, 5)) > 0.5,  # bool: 5 bits a row, rows not byte-aligned
        "half": gen.standard_normal((n, 2)).astype(np.float16),
        "i8": gen.integers(-128, 128, (n,), dtype=np.int8),
        "u8": gen.integers(0, 256, (n, 2, 2), dtype=np.uint8),
        "i16": gen.integers(-(2**15), 2**15, (n,), dtype=np.int16),
        "f64": gen.standard_normal((n, 1)),
    }
    masks = [gen.random((i % 3, 2)) > 0.5 for i in range(n)]  # a ragged bool leaf
    storage = ArrowStorage(16, path=tmp_path / "rb", chunk_size=4)
    storage.set(
        slice(0, n),
        {
            **{k: torch.from_numpy(v) for k, v in ref.items()},
            "mask": [torch.from_numpy(m) for m in masks],
        },
    )

    def check(s: ArrowStorage) -> None:
        order = list(range(n))[::-1]
        batch = s[order]
        for key, values in ref.items():
            assert batch[key].dtype == getattr(torch, str(values.dtype).replace("bool", "bool"))
            np.testing.assert_array_equal(batch[key].numpy(), values[order])
            np.testing.assert_array_equal(s[3][key].numpy(), values[3])
        for row, i in zip(batch["mask"].unbind(), order, strict=True):
            assert row.dtype == torch.bool
            np.testing.assert_array_equal(row.numpy(), masks[i])
        for k in range(3):
            rows = slice(k * 4, min(n, (k + 1) * 4))
            np.testing.assert_array_equal(s.column("flag", k).numpy(), ref["flag"][rows])
            np.testing.assert_array_equal(s.column("half", k).numpy(), ref["half"][rows])

    check(storage)
    storage.close()
    reopened = ArrowStorage.open(tmp_path / "rb")
    check(reopened)
    table = pads.dataset(str(tmp_path / "rb"), format="arrow").to_table()
    flags = sorted(
        zip(table.column("i16").to_pylist(), table.column("flag").to_pylist(), strict=True)
    )
    expected_flags = sorted(zip(ref["i16"].tolist(), ref["flag"].tolist(), strict=True))
    assert flags == expected_flags  # plain Arrow readers see the same bools
    reopened.close()


# --- 9. pyarrow is optional ----------------------------------------------------------------
def test_missing_pyarrow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'rbdata\[arrow\]'"):
        ArrowStorage(10)
    with pytest.raises(ImportError, match=r"pip install 'rbdata\[arrow\]'"):
        ArrowStorage.open("anywhere")


# --- 10. clear, paths, close ---------------------------------------------------------------
def test_clear_removes_chunk_files(tmp_path: Path) -> None:
    path = tmp_path / "rb"
    storage = ArrowStorage(10, path=path, chunk_size=3)
    storage.set(slice(0, 8), batch_of(list(range(8))))
    storage.flush()
    assert [p.name for p in chunk_files(path)] == [f"chunk-00000{k}.arrow" for k in range(3)]
    layout = storage.layout
    storage.clear()
    assert chunk_files(path) == [] and len(storage) == 0 and storage.next_slot == 0
    assert storage.layout == layout
    assert json.loads((path / META).read_text())["length"] == 0
    with pytest.raises(IndexError, match=r"index 0 .* length 0"):
        storage[0]
    storage.set(slice(0, 2), batch_of([5, 6]))  # usable after clear
    check_all(storage, [5, 6] + [None] * 8)
    storage.close()
    reopened = ArrowStorage.open(path)
    check_all(reopened, [5, 6] + [None] * 8)
    assert [p.name for p in chunk_files(path)] == ["chunk-000000.arrow"]
    reopened.close()


def test_explicit_path_with_data_is_refused(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"already holds data; reopen it with ArrowStorage"):
        ArrowStorage(4, path=tmp_path / "full")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["notes.txt"]  # untouched
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="already holds data"):
        ArrowStorage(4, path=tmp_path / "file")
    closed_storage(tmp_path / "rb")
    with pytest.raises(FileExistsError, match=r"ArrowStorage\.open\("):
        ArrowStorage(4, path=tmp_path / "rb")
    check_all(ArrowStorage.open(tmp_path / "rb"), [*range(9), None])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_chunk_size_must_be_positive_int(bad: Any) -> None:
    with pytest.raises(ValueError, match=rf"chunk_size must be a positive integer, got {bad!r}"):
        ArrowStorage(4, chunk_size=bad)


def test_chunk_size_is_capped_at_capacity() -> None:
    storage = ArrowStorage(5, chunk_size=100)
    assert storage.chunk_size == 5
    storage.close()


def test_close_removes_temporary_directory_and_refuses_reads() -> None:
    storage = ArrowStorage(10, chunk_size=3)
    storage.set(slice(0, 5), batch_of(list(range(5))))
    storage.flush()
    path = storage.path
    assert path.is_dir()
    storage.close()
    assert not path.exists()
    # the chunks are unmapped: a read must be an error, not a read of freed memory
    with pytest.raises(ValueError, match="the storage is closed"):
        storage[[0, 1]]
    with pytest.raises(ValueError, match="the storage is closed"):
        storage[0]
    with pytest.raises(ValueError, match="the storage is closed"):
        storage.set(0, item_of(9))
    storage.close()  # idempotent
