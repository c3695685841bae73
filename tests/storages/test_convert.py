"""convert: MemmapStorage <-> ArrowStorage (and TensorStorage ->), streamed block by block.

Expectations come from the reference data (``transitions`` ids through a brute-force ring
model) or from reads of the source, never from the conversion code.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset
import pytest
import torch
from storage_contract import assert_rows_are, ring_model, transitions

from rbdata import ReplayBuffer
from rbdata.storages import (
    ArrowStorage,
    ListStorage,
    MemmapStorage,
    Storage,
    TensorStorage,
    convert,
)

CAPACITY = 10
#: extends per fill: partial (7 of 10 slots), wrapped (full ring, next slot 3)
FILLS = {"partial": [4, 3], "wrapped": [8, 5]}


@pytest.fixture
def closing() -> Iterator[list[Any]]:
    """Storages appended here are closed after the test."""
    opened: list[Any] = []
    yield opened
    for storage in opened:
        storage.close()


def plain(n: int, start: int = 0) -> torch.Tensor:
    """Plain-tensor items whose values encode their id."""
    return torch.arange(start, start + n, dtype=torch.float32).view(n, 1, 1) * torch.ones(1, 2, 3)


def fill(storage: Storage, sizes: list[int], items: str) -> list[int | None]:
    """Extend through a ring buffer; the id each slot should hold."""
    rb = ReplayBuffer(storage)
    start = 0
    for size in sizes:
        rb.extend(transitions(size, start) if items == "tensordict" else plain(size, start))
        start += size
    slots, _ = ring_model(CAPACITY, sizes)
    return slots


def assert_same(storage: Storage, source: Storage, ids: list[int], items: str) -> None:
    """Every slot of ``storage`` equals the reference ids and an independent read of ``source``."""
    everything = list(range(len(source)))
    got, want = storage[everything], source[everything]
    if items == "tensordict":
        assert_rows_are(got, ids)
        assert set(got.keys(True, True)) == set(want.keys(True, True))
        for key in want.keys(True, True):
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
            assert got[key].dtype == want[key].dtype
    else:
        expected = torch.tensor(ids, dtype=torch.float32).view(-1, 1, 1) * torch.ones(1, 2, 3)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for i in (0, len(ids) - 1):  # single-item reads too
        if items == "tensordict":
            assert int(storage[i]["id"]) == ids[i]
        else:
            torch.testing.assert_close(storage[i], want[i])


@pytest.mark.parametrize("items", ["tensordict", "plain"])
@pytest.mark.parametrize("fill_name", list(FILLS))
def test_memmap_arrow_memmap_roundtrip(
    tmp_path: Path, closing: list[Any], fill_name: str, items: str
) -> None:
    sizes = FILLS[fill_name]
    src = MemmapStorage(CAPACITY, path=tmp_path / "src")
    closing.append(src)
    slots = fill(src, sizes, items)
    ids = [s for s in slots if s is not None]
    _, cursor = ring_model(CAPACITY, sizes)
    assert src.next_slot == cursor  # the wrapped case really wrapped: cursor 3, length 10
    if fill_name == "wrapped":
        assert len(src) == CAPACITY and cursor != 0

    arrow = convert(src, "arrow", tmp_path / "arrow", chunk_size=3)
    closing.append(arrow)
    assert isinstance(arrow, ArrowStorage)
    assert (arrow.capacity, len(arrow), arrow.next_slot) == (CAPACITY, len(ids), cursor)
    assert arrow.layout == src.layout
    assert arrow.chunk_size == 3
    assert_same(arrow, src, ids, items)

    back = convert(arrow, MemmapStorage, tmp_path / "back", chunk_size=4)
    closing.append(back)
    assert isinstance(back, MemmapStorage)
    assert (back.capacity, len(back), back.next_slot) == (CAPACITY, len(ids), cursor)
    assert back.layout == src.layout
    assert_same(back, src, ids, items)
    for buf, orig in zip(back.buffers, src.buffers, strict=True):  # untouched slots too
        assert torch.equal(buf, orig)


@pytest.mark.parametrize("kind", ["memmap", "arrow"])
def test_ring_writer_continues_on_the_converted_storage(
    tmp_path: Path, closing: list[Any], kind: str
) -> None:
    src = MemmapStorage(CAPACITY)
    closing.append(src)
    fill(src, [8, 5], "tensordict")  # next slot 3
    dst = convert(src, kind, tmp_path / "dst", chunk_size=4)
    closing.append(dst)
    rb = ReplayBuffer(dst)
    assert rb.extend(transitions(2, 13)).tolist() == [3, 4]
    slots, cursor = ring_model(CAPACITY, [8, 5, 2])
    assert_rows_are(dst[list(range(CAPACITY))], slots)  # type: ignore[arg-type]
    assert dst.next_slot == cursor == 5


def _spy_reads(monkeypatch: pytest.MonkeyPatch, storage: Storage) -> list[list[int]]:
    """Record the slots of every read of ``storage``; single-item reads fail the test."""
    reads: list[list[int]] = []
    cls = type(storage)
    real = cls.gather

    def gather(self: Any, idx: torch.Tensor, extra: Any) -> Any:
        if self is storage:
            reads.append(idx.tolist())
        return real(self, idx, extra)

    monkeypatch.setattr(cls, "gather", gather)
    monkeypatch.setattr(cls, "_get", lambda *a: pytest.fail("per-item read of the source"))
    return reads


def _spy_writes(monkeypatch: pytest.MonkeyPatch, cls: type[Storage]) -> list[int]:
    sizes: list[int] = []
    real = cls.commit

    def commit(self: Any, index: Any, prepared: Any) -> None:
        sizes.append(prepared.n)
        real(self, index, prepared)

    monkeypatch.setattr(cls, "commit", commit)
    return sizes


@pytest.mark.parametrize(
    ("src_kind", "dst_kind"), [("memmap", "arrow"), ("arrow", "memmap"), ("tensor", "arrow")]
)
def test_streams_blocks_of_at_most_chunk_size(
    monkeypatch: pytest.MonkeyPatch, closing: list[Any], src_kind: str, dst_kind: str
) -> None:
    src: Storage = {
        "memmap": lambda: MemmapStorage(CAPACITY),
        "arrow": lambda: ArrowStorage(CAPACITY, chunk_size=4),
        "tensor": lambda: TensorStorage(CAPACITY),
    }[src_kind]()
    if hasattr(src, "close"):
        closing.append(src)
    fill(src, [8, 5], "tensordict")
    reads = _spy_reads(monkeypatch, src)
    writes = _spy_writes(monkeypatch, MemmapStorage if dst_kind == "memmap" else ArrowStorage)
    dst = convert(src, dst_kind, chunk_size=3)
    closing.append(dst)
    assert reads, "no block reads"
    assert max(len(r) for r in reads) <= 3
    assert [s for r in reads for s in r] == list(range(CAPACITY))  # every slot once, in order
    assert writes and max(writes) <= 3 and sum(writes) == CAPACITY


def test_default_blocks_follow_the_arrow_chunks(
    monkeypatch: pytest.MonkeyPatch, closing: list[Any]
) -> None:
    src = ArrowStorage(CAPACITY, chunk_size=4)
    closing.append(src)
    fill(src, [8, 5], "tensordict")
    reads = _spy_reads(monkeypatch, src)
    for kind in ("memmap", "arrow"):
        dst = convert(src, kind)
        closing.append(dst)
        assert [len(r) for r in reads] == [4, 4, 2], kind  # one source chunk per read
        reads.clear()
    assert dst.chunk_size == 4  # type: ignore[union-attr]  # arrow -> arrow keeps the chunks


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"obs": torch.zeros(3, 2), "boxes": [torch.ones(i, 4) for i in (2, 0, 1)]}, "boxes"),
        ({"obs": torch.zeros(3, 2), "text": ["a", "bb", "ccc"]}, "text"),
    ],
    ids=["ragged", "string"],
)
@pytest.mark.parametrize("existing", [False, True], ids=["absent", "empty-dir"])
def test_variable_length_to_memmap_raises_before_writing(
    tmp_path: Path, closing: list[Any], data: dict[str, Any], key: str, existing: bool
) -> None:
    src = ArrowStorage(CAPACITY, chunk_size=2)
    closing.append(src)
    src.set(slice(0, 3), data)
    out = tmp_path / "out"
    if existing:
        out.mkdir()
    with pytest.raises(TypeError, match=rf"key '{key}'.*MemmapStorage"):
        convert(src, "memmap", out)
    if existing:
        assert list(out.iterdir()) == []
    else:
        assert not out.exists()
    assert len(src) == 3  # the source is untouched


def test_variable_length_arrow_to_arrow_keeps_ragged_and_strings(
    tmp_path: Path, closing: list[Any]
) -> None:
    boxes = [torch.arange(i * 4, dtype=torch.float32).view(i, 4) for i in (2, 0, 1, 3, 1)]
    text = ["go", "", "stop", "left", "right"]
    src = ArrowStorage(CAPACITY, chunk_size=2)
    closing.append(src)
    src.set(slice(0, 5), {"obs": torch.arange(5.0), "boxes": boxes, "meta": {"text": text}})
    dst = convert(src, "arrow", tmp_path / "dst", chunk_size=3)
    closing.append(dst)
    assert dst.layout == src.layout and (len(dst), dst.next_slot) == (5, 5)
    batch = dst[[4, 0, 1, 3]]
    assert batch["meta", "text"].tolist() == ["right", "go", "", "left"]
    for got, i in zip(batch["boxes"].unbind(), [4, 0, 1, 3], strict=True):
        assert torch.equal(got, boxes[i])
    assert batch["obs"].tolist() == [4.0, 0.0, 1.0, 3.0]


def test_converted_arrow_reopens(tmp_path: Path, closing: list[Any]) -> None:
    src = MemmapStorage(CAPACITY)
    closing.append(src)
    slots = fill(src, [8, 5], "tensordict")
    dst = convert(src, "arrow", tmp_path / "dst", chunk_size=4)
    closing.append(dst)
    # flushed by convert: a reading copy sees every row without closing the destination
    reopened = ArrowStorage.open(tmp_path / "dst", recover=False)
    closing.append(reopened)
    assert (len(reopened), reopened.next_slot, reopened.chunk_size) == (CAPACITY, 3, 4)
    assert reopened.layout == src.layout
    assert_rows_are(reopened[list(range(CAPACITY))], slots)  # type: ignore[arg-type]
    assert [int(v) for v in reopened.column("id", chunk=1)] == slots[4:8]
    table = pyarrow.dataset.dataset(tmp_path / "dst", format="arrow").to_table()
    assert table.column("id").to_pylist() == slots


def test_tensor_storage_source_and_memmap_reopen(tmp_path: Path, closing: list[Any]) -> None:
    src = TensorStorage(CAPACITY)
    slots = fill(src, [8, 5], "tensordict")
    dst = convert(src, "memmap", tmp_path / "dst", chunk_size=4)
    dst.close()
    reopened = MemmapStorage.open(tmp_path / "dst")
    closing.append(reopened)
    assert (len(reopened), reopened.next_slot) == (CAPACITY, 3)
    assert_rows_are(reopened[list(range(CAPACITY))], slots)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["memmap", "arrow"])
def test_empty_source(closing: list[Any], kind: str) -> None:
    src = MemmapStorage(CAPACITY)
    closing.append(src)
    dst = convert(src, kind)
    closing.append(dst)
    assert (len(dst), dst.next_slot, dst.capacity, dst.layout) == (0, 0, CAPACITY, None)


def test_temporary_destination_removed_on_close(closing: list[Any]) -> None:
    src = TensorStorage(CAPACITY)
    fill(src, [3], "plain")
    dst = convert(src, "arrow")
    path = dst.path
    assert path.is_dir()
    dst.close()
    assert not path.exists()


def test_bad_arguments(tmp_path: Path, closing: list[Any]) -> None:
    src = MemmapStorage(CAPACITY)
    closing.append(src)
    fill(src, [3], "plain")
    with pytest.raises(ValueError, match="dst_kind"):
        convert(src, "parquet")
    with pytest.raises(ValueError, match="dst_kind"):
        convert(src, TensorStorage)  # type: ignore[arg-type]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="chunk_size"):
            convert(src, "arrow", tmp_path / "x", chunk_size=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()
    with pytest.raises(TypeError, match="ListStorage"):
        convert(ListStorage(CAPACITY), "memmap")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        convert(src, "memmap", tmp_path / "full")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]


def test_unsupported_dtype_to_arrow_raises_before_writing(tmp_path: Path) -> None:
    src = TensorStorage(CAPACITY)
    src.set(slice(0, 2), {"x": torch.zeros(2, 3, dtype=torch.bfloat16)})
    with pytest.raises(TypeError, match=r"key 'x'.*bfloat16"):
        convert(src, "arrow", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_failure_midway_leaves_the_path_as_it_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, closing: list[Any]
) -> None:
    src = MemmapStorage(CAPACITY)
    closing.append(src)
    fill(src, [8], "tensordict")
    reads: list[list[int]] = []
    real = MemmapStorage.gather

    def failing(self: Any, idx: torch.Tensor, extra: Any) -> Any:
        if len(reads) >= 1:
            raise OSError("disk on fire")
        reads.append(idx.tolist())
        return real(self, idx, extra)

    monkeypatch.setattr(MemmapStorage, "gather", failing)
    for kind in ("memmap", "arrow"):
        reads.clear()
        with pytest.raises(OSError, match="disk on fire"):
            convert(src, kind, tmp_path / kind, chunk_size=3)
        assert not (tmp_path / kind).exists()
