"""A list of items into one batch for :class:`~rbdata.storages.ArrowStorage`.

The other storages stack a list of items with ``torch.stack`` (every leaf a fixed-shape
tensor). An ArrowStorage also keeps strings and ragged tensors, so its items are stacked leaf
by leaf: a key whose values are all ``str`` becomes a list of ``str`` (a string leaf), a
ragged key a list of tensors (a ragged leaf), and every other key a stacked tensor.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from rbdata._core.layout import RAGGED, TENSOR, Key, Layout, Leaf, flatten, nest
from rbdata._core.layout.keys import key_name, non_tensor_value
from rbdata._core.layout.values import EMPTY_BATCH, explain_items, to_tensor
from rbdata.storages.arrow._checks import TORCH_TO_NUMPY

__all__ = [
    "Columns",
    "fixed_array",
    "fixed_arrays",
    "is_item_list",
    "load_pyarrow",
    "owned_row",
    "ragged_array",
    "ragged_rows",
    "stack_variable_items",
    "variable_values",
]


def load_pyarrow() -> Any:
    """``pyarrow`` with its ``compute`` and ``ipc`` modules, or an error naming the extra."""
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.ipc
    except ImportError as err:  # pragma: no cover - the test environment has pyarrow
        raise ImportError("ArrowStorage needs pyarrow: pip install 'rbdata[arrow]'") from err
    return pyarrow


def is_item_list(data: Any) -> bool:
    """Whether ``data`` is a non-empty list (or tuple) of dict-like items."""
    return (
        isinstance(data, (list, tuple))
        and bool(data)
        and isinstance(data[0], (Mapping, TensorDictBase))
    )


def stack_variable_items(items: Sequence[Any], ragged: Collection[Key]) -> dict[str, Any]:
    """Stack unbatched dict-like items into one batch (a nested dict), leaf by leaf.

    Args:
        items: dicts or TensorDicts, one per item, with the same keys.
        ragged: keys whose first dimension varies per item: their values become a list of
            tensors (one per item, a ragged row each) even where the lengths happen to agree.

    Raises:
        ValueError: for an empty list, items whose keys differ, a key that is a ``str`` in
            some items and not in others, or a key not in ``ragged`` whose shapes differ
            (the error names the item and the key, and says to declare it ragged).
        TypeError: for values that are neither tensors, arrays, numbers nor ``str``.
    """
    if not items:
        raise ValueError(EMPTY_BATCH)
    flats = [flatten(item)[1] for item in items]
    keys = list(flats[0])
    if any(len(flat) != len(keys) or any(k not in flat for k in keys) for flat in flats):
        explain_items(flats)  # names the first item and key that differ
    pairs: list[tuple[Key, Any]] = []
    for key in keys:
        values = [non_tensor_value(flat[key]) for flat in flats]
        strings = [isinstance(v, str) for v in values]
        if all(strings):
            pairs.append((key, values))
            continue
        if any(strings):
            i = strings.index(not strings[0])
            given, first = type(values[i]).__name__, type(values[0]).__name__
            raise ValueError(
                f"item {i} of the list: key {key_name(key)} is a {given}, item 0 holds a "
                f"{first}; a key holds a str in every item or in none"
            )
        name = key_name(key)
        tensors = [to_tensor(v, name) for v in values]
        if key in ragged:
            pairs.append((key, tensors))  # ragged rows, checked by the layout's split
            continue
        for i, t in enumerate(tensors[1:], start=1):
            if t.shape != tensors[0].shape:
                raise ValueError(
                    f"item {i} of the list: key {name} has shape {tuple(t.shape)}, item 0 has "
                    f"{tuple(tensors[0].shape)}; items of a batch need equal shapes, except "
                    f"in ragged keys (declare it: ArrowStorage(..., ragged=[{name}]))"
                )
        pairs.append((key, torch.stack(tensors)))
    return nest(pairs)


# --- rows of a write, as the storage keeps them ------------------------------------------------
def fixed_arrays(layout: Layout, fixed: list[int], payload: list[Any]) -> list[np.ndarray]:
    """The fixed-shape leaves (layout positions ``fixed``) of a batched payload, as arrays."""
    return [
        payload[pos].detach().to(device="cpu", dtype=layout.leaves[pos].dtype).numpy()
        for pos in fixed
    ]


class Columns:
    """A layout's leaves split the way a chunk keeps them: fixed-shape, or variable-length.

    Attributes:
        layout: the storage's layout.
        fixed: layout positions of the fixed-shape leaves (a numpy array per chunk each).
        variable: layout positions of the string and ragged leaves (a list per chunk each).
        specs: ``(shape, dtype)`` of each fixed-shape leaf.
        row_bytes: the bytes of one row of each fixed-shape leaf (int64).
    """

    __slots__ = ("fixed", "layout", "row_bytes", "specs", "variable")

    def __init__(self, layout: Layout) -> None:
        leaves = layout.leaves
        self.layout = layout
        self.fixed = [i for i, leaf in enumerate(leaves) if leaf.kind == TENSOR]
        self.variable = [i for i, leaf in enumerate(leaves) if leaf.kind != TENSOR]
        self.specs = [(leaves[i].shape, leaves[i].dtype) for i in self.fixed]
        self.row_bytes = np.array(
            [leaves[i].numel * leaves[i].dtype.itemsize for i in self.fixed], dtype=np.int64
        )

    def fixed_arrays(self, payload: list[Any]) -> list[np.ndarray]:
        """The fixed-shape leaves of a batched payload, as arrays."""
        return fixed_arrays(self.layout, self.fixed, payload)

    def batch_of_one(self, payload: list[Any]) -> list[Any]:
        """An unbatched payload (one item) as a batched one of one row."""
        return [
            [v] if leaf.kind != TENSOR else torch.as_tensor(v).unsqueeze(0)
            for leaf, v in zip(self.layout.leaves, payload, strict=True)
        ]


def variable_values(leaf: Leaf, values: list[Any]) -> list[Any]:
    """The rows of a string or ragged leaf as the storage keeps them (its own copies)."""
    if leaf.kind == RAGGED:  # copies: the storage owns its rows, never the caller's
        return [owned_row(v.detach().to(device="cpu", dtype=leaf.dtype, copy=True)) for v in values]
    return list(values)  # str: immutable


# --- Arrow arrays of stored rows ---------------------------------------------------------------
def owned_row(t: torch.Tensor) -> np.ndarray:
    """A ragged row the storage owns: a fresh copy, read-only like a sealed chunk's rows."""
    array = t.numpy()
    array.flags.writeable = False
    return array


