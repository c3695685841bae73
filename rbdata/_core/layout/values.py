"""Leaf values of stored items: conversion to tensors, stacking, and the checks of a write.

What :meth:`Layout.split <rbdata._core.layout.Layout.split>` needs beside the key paths: a value
becomes a tensor (:func:`to_tensor`), a list of items one batch (:func:`stack_items`), and a
leaf whose dtype, layout or device differs from its leaf's is checked and converted before
anything is written (:func:`cast_rule`, :func:`convert`), with errors that name the key, the
dtypes and a value. String and ragged (variable-length) leaves are inferred and validated
here too (:func:`variable_leaf`, :func:`split_variable`).
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbdata._core.layout.keys import (
    NON_TENSOR,
    RAGGED,
    STRING,
    Key,
    Leaf,
    flatten,
    key_name,
    key_names,
    non_tensor_value,
)

__all__ = [
    "EMPTY_BATCH",
    "cast_rule",
    "convert",
    "example_value",
    "explain_items",
    "one_item_message",
    "split_variable",
    "stack_items",
    "to_tensor",
    "variable_leaf",
]


def to_tensor(value: Any, name: str) -> torch.Tensor:
    """``value`` (a tensor, a numeric array or a number) as a tensor; key ``name`` in errors.

    A read-only or non-contiguous array is copied; anything else shares its memory.

    Examples:
        >>> to_tensor(np.arange(3), "'a'").tolist(), to_tensor(2.5, "'b'").item()
        ([0, 1, 2], 2.5)
    """
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biufc":
            raise TypeError(
                f"key {name}: expected a numeric array, got an array of dtype {value.dtype}"
            )
        if not value.flags.writeable or not value.flags.c_contiguous:
            value = np.ascontiguousarray(value).copy()
        return torch.from_numpy(value)
    if isinstance(value, (numbers.Number, np.generic)) and not isinstance(value, str):
        return torch.as_tensor(value)
    hint = ""
    if isinstance(value, (str, *NON_TENSOR)):
        hint = " (strings are kept by an ArrowStorage)"
    raise TypeError(
        f"key {name}: expected a tensor, array or number, got {type(value).__name__}{hint}"
    )


#: The error for an empty list of items where a batch was expected.
EMPTY_BATCH = (
    "data: an empty list has no items to write; pass a non-empty list of items, or a batch "
    "(a tensor, TensorDict or dict of tensors with a leading batch dimension)"
)


def stack_items(items: Sequence[Any]) -> Any:
    """Stack a list of unbatched items (tensors, TensorDicts or dicts) into one batch.

    Raises:
        ValueError: for an empty list, or items whose keys or shapes differ (the error
            names the first item and key that differ from item 0).
        TypeError: for items that are not tensors, arrays, TensorDicts or dicts.
    """
    if not items:
        raise ValueError(EMPTY_BATCH)
    first = items[0]
    if isinstance(first, (torch.Tensor, np.ndarray)):
        tensors = [to_tensor(x, "item") for x in items]
        try:
            return torch.stack(tensors)
        except RuntimeError:
            explain_items([{(): t} for t in tensors])
            raise
    if isinstance(first, (TensorDictBase, Mapping)):
        tds = [x if isinstance(x, TensorDictBase) else TensorDict(x, []) for x in items]
        try:
            return torch.stack(tds)  # type: ignore[arg-type]  # TensorDict implements stack
        except (RuntimeError, ValueError, TypeError):
            explain_items([flatten(x)[1] for x in items])
            raise
    raise TypeError(f"cannot stack items of type {type(first).__name__} into a batch")


def explain_items(items: Sequence[Mapping[Key, Any]]) -> None:
    """Raise a ``ValueError`` naming the first item and key that differ from item 0, if any."""
    keys = list(items[0])
    for i, item in enumerate(items[1:], start=1):
        missing = [k for k in keys if k not in item]
        if missing:
            raise ValueError(
                f"item {i} of the list lacks key {key_names(missing)[1:-1]}: every item needs "
                f"the keys of item 0, {key_names(keys)}"
            )
        unknown = [k for k in item if k not in items[0]]
        if unknown:
            raise ValueError(
                f"item {i} of the list has key {key_names(unknown)[1:-1]} that item 0 lacks: "
                f"every item needs the same keys, {key_names(keys)}"
            )
        for k in keys:
            a, b = items[0][k], item[k]
            shape_a, shape_b = tuple(getattr(a, "shape", ())), tuple(getattr(b, "shape", ()))
            if shape_a != shape_b:
                what = "item" if k == () else f"key {key_name(k)}"
                raise ValueError(
                    f"item {i} of the list: {what} has shape {shape_b}, item 0 has {shape_a}; "
                    "items of a batch need equal shapes"
                )


def _is_jagged(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_nested


def variable_leaf(key: Key, value: Any, batched: bool, ragged: bool) -> Leaf | None:
    """The string or ragged leaf of a first write, or ``None`` for a fixed-shape tensor."""
    name = key_name(key)
    value = non_tensor_value(value)
    if isinstance(value, str) and not batched:
        return Leaf(key, (), torch.uint8, STRING)
    if batched and isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"key {name}: an empty list has no items")
        if all(isinstance(v, str) for v in value):
            return Leaf(key, (), torch.uint8, STRING)
        first = to_tensor(value[0], name)
    elif batched and _is_jagged(value):
        first = value[0]
    elif ragged and not batched:
        first = to_tensor(value, name)
    else:
        return None
    if first.dim() == 0:
        raise ValueError(f"key {name}: a variable-length item needs a first dimension")
    return Leaf(key, tuple(first.shape[1:]), first.dtype, RAGGED)


def split_variable(
    leaf: Leaf,
    value: Any,
    batched: bool,
    castable: Any,
    device: torch.device | None = None,
    densify: bool = True,
) -> Any:
    """Validate a string or ragged value: a list (batch) or one item.

    Ragged items come back ready to write like fixed-shape leaves (see :func:`convert`);
    items that need no change are not copied.
    """
    name = leaf.name
    value = non_tensor_value(value)  # a TensorDict holds lists of str or tensors this way
    if leaf.kind == STRING:
        items = value if batched else [value]
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            what = "a list of str" if batched else "a str"
            raise TypeError(f"key {name}: expected {what}, got {type(value).__name__}")
        return list(items) if batched else value
    if batched:
        if _is_jagged(value):
            value = list(value.unbind())
        if not isinstance(value, (list, tuple)):
            raise TypeError(
                f"key {name}: expected a list of tensors (one per item, variable first "
                f"dimension) or a jagged nested tensor, got {type(value).__name__}"
            )
        items = [to_tensor(v, name) for v in value]
    else:
        items = [to_tensor(value, name)]
    for t in items:
        if t.dim() == 0 or tuple(t.shape[1:]) != leaf.shape:
            raise ValueError(
                f"key {name}: expected items of shape [length, *{list(leaf.shape)}], "
                f"got {list(t.shape)}"
            )
        if t.dtype is not leaf.dtype and not castable(t.dtype, leaf.dtype):
            raise TypeError(
                f"key {name}: expected dtype {leaf.dtype} (or one that casts safely to it), "
                f"got {t.dtype}"
            )
    items = [convert(t, leaf, device, densify) for t in items]
    return items if batched else items[0]


def one_item_message(name: str, expected: tuple[int, ...], given: tuple[int, ...]) -> str:
    """The error for a single item where a batch was expected (``extend(item)``)."""
    return (
        f"key {name}: expected a batch (a leading batch dimension, then the per-item shape "
        f"{expected}), got shape {given}, which is one item: extend (and set at a slice or a "
        "list of slots) takes a batch; use add (or set at an int slot) for one item, or add a "
        "batch dimension (e.g. item.unsqueeze(0))"
    )


def example_value(t: torch.Tensor) -> str:
    """`` (e.g. value 2.5)`` for an error message: a non-integral value first, or ``""``."""
    try:
        flat = t.detach().reshape(-1)
        if t.is_floating_point():
            odd = flat[flat != flat.trunc()]
            flat = odd if odd.numel() else flat
        return f" (e.g. value {flat[0].item()!r})" if flat.numel() else ""
    except (RuntimeError, NotImplementedError):  # meta, sparse, nested...
        return ""


def _int_bounds(t: torch.Tensor) -> tuple[int, int]:
    try:
        lo, hi = torch.aminmax(t)
    except (RuntimeError, NotImplementedError):  # e.g. uint32 has no CPU aminmax kernel
        arr = t.cpu().numpy()
        return int(arr.min()), int(arr.max())
    return int(lo), int(hi)


@functools.cache
def _range_of(dtype: torch.dtype) -> tuple[float, float]:
    if dtype is torch.bool:
        return 0, 1
    if dtype.is_floating_point or dtype.is_complex:
        info = torch.finfo(dtype)
        return float(info.min), float(info.max)
    iinfo = torch.iinfo(dtype)
    return iinfo.min, iinfo.max


@functools.cache
def cast_rule(given: torch.dtype, expected: torch.dtype) -> tuple[bool, bool]:
    """Whether ``given`` casts safely to ``expected`` by kind, and whether values need a check.

    Kinds follow :func:`torch.can_cast` (no float into an integer leaf, no complex into a real
    one). Within an allowed kind the values are checked only where the given dtype's range
    exceeds the leaf's: integers against the leaf's integer range, and casts into a float
    leaf for values that would become ``inf``.
    """
    if not torch.can_cast(given, expected):
        return False, False
    lo, hi = _range_of(given)
    lo_e, hi_e = _range_of(expected)
    return True, lo < lo_e or hi > hi_e


def _float_overflow(t: torch.Tensor, expected: torch.dtype, leaf: Leaf) -> None:
    """Refuse finite values of ``t`` that become ``inf`` in the float dtype ``expected``."""
    if not (t.is_complex() or expected.is_complex):
        top = _range_of(expected)[1]
        lo, hi = torch.aminmax(t)
        if -top <= float(lo) and float(hi) <= top:  # (NaN fails both: checked below)
            return
    bad = t.to(expected).isinf()
    if t.is_floating_point() or t.is_complex():
        bad &= ~t.isinf()
    if bool(bad.any()):
        value = t[bad][0].item()
        raise ValueError(
            f"key {leaf.name}: value {value!r} does not fit dtype {expected} (it would "
            f"become inf); given dtype {t.dtype}"
        )


def _check_values(t: torch.Tensor, leaf: Leaf) -> None:
    """Refuse values of ``t`` that a cast to the leaf's dtype would change beyond rounding.

    Integers must lie in an integer leaf's range (so no negative into an unsigned leaf);
    values cast into a float leaf must stay finite. Vectorised: one ``aminmax`` per leaf.
    """
    if not t.numel():
        return
    expected = leaf.dtype
    if expected.is_floating_point or expected.is_complex:
        _float_overflow(t, expected, leaf)
        return
    lo, hi = _int_bounds(t)
    lo_e, hi_e = _range_of(expected)
    if lo < lo_e or hi > hi_e:
        value = lo if lo < lo_e else hi
        raise ValueError(
            f"key {leaf.name}: value {value} is out of range for dtype {expected} "
            f"[{int(lo_e)}, {int(hi_e)}]; given dtype {t.dtype}"
        )


def convert(
    t: torch.Tensor,
    leaf: Leaf,
    device: torch.device | None,
    densify: bool,
) -> torch.Tensor:
    """The slow path of :meth:`Layout.split` for one leaf: whatever the write needs changed.

    Returns a detached, dense (strided) tensor on ``device`` (if given) whose values the
    leaf's dtype keeps (up to float rounding), or raises before anything is written. The
    dtype itself may still differ: storages cast while they copy (``copy_`` fuses the cast;
    a separate cast here would cost a copy of the batch), which cannot fail once the
    values were checked.
    """
    if t.is_nested:
        raise TypeError(
            f"key {leaf.name}: a nested tensor cannot be stored in a fixed-shape key; "
            "ArrowStorage keeps variable-length (ragged) keys"
        )
    if t.is_meta:
        raise TypeError(f"key {leaf.name}: a tensor on the 'meta' device has no data to store")
    if t.layout is not torch.strided:
        if not densify:
            raise TypeError(
                f"key {leaf.name}: a tensor of layout {t.layout} cannot be stored here (its "
                "batches could not be stacked); pass a dense tensor (e.g. t.to_dense())"
            )
        t = t.to_dense()
    if t.requires_grad:
        t = t.detach()  # never attach the storage to the caller's autograd graph
    if t.dtype is not leaf.dtype and cast_rule(t.dtype, leaf.dtype)[1]:
        _check_values(t, leaf)
    if device is not None and t.device != device:
        t = t.to(device, leaf.dtype)  # cast on the way: fewer bytes to move
    return t
