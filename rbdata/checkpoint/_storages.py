"""How each kind of storage is saved, restored and copied by checkpoints.

- Tensor storages (:class:`TensorStorage` on any device, :class:`MemmapStorage`) are saved
  as a :class:`MemmapStorage` directory: one raw file per leaf, written as whole arrays.
  Restoring maps the files copy-on-write (lazy; writes never reach the checkpoint); a CUDA
  storage is copied to its device.
- :class:`ArrowStorage` is flushed and its Arrow IPC files are copied; restoring copies them to
  a new directory of its own (in-place writes would otherwise change the checkpoint).
- :class:`ListStorage` items go through the pickle-free codec (tensors, numbers, strings...).
"""

from __future__ import annotations

import itertools
import math
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rbdata._atomic import fsync_dir
from rbdata._files import remove_with
from rbdata._layout import Layout
from rbdata.checkpoint._checksum import copy_with_crc, entry, file_entry, submit_tensor_crc
from rbdata.checkpoint._codec import decode, encode
from rbdata.checkpoint._storage_checks import ARROW_META, DIR, HEADER, LAYOUT, check_storage
from rbdata.checkpoint._validate import leaf_path, read_json
from rbdata.errors import CheckpointError
from rbdata.storages.arrow import ArrowStorage
from rbdata.storages.base import Storage
from rbdata.storages.convert import copy_rows
from rbdata.storages.list import ListStorage
from rbdata.storages.memmap import MemmapStorage
from rbdata.storages.memmap._directory import write_directory
from rbdata.storages.tensor import TensorStorage

__all__ = [
    "check_storage",
    "copy_storage",
    "dump_storage",
    "restore_storage",
    "storage_from_state",
    "storage_state",
]


def _check_supported(storage: Storage) -> None:
    if not isinstance(storage, (TensorStorage, ArrowStorage, ListStorage)):
        raise TypeError(
            f"cannot checkpoint a {type(storage).__name__}: checkpoints know TensorStorage, "
            "MemmapStorage, ArrowStorage and ListStorage (and their subclasses)"
        )


# --- ListStorage ---------------------------------------------------------------------------
def _list_state(storage: ListStorage, tensors: list[torch.Tensor]) -> dict[str, Any]:
    n = len(storage)
    items = storage._items[:n]
    layout = storage.layout
    state: dict[str, Any] = {"length": n, "next": storage.next_slot, "objects": storage._objects}
    if layout is None:
        state["items"] = encode(items, tensors, "ListStorage items")
        return state
    # rows of tensors: one stacked tensor per leaf over the written slots
    present = [i for i, row in enumerate(items) if row is not None]
    leaves = [
        torch.stack([items[i][k] for i in present])
        if present
        else torch.empty((0, *leaf.shape), dtype=leaf.dtype)
        for k, leaf in enumerate(layout.leaves)
    ]
    state["layout"] = layout.to_json()
    state["present"] = encode(torch.tensor(present, dtype=torch.long), tensors, "")
    state["leaves"] = encode(leaves, tensors, "")
    return state


def _counts(storage: Storage, state: Any) -> tuple[int, int]:
    """The saved length and next slot, checked against the capacity of ``storage``."""
    name = type(storage).__name__
    if not isinstance(state, dict):
        raise CheckpointError(f"{name}: the state must be an object")
    n, nxt = state.get("length"), state.get("next")
    if (
        not isinstance(n, int)
        or not isinstance(nxt, int)
        or isinstance(n, bool)
        or isinstance(nxt, bool)
        or not 0 <= n <= storage.capacity
        or not 0 <= nxt < storage.capacity
    ):
        raise CheckpointError(f"{name}: length {n!r:.40} / next slot {nxt!r:.40} out of range")
    return n, nxt


def _restore_list(cls: type[ListStorage], config: dict[str, Any], state: Any, tensors: list) -> Any:
    storage = cls(**config)  # allocates nothing: the item list grows on writes
    n, nxt = _counts(storage, state)
    items: list[Any] = []
    if "layout" in state:
        try:
            layout = Layout.from_json(state["layout"])
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"ListStorage: field 'layout': {err}") from err
        present_t = decode(state.get("present"), tensors, "ListStorage")
        leaves = decode(state.get("leaves"), tensors, "ListStorage")
        if (
            not isinstance(present_t, torch.Tensor)
            or present_t.dtype != torch.long
            or present_t.dim() != 1
        ):
            raise CheckpointError("ListStorage: field 'present' must be a 1-D LongTensor")
        present = present_t.tolist()
        m = len(present)
        ordered = all(a < b for a, b in itertools.pairwise(present))
        if not isinstance(leaves, list) or len(leaves) != len(layout.leaves) or not ordered:
            raise CheckpointError("ListStorage: the rows do not match the layout and length")
        if any(i < 0 or i >= n for i in present):
            raise CheckpointError(f"ListStorage: a present slot out of range [0, {n})")
        for leaf, data in zip(layout.leaves, leaves, strict=True):
            shape = (m, *leaf.shape)
            if not isinstance(data, torch.Tensor) or tuple(data.shape) != shape:
                raise CheckpointError(f"ListStorage: key {leaf.name}: expected shape {shape}")
            if data.dtype != leaf.dtype:
                raise CheckpointError(f"ListStorage: key {leaf.name}: expected {leaf.dtype}")
        items = [None] * n
        for j, i in enumerate(present):
            items[i] = [leaf[j] for leaf in leaves]
        storage._layout = layout
    else:
        items = decode(state.get("items"), tensors, "ListStorage items")
        if not isinstance(items, list) or len(items) != n:
            raise CheckpointError(f"ListStorage: field 'items' must hold {n} items")
    storage._objects = bool(state.get("objects"))
    if n:
        storage._items = items  # no padding to the capacity: writes extend the list
    storage._length, storage._next = n, nxt
    return storage


