"""How a :class:`~rbdata.storages.ListStorage` is saved: its items in the JSON state.

Rows of tensors are saved as one stacked tensor per leaf over the written slots (through the
checkpoint's codec, into its tensor file); any other objects through the codec's pickle-free
encoding (tensors, numbers, strings...).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rbdata._checked import check_int
from rbdata._layout import Layout
from rbdata.errors import CheckpointError
from rbdata.storages._describe import StorageInfo, key_infos
from rbdata.storages._persist import saved_counts
from rbdata.storages.base import Codec

if TYPE_CHECKING:
    from rbdata.storages.list import ListStorage

__all__ = ["describe_state", "list_state", "restore_list"]


def list_state(storage: ListStorage, codec: Codec, tensors: list[torch.Tensor]) -> dict[str, Any]:
    """The JSON state of ``storage`` (its tensors appended to ``tensors``)."""
    n = len(storage)
    items = storage._items[:n]
    layout = storage.layout
    state: dict[str, Any] = {"length": n, "next": storage.next_slot, "objects": storage._objects}
    if layout is None:
        state["items"] = codec.encode(items, tensors, "ListStorage items")
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
    state["present"] = codec.encode(torch.tensor(present, dtype=torch.long), tensors, "")
    state["leaves"] = codec.encode(leaves, tensors, "")
    return state


def restore_list(
    cls: type[ListStorage], config: dict[str, Any], state: Any, codec: Codec, tensors: list
) -> ListStorage:
    """Rebuild a ``cls`` from :func:`list_state`."""
    storage = cls(**config)  # allocates nothing: the item list grows on writes
    n, nxt = saved_counts(storage, state)
    items: list[Any] = []
    if "layout" in state:
        try:
            layout = Layout.from_json(state["layout"])
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"ListStorage: field 'layout': {err}") from err
        present_t = codec.decode(state.get("present"), tensors, "ListStorage")
        leaves = codec.decode(state.get("leaves"), tensors, "ListStorage")
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
        items = codec.decode(state.get("items"), tensors, "ListStorage items")
        if not isinstance(items, list) or len(items) != n:
            raise CheckpointError(f"ListStorage: field 'items' must hold {n} items")
    storage._objects = bool(state.get("objects"))
    if n:
        storage._items = items  # no padding to the capacity: writes extend the list
    storage._length, storage._next = n, nxt
    return storage


def describe_state(config: dict[str, Any], state: Any, file: Path) -> StorageInfo:
    """Counts and keys of a :func:`list_state` saved in metadata file ``file``."""
    capacity = check_int(config.get("max_size"), file, "storage.config.max_size", 1)
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: field 'storage.state' must be an object")
    length = check_int(state.get("length"), file, "storage.state.length", 0, capacity)
    nxt = check_int(state.get("next"), file, "storage.state.next", 0, capacity - 1)
    layout = None
    if "layout" in state:
        try:
            layout = Layout.from_json(state["layout"])
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise CheckpointError(f"{file}: field 'storage.state.layout': {err}") from None
    return StorageInfo("list", capacity, length, nxt, key_infos(layout))
