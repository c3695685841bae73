"""Each storage owns its persistence: the dump / check_dump / restore / describe hooks.

Checkpoints, ``rbdata inspect`` and ``convert`` only call these hooks (see
``tests/checkpoint/test_checkpoint.py``, ``tests/cli/test_cli_inspect.py``,
``tests/storages/test_convert.py`` for the end-to-end behaviour); here each hook is called
directly, for every storage class, and the result is compared with what was written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rbdata.checkpoint import _codec
from rbdata.errors import CheckpointError
from rbdata.storages import (
    ArrowStorage,
    FrameStackStorage,
    ListStorage,
    MemmapStorage,
    Storage,
    StorageInfo,
    TensorStorage,
    storage_kind,
    storage_kinds,
)
from rbdata.storages.base import SavedStorage

MAKERS = {
    "list": lambda: ListStorage(8),
    "tensor": lambda: TensorStorage(8),
    "memmap": lambda: MemmapStorage(8),
    "arrow": lambda: ArrowStorage(8, chunk_size=3),
}


def _batch(n: int, start: int = 0) -> TensorDict:
    obs = torch.arange(start, start + n, dtype=torch.float32).unsqueeze(-1).expand(n, 2)
    return TensorDict({"obs": obs.clone(), "act": torch.arange(start, start + n)}, [n])


def _filled(name: str) -> Storage:
    storage = MAKERS[name]()
    storage.set(slice(0, 8), _batch(8))
    storage.set(slice(0, 3), _batch(3, start=100))  # a ring writer wrapped around
    return storage


def _close(*storages: Any) -> None:
    for storage in storages:
        close = getattr(storage, "close", None)
        if close is not None:
            close()


def test_the_kinds_registry_names_the_on_disk_formats() -> None:
    kinds = {"memmap": MemmapStorage, "arrow": ArrowStorage, "frames": FrameStackStorage}
    assert storage_kinds() == kinds
    assert storage_kind("arrow") is ArrowStorage
    assert storage_kind(names={"frames.json", "steps", "frames"}) is FrameStackStorage
    assert storage_kind("list") is None
    assert storage_kind(names={"layout.json", "header.bin"}) is MemmapStorage
    assert storage_kind(names={"_rbdata.json"}) is ArrowStorage
    # both markers: a memmap directory first, as rbdata inspect always did
    assert storage_kind(names={"_rbdata.json", "layout.json"}) is MemmapStorage
    assert storage_kind(names={"notes.txt"}) is None


@pytest.mark.parametrize("name", list(MAKERS))
def test_dump_check_restore_describe_round_trip(tmp_path: Path, name: str) -> None:
    storage = _filled(name)
    cls = type(storage)
    tensors: list[torch.Tensor] = []
    directory = tmp_path / "storage"
    state, files = storage.dump(directory, _codec, tensors, fsync=False)
    for file, rec in files.items():  # the checksum entries name the files actually written
        assert (directory / file).stat().st_size == rec["size"]
    config = storage.config()
    meta_file = tmp_path / "checkpoint.json"
    plan = cls.check_dump(directory, config, state, meta_file)
    assert plan[0] == storage.capacity
    restored = cls.restore(SavedStorage(directory, config, state, _codec, tensors, plan))
    try:
        assert type(restored) is cls
        assert len(restored) == len(storage) and restored.next_slot == storage.next_slot
        assert (restored[:] == storage[:]).all()
        info, problems = cls.describe(directory, config, state, meta_file)
        assert isinstance(info, StorageInfo) and problems == []
        assert (info.capacity, info.length, info.next_slot) == (8, 8, 3)
        assert {k.key for k in info.keys} == {("obs",), ("act",)}
    finally:
        _close(storage, restored)


@pytest.mark.parametrize("name", list(MAKERS))
def test_dump_state_from_state_round_trip(name: str) -> None:
    storage = _filled(name)
    restored = type(storage).from_state(storage.config(), storage.dump_state(_codec), _codec)
    try:
        assert len(restored) == 8 and restored.next_slot == 3
        assert (restored[:] == storage[:]).all()
    finally:
        _close(storage, restored)


@pytest.mark.parametrize("name", list(MAKERS))
def test_copy_from_holds_exactly_the_source(name: str) -> None:
    src, dst = _filled(name), MAKERS[name]()
    dst.set(slice(0, 2), _batch(2, start=50))
    try:
        dst.copy_from(src)
        assert len(dst) == 8 and dst.next_slot == 3
        assert (dst[:] == src[:]).all()
    finally:
        _close(src, dst)


class _Bare(Storage):
    """A storage with no persistence hooks of its own."""

    def _allocate(self, layout: Any) -> None:
        pass

    def _write(self, index: Any, payload: list[Any]) -> None:
        pass

    def _write_one(self, index: int, payload: list[Any]) -> None:
        pass

    def _gather(self, idx: torch.Tensor, extra: Any) -> Any:
        return None

    def _get(self, index: int) -> Any:
        return None


def test_a_storage_without_hooks_is_refused_clearly(tmp_path: Path) -> None:
    bare = _Bare(4)
    with pytest.raises(TypeError, match="cannot checkpoint a _Bare"):
        bare.dump(tmp_path / "storage", _codec, [])
    with pytest.raises(TypeError, match="cannot checkpoint a _Bare"):
        bare.dump_state(_codec)
    with pytest.raises(CheckpointError, match="no restore rule for storage class _Bare"):
        _Bare.check_dump(tmp_path, {}, {}, tmp_path / "checkpoint.json")
    with pytest.raises(TypeError, match="_Bare cannot be made from another storage"):
        _Bare.empty_like(bare)
    assert not (tmp_path / "storage").exists()


def test_check_layout_and_empty_like_of_the_destinations(tmp_path: Path) -> None:
    ragged = ArrowStorage(6, chunk_size=2, ragged=["boxes"])
    ragged.set(slice(0, 2), {"boxes": [torch.ones(2, 4), torch.ones(1, 4)]})
    assert ragged.layout is not None
    with pytest.raises(TypeError, match="'boxes': MemmapStorage keeps fixed-shape tensors"):
        MemmapStorage.check_layout(ragged.layout)
    ArrowStorage.check_layout(ragged.layout)
    copy = ArrowStorage.empty_like(ragged, tmp_path / "copy")
    memmap = MemmapStorage.empty_like(ragged, tmp_path / "memmap")
    try:
        assert copy.config() == ragged.config() and len(copy) == 0
        assert copy.block_rows == 2 and memmap.block_rows is None
        assert memmap.capacity == 6 and memmap.path == tmp_path / "memmap"
    finally:
        _close(ragged, copy, memmap)


def test_arrow_abort_keeps_the_files_and_writes_nothing_more(tmp_path: Path) -> None:
    storage = ArrowStorage(8, path=tmp_path / "rb", chunk_size=4)
    storage.set(slice(0, 2), _batch(2))
    before = {p.name: p.read_bytes() for p in (tmp_path / "rb").iterdir()}
    storage.abort()
    with pytest.raises(ValueError, match="closed"):
        len(storage)
    del storage
    after = {p.name: p.read_bytes() for p in (tmp_path / "rb").iterdir()}
    assert after == before  # not flushed, not removed: the caller removes the directory
