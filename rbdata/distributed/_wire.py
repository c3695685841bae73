"""The wire format: batches flattened to numpy leaves for Ray's object store, and back.

A batch travels as ``(kind, keys, leaves, batch_size)``: kind ``"td"`` (TensorDict),
``"dict"`` (nested mapping of tensors), ``"tensor"`` (one tensor) or ``"object"`` (anything
else, pickled by Ray as it is); ``keys`` are key paths (tuples), as ``rbdata._core.layout``'s
:func:`~rbdata._core.layout.flatten` gives them and :func:`~rbdata._core.layout.nest` takes them.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbdata._core.layout import flatten, nest

__all__ = ["Packed", "concat", "pack", "unpack"]

Packed = tuple[str, list[Any], list[Any], tuple[int, ...] | None]


def _leaf_out(value: Any) -> Any:
    """A tensor as a numpy array sharing its memory where possible (else the CPU tensor)."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        try:
            return value.resolve_conj().resolve_neg().numpy()
        except (TypeError, RuntimeError):  # e.g. bfloat16 has no numpy dtype
            return value
    return value


def _leaf_in(value: Any, copy: bool) -> Any:
    """A numpy leaf back as a tensor; object-store arrays are read-only, so copy if asked."""
    if isinstance(value, np.ndarray):
        if copy or not value.flags.writeable:
            if copy:
                return torch.from_numpy(np.array(value))
            with warnings.catch_warnings():  # read only: the storage copies it, never writes
                warnings.filterwarnings("ignore", "The given NumPy array is not writable")
                return torch.from_numpy(value)
        return torch.from_numpy(value)
    return value


def pack(data: Any) -> Packed:
    """Flatten a batch into numpy leaves for the object store."""
    if isinstance(data, torch.Tensor):
        return ("tensor", [], [_leaf_out(data)], None)
    td = isinstance(data, TensorDictBase)
    if td or (isinstance(data, Mapping) and data):
        try:
            _, leaves = flatten(data)
        except ValueError:  # no leaves: only empty mappings inside
            leaves = {}
        values = [_leaf_out(v) for v in leaves.values()]
        if td:
            return ("td", list(leaves), values, tuple(data.batch_size))
        return ("dict", list(leaves), values, None)
    return ("object", [], [data], None)


def unpack(packed: Packed, copy: bool) -> Any:
    """Rebuild what :func:`pack` flattened (``copy``: into writable memory of our own)."""
    kind, keys, leaves, batch_size = packed
    if kind == "object":
        return leaves[0]
    tensors = [_leaf_in(v, copy) for v in leaves]
    if kind == "tensor":
        return tensors[0]
    nested = nest(zip(keys, tensors, strict=True))
    if kind == "dict":
        return nested
    return TensorDict(nested, batch_size=batch_size)


def concat(parts: Sequence[Packed]) -> Packed:
    """Join packed batches of one layout along the batch dimension (a fresh, writable copy)."""
    kind, keys, first, batch_size = parts[0]
    if kind == "object":
        raise TypeError("cannot join batches of Python objects across shards")
    leaves: list[Any] = []
    for j, leaf in enumerate(first):
        pieces = [p[2][j] for p in parts]
        if isinstance(leaf, np.ndarray):
            leaves.append(np.concatenate(pieces))
        else:
            leaves.append(torch.cat([torch.as_tensor(x) for x in pieces]))
    if batch_size is not None:
        batch_size = (sum(int(p[3][0]) for p in parts if p[3]), *batch_size[1:])
    return (kind, keys, leaves, batch_size)


# --- the actor ---------------------------------------------------------------------------------
