"""``ListStorage``: a Python list of items of any type."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import default_collate

from rbdata._core.checked import check_int
from rbdata._core.layout import Layout
from rbdata._core.layout.keys import is_structured
from rbdata.errors import CheckpointError
from rbdata.storages._describe import StorageInfo, key_infos
from rbdata.storages._persist import saved_counts
from rbdata.storages.base import Codec, Prepared, SavedStorage, Storage, WriteTarget

__all__ = ["ListStorage"]


def _detached(obj: Any) -> Any:
    """``obj`` with tensors that require grad detached (inside tuples, lists, dicts too).

    Containers are rebuilt only where a tensor inside changed, so most objects are kept
    as they are (the same object).
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach() if obj.requires_grad else obj
    if type(obj) in (tuple, list):
        items = [_detached(x) for x in obj]
        if any(a is not b for a, b in zip(items, obj, strict=True)):
            return type(obj)(items)
    elif type(obj) is dict:
        values = {k: _detached(v) for k, v in obj.items()}
        if any(values[k] is not v for k, v in obj.items()):
            return values
    return obj


def _collate(items: list[Any]) -> Any:
    try:
        return default_collate(items)
    except (TypeError, RuntimeError, ValueError, KeyError, IndexError):
        return items


class ListStorage(Storage):
    """Items kept in a Python list: any object, no preallocation.

    Tensors, TensorDicts and dicts of tensors are validated against the layout of the first
    write like in the tensor storages and come back stacked; other objects are kept as they
    are and come back collated by :func:`torch.utils.data.default_collate` where it can
    (numbers, tuples of numbers), else as a list. An empty list is an empty batch: it
    writes nothing (the tensor storages refuse it with a message saying what to pass).

    Args:
        max_size: capacity in items.

    Examples:
        >>> storage = ListStorage(10)
        >>> storage.set([0, 1], ["a string", {"any": "object"}])
        >>> storage[1]
        {'any': 'object'}
    """

    #: Sparse tensors are refused, not densified: the storage keeps the given tensors and
    #: stacks them on reads, which a mix of layouts would break.
    _densify = False

    dump_adds_tensors = True  # its items' tensors join the checkpoint's state tensors

    def __init__(self, max_size: int) -> None:
        super().__init__(max_size)
        self._items: list[Any] = []
        self._objects = False
        # where the stored tensors are (the first write's device); later writes move there,
        # so that every batch stacks
        self._item_device: torch.device | None = None
        # writes against pickling: a pickle taken while another thread writes holds the
        # storage before or after each write, whole (never a dict changing under it)
        self._write_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        with self._write_lock:
            state = self.__dict__.copy()
            state["_items"] = list(self._items)
        del state["_write_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._write_lock = threading.Lock()

    def prepare(self, data: Any, batched: bool) -> Prepared:
        """Validate tensor-like data against the layout; take any other objects as they are.

        Tensors are detached from autograd (objects too: tensors inside tuples, lists and
        dicts), so the storage never holds the caller's graph. Tensor-like data must be
        stackable into batches: sparse, nested and ``meta`` tensors are refused.
        """
        self._check_open()
        if batched and isinstance(data, (list, tuple)) and not data:
            # a list is this storage's own batch of items: an empty one writes nothing (and
            # fixes nothing: the first real write still chooses objects or tensors)
            return Prepared([], 0, None, batched)
        if self._objects or (self._layout is None and not self._is_tensor_like(data, batched)):
            if not batched:
                return Prepared([_detached(data)], 1, None, batched)
            if not isinstance(data, Sequence) or isinstance(data, (str, bytes)):
                raise TypeError(
                    f"data: expected a sequence of items for a batch of objects, "
                    f"got {type(data).__name__}"
                )
            return Prepared([_detached(x) for x in data], len(data), None, batched)
        return super().prepare(data, batched)

    def _payload_device(self) -> torch.device | None:
        if self._item_device is None and self._layout is not None:  # e.g. restored items
            row = next((row for row in self._items if row is not None), None)
            if row:
                self._item_device = row[0].device
        return self._item_device

    @staticmethod
    def _is_tensor_like(data: Any, batched: bool) -> bool:
        if batched and isinstance(data, (list, tuple)):
            return bool(data) and is_structured(data[0])
        return is_structured(data)

    def commit(self, target: WriteTarget, prepared: Prepared) -> None:
        """Write prepared data; the first write of non-tensor objects fixes the object mode."""
        with self._write_lock:
            if self._layout is None and prepared.layout is None and prepared.n:
                self._objects = True
            super().commit(target, prepared)
            if self._item_device is None and prepared.layout is not None and prepared.payload:
                self._item_device = prepared.payload[0].device

    def _allocate(self, layout: Layout) -> None:
        pass

    def _rows(self, payload: list[Any], n: int, batched: bool) -> list[Any]:
        if self._objects or not payload:  # objects, or an empty list of items
            return payload
        layout = self._layout
        assert layout is not None
        casted = [t.to(dtype=leaf.dtype) for t, leaf in zip(payload, layout.leaves, strict=True)]
        if not batched:
            return [casted]
        return [[t[j] for t in casted] for j in range(n)]

    def _put(self, positions: list[int], rows: list[Any]) -> None:
        items = self._items
        if len(items) < self.capacity:
            items.extend([None] * (self.capacity - len(items)))
        for p, row in zip(positions, rows, strict=True):
            items[p] = row

    def _write(self, target: WriteTarget, payload: list[Any]) -> None:
        positions = target.positions()
        self._put(positions, self._rows(payload, len(positions), batched=True))

    def _write_one(self, index: int, payload: list[Any]) -> None:
        self._put([index], self._rows(payload, 1, batched=False))

    def gather(self, idx: torch.Tensor, extra: dict[str, torch.Tensor] | None) -> Any:
        """The objects at ``idx``: a list, or a stacked batch if the items have a layout."""
        rows = [self._items[i] for i in idx.tolist()]
        layout = self._layout
        if layout is None:
            return _collate(rows)
        if rows:
            tensors = [torch.stack([row[k] for row in rows]) for k in range(len(layout.leaves))]
        else:
            tensors = [torch.empty((0, *leaf.shape), dtype=leaf.dtype) for leaf in layout.leaves]
        if extra:
            extra = {key: value.cpu() for key, value in extra.items()}
        return layout.assemble(tensors, torch.Size((len(rows),)), None, extra)

    def _get(self, index: int) -> Any:
        row = self._items[index]
        layout = self._layout
        if layout is None:
            return row
        return layout.assemble(row, torch.Size(), None)

    def clear(self) -> None:
        """Forget all items and drop the references to them."""
        with self._write_lock:
            super().clear()
            self._items = []
            self._item_device = None

    # --- persistence: the items go into the checkpoint's JSON state ------------------------
    def _json_state(self, codec: Codec, tensors: list[torch.Tensor]) -> dict[str, Any]:
        """The JSON state of the items (their tensors appended to ``tensors``).

        Rows of tensors are saved as one stacked tensor per leaf over the written slots (through
        the checkpoint's codec, into its tensor file); any other objects through the codec's
        pickle-free encoding (tensors, numbers, strings...).
        """
        n = len(self)
        items = self._items[:n]
        layout = self.layout
        state: dict[str, Any] = {"length": n, "next": self.next_slot, "objects": self._objects}
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

    @classmethod
    def _from_json_state(
        cls, config: dict[str, Any], state: Any, codec: Codec, tensors: list
    ) -> ListStorage:
        """A new storage from :meth:`_json_state`."""
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

    def dump(
        self, directory: Path, codec: Codec, tensors: list[torch.Tensor], fsync: bool = True
    ) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
        """The items as a JSON state (tensors in ``tensors``); no file is written."""
        return self._json_state(codec, tensors), {}

    @classmethod
    def check_dump(
        cls, directory: Path, config: dict[str, Any], state: Any, meta_file: Path
    ) -> Any:
        """The capacity saved in ``config`` (the items are checked when restored)."""
        capacity = check_int(config.get("max_size"), f"{meta_file}", "storage.config.max_size", 1)
        return capacity, []

    @classmethod
    def restore(cls, saved: SavedStorage) -> ListStorage:
        """A new storage holding the items of the state."""
        config, state, codec, tensors = saved.config, saved.state, saved.codec, saved.tensors
        return cls._from_json_state(config, state, codec, tensors)

    def dump_state(self, codec: Codec) -> dict[str, Any]:
        """``{"json": the JSON state, "tensors": its tensors}``."""
        tensors: list[torch.Tensor] = []
        return {"json": self._json_state(codec, tensors), "tensors": tensors}

    @classmethod
    def from_state(cls, config: dict[str, Any], state: Any, codec: Codec) -> ListStorage:
        """A new storage holding the items of the state."""
        return cls._from_json_state(config, state["json"], codec, list(state["tensors"]))

    def copy_from(self, src: Storage) -> None:
        """The items of another ``ListStorage`` (the same objects), else rows as the base."""
        if not isinstance(src, ListStorage):
            super().copy_from(src)
            return
        self.clear()
        with self._write_lock:
            self._items, self._objects = list(src._items), src._objects
            self._layout = src._layout
            self._set_length(len(src))
            self._set_next(src.next_slot)
            self._items_written += len(src)

    @classmethod
    def describe(
        cls,
        directory: Path,
        config: dict[str, Any] | None = None,
        state: Any = None,
        meta_file: Path | None = None,
    ) -> tuple[StorageInfo, list[str]]:
        """Counts and keys of the JSON state saved in a checkpoint (``directory`` unread)."""
        file = meta_file if meta_file is not None else directory
        return _describe_state(config or {}, state, file), []


def _describe_state(config: dict[str, Any], state: Any, file: Path) -> StorageInfo:
    """Counts and keys of a ``ListStorage._json_state`` saved in metadata file ``file``."""
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