# --- files: dump and restore -------------------------------------------------------------
def _arrow_files(storage: ArrowStorage) -> list[Path]:
    """Flush ``storage``; return its metadata and chunk files (everything that holds data)."""
    storage.flush()
    return [
        file
        for file in sorted(storage.path.iterdir())
        if file.name.startswith("chunk-") or file.name == ARROW_META
    ]


def dump_storage(
    storage: Storage, root: Path, tensors: list[torch.Tensor], fsync: bool = True
) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
    """Write ``storage``'s data under checkpoint directory ``root``.

    Returns its JSON state and the checksum entries of the files written (names relative to
    ``root``), computed while writing.
    """
    _check_supported(storage)
    if isinstance(storage, ListStorage):
        return _list_state(storage, tensors), {}
    out = root / DIR
    sums: dict[str, dict[str, int]] = {}
    if isinstance(storage, ArrowStorage):
        out.mkdir()
        for file in _arrow_files(storage):
            sums[file.name] = copy_with_crc(file, out / file.name, fsync)
    else:
        assert isinstance(storage, TensorStorage)
        sums = _write_tensor_storage(storage, out, fsync)
    fsync_dir(out, fsync)
    return {"dir": DIR}, {f"{DIR}/{name}": rec for name, rec in sums.items()}


def _write_tensor_storage(
    storage: TensorStorage, out: Path, fsync: bool
) -> dict[str, dict[str, int]]:
    """``write_directory``, with the leaves' checksums summed from memory meanwhile."""
    n = len(storage)
    buffers = storage.buffers if storage.layout is not None else []
    # zlib releases the GIL: the sums run while write_directory copies and fsyncs
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = [submit_tensor_crc(pool, buf, n) for buf in buffers]
        write_directory(storage, out, fsync)
        crcs = [result() for result in results]
    names = read_json(out / LAYOUT, "storage").get("files", []) if buffers else []
    sums: dict[str, dict[str, int]] = {}
    for name, buf, crc in zip(names, buffers, crcs, strict=True):
        row = math.prod(buf.shape[1:]) * buf.element_size()
        sums[name] = entry((out / name).stat().st_size, n * row, crc)
    for file in sorted(out.iterdir()):  # header, layout and anything else: small, read back
        if file.name not in sums:
            sums[file.name] = file_entry(file)
    return sums


def _arrow_copy(cls: type[ArrowStorage], fill: Callable[[Path], None]) -> ArrowStorage:
    """Open an ArrowStorage in a new temporary directory of its own, filled by ``fill``."""
    own = Path(tempfile.mkdtemp(prefix="rbdata-arrow-"))
    try:
        fill(own)
        arrow = cls.open(own)
    except BaseException:
        shutil.rmtree(own, ignore_errors=True)
        raise
    arrow._finalizer = remove_with(arrow, own)
    return arrow


def _check_config(storage: Storage, config: dict[str, Any]) -> None:
    for key, value in storage.config().items():
        if key in config and config[key] != value and key != "device":
            raise CheckpointError(
                f"{type(storage).__name__}: the data has {key}={value!r}, the metadata says "
                f"{config[key]!r}"
            )


def _check_counts(storage: TensorStorage, src: Path) -> None:
    """The length and next slot of a just-opened storage, in range (closed if not)."""
    n, nxt, cap = len(storage), storage.next_slot, storage.capacity
    if not 0 <= n <= cap or not 0 <= nxt < cap or (n and storage.layout is None):
        storage.close()  # type: ignore[attr-defined]
        raise CheckpointError(
            f"{src / HEADER}: header length {n} / next slot {nxt} out of range for capacity {cap}"
        )