def ragged_rows(pa: Any, column: Any, leaf: Leaf) -> list[np.ndarray]:
    """The rows of a ``list<...>`` column as arrays ``[L_i, *shape]``."""
    lengths = pa.compute.list_value_length(column).fill_null(0).to_numpy()
    flat = column.flatten()
    if leaf.shape:
        flat = flat.flatten()
    values = flat.to_numpy(zero_copy_only=False).reshape(-1, *leaf.shape)
    return np.split(values, np.cumsum(lengths)[:-1])


def fixed_array(pa: Any, values: np.ndarray, leaf: Leaf) -> Any:
    """A fixed-shape leaf's rows as a primitive or ``fixed_size_list`` Arrow array."""
    flat_values = np.ascontiguousarray(values).reshape(-1)
    if leaf.dtype is torch.bool:  # uint8 0/1 (field metadata rbdata.dtype=bool): zero-copy
        flat_values = flat_values.view(np.uint8)
    flat = pa.array(flat_values)
    if not leaf.shape:
        return flat
    return pa.FixedSizeListArray.from_arrays(flat, leaf.numel)


def ragged_array(pa: Any, items: list[np.ndarray], leaf: Leaf) -> Any:
    """Ragged rows ``[L_i, *shape]`` as a ``list<...>`` Arrow array."""
    lengths = np.array([len(v) for v in items], dtype=np.int64)
    offsets = np.zeros(len(items) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    dtype = TORCH_TO_NUMPY[leaf.dtype]
    values = (
        np.concatenate([np.asarray(v, dtype=dtype).reshape(-1) for v in items])
        if items
        else np.zeros(0, dtype)
    )
    inner = pa.array(values)
    if leaf.shape:
        inner = pa.FixedSizeListArray.from_arrays(inner, leaf.numel)
    return pa.ListArray.from_arrays(pa.array(offsets), inner)