def restore_storage(
    cls: type[Storage], config: dict[str, Any], state: Any, root: Path, tensors: list, plan: Any
) -> Storage:
    """Rebuild a storage saved by :func:`dump_storage` under ``root``.

    ``plan`` is what :func:`check_storage` returned for it (which must have run first).
    """
    if issubclass(cls, ListStorage):
        return _restore_list(cls, config, state, tensors)
    src = root / DIR
    if issubclass(cls, ArrowStorage):
        names = plan[1]

        def copy(own: Path) -> None:  # only the files the metadata names, no symlink
            for name in names:
                copy_with_crc(src / name, own / name, fsync=False)

        storage: Storage = _arrow_copy(cls, copy)
    elif issubclass(cls, MemmapStorage):
        storage = cls.open(src, copy_on_write=True)
        _check_counts(storage, src)
    elif issubclass(cls, TensorStorage):
        mapped = MemmapStorage.open(src, copy_on_write=True)
        _check_counts(mapped, src)
        storage = cls(**config)
        _check_config(mapped, {"max_size": storage.capacity})
        layout = mapped.layout
        if layout is not None:
            buffers = [b.to(storage.device) for b in mapped.buffers]
            storage._set_buffers(buffers, layout)
            storage._layout = layout
        storage._length, storage._next = len(mapped), mapped.next_slot
    else:
        raise CheckpointError(f"no restore rule for storage class {cls.__name__}")
    _check_config(storage, config)
    return storage


# --- state dicts (small buffers, torch.save) -----------------------------------------------
def storage_state(storage: Storage) -> dict[str, Any]:
    """The state of ``storage`` as tensors and plain values (``weights_only``-loadable)."""
    _check_supported(storage)
    if isinstance(storage, ListStorage):
        tensors: list[torch.Tensor] = []
        return {"json": _list_state(storage, tensors), "tensors": tensors}
    if isinstance(storage, ArrowStorage):
        files = {
            file.name: torch.from_numpy(np.fromfile(file, dtype=np.uint8))
            for file in _arrow_files(storage)
        }
        return {"files": files}
    assert isinstance(storage, TensorStorage)
    n, layout = len(storage), storage.layout
    return {
        "length": n,
        "next": storage.next_slot,
        "layout": None if layout is None else layout.to_json(),
        "buffers": [b[:n].detach().cpu().clone() for b in storage.buffers],
    }


def storage_from_state(cls: type[Storage], config: dict[str, Any], state: Any) -> Storage:
    """Rebuild a storage from :func:`storage_state` (in memory or a temporary directory)."""
    if issubclass(cls, ListStorage):
        return _restore_list(cls, config, state["json"], list(state["tensors"]))
    if issubclass(cls, ArrowStorage):

        def write(own: Path) -> None:
            for name, data in state["files"].items():
                if not isinstance(name, str) or name.startswith("."):
                    raise CheckpointError(f"ArrowStorage: bad file name {name!r}")
                data.numpy().tofile(leaf_path(own, name, Path("state"), "files"))

        storage: Storage = _arrow_copy(cls, write)
        _check_config(storage, config)
        return storage
    storage = cls(**config)
    assert isinstance(storage, TensorStorage)
    n, nxt = _counts(storage, state)
    if state["layout"] is not None:
        layout = Layout.from_json(state["layout"])
        storage._ensure_layout(layout)
        for buf, data, leaf in zip(storage.buffers, state["buffers"], layout.leaves, strict=True):
            if tuple(data.shape) != (n, *leaf.shape) or data.dtype != leaf.dtype:
                raise CheckpointError(
                    f"{cls.__name__}: key {leaf.name}: {data.dtype} {tuple(data.shape)}, "
                    f"expected {leaf.dtype} {(n, *leaf.shape)}"
                )
            buf[:n].copy_(data)
    storage._set_length(n)
    storage._set_next(nxt)
    return storage


# --- copying into an existing storage --------------------------------------------------------
def copy_storage(src: Storage, dst: Storage) -> None:
    """Make ``dst`` (same class and capacity) hold exactly what ``src`` holds, slot by slot."""
    if dst.layout is not None and src.layout is not None and dst.layout != src.layout:
        raise ValueError(
            f"storage: the checkpoint's layout {src.layout} differs from this buffer's {dst.layout}"
        )
    n = len(src)
    if isinstance(src, ListStorage) and isinstance(dst, ListStorage):
        dst.clear()
        dst._items, dst._objects, dst._layout = list(src._items), src._objects, src._layout
    elif isinstance(src, TensorStorage) and isinstance(dst, TensorStorage):
        if src.layout is not None:
            dst._ensure_layout(src.layout)
            for d, s in zip(dst.buffers, src.buffers, strict=True):
                d[:n].copy_(s[:n])
    else:
        dst.clear()
        copy_rows(src, dst, n, getattr(src, "chunk_size", 1 << 16))
    dst._set_length(n)
    dst._set_next(src.next_slot)
