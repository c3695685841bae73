"""The per-step ``add`` path: one item's leaves, checked and ready for numpy row writes.

An online agent writes one transition per environment step, usually a dict of numpy arrays,
numpy scalars and Python numbers. The general write path (:meth:`Layout.split
<rbdata._layout.Layout.split>`) turns every leaf into a tensor and checks it, ~10-30 us per
item; a numpy row assignment costs ~0.5 us per leaf. :class:`ItemUnpacker` reads an item
whose leaves *already* match the layout exactly (same keys, shapes and dtypes, or Python
numbers that the leaf's dtype holds) and returns them in layout order, ready to assign to
rows of numpy views of the storage. Anything else (another dtype needing a checked cast, a
tensor with autograd, on another device, sparse; a missing or unknown key; any doubt)
returns ``None`` and the item takes the general path, which raises the documented errors or
converts. The two paths accept the same items and store the same values: the fast path only
takes items for which the general path's checks are known to pass and its casts exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rbdata._layout import TENSOR, Layout, Leaf, nest

__all__ = ["ItemUnpacker"]

_INT64 = (-(2**63), 2**63 - 1)


def _numpy_dtype(dtype: torch.dtype) -> np.dtype[Any] | None:
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):  # bfloat16, quantized...: no numpy twin
        return None


def _python_numbers(leaf: Leaf) -> tuple[tuple[type, ...], tuple[float, float]]:
    """The Python number types a scalar leaf takes as they are, and the bounds of a float.

    They follow the general path, which turns a Python number into a tensor
    (``bool`` -> bool, ``int`` -> int64, ``float`` -> float32, torch's default dtype) and
    casts it, so only numbers that numpy's assignment stores identically are taken: a bool
    into any leaf; an int into an integer leaf within its range, or into a float leaf where
    the float holds it exactly; a float into a float32 leaf when it stays finite (NaN, the
    infinities and floats into other float dtypes take the general path).
    """
    dtype = leaf.dtype
    if leaf.shape or dtype.is_complex:
        return (), (0, 0)
    if dtype is torch.bool:
        return (bool,), (0, 0)
    if dtype is torch.float32:
        top = float(torch.finfo(dtype).max)
        return (bool, int, float), (-top, top)
    return (bool, int), (0, 0)


def _int_range(leaf: Leaf, np_dtype: np.dtype[Any]) -> tuple[int, int]:
    """The ints a leaf takes as they are: its range, or those its float type holds exactly."""
    dtype = leaf.dtype
    if dtype.is_floating_point:
        exact = 2 ** (int(np.finfo(np_dtype).nmant) + 1)  # e.g. 2**24 for float32
        return -exact, exact
    if dtype.is_complex or dtype is torch.bool:
        return 0, -1  # none
    info = torch.iinfo(dtype)
    return max(info.min, _INT64[0]), min(info.max, _INT64[1])


class _Spec:
    """What one leaf accepts on the fast path."""

    __slots__ = (
        "float_range",
        "index",
        "int_range",
        "np_dtype",
        "np_scalar",
        "numbers",
        "shape",
    )

    def __init__(self, index: int, leaf: Leaf, np_dtype: np.dtype[Any]) -> None:
        self.index = index
        self.np_dtype = np_dtype
        self.np_scalar = np_dtype.type if not leaf.shape else None
        self.shape = tuple(leaf.shape)
        self.numbers, self.float_range = _python_numbers(leaf)
        self.int_range = _int_range(leaf, np_dtype)


def _tree(layout: Layout, specs: list[_Spec]) -> list[tuple[str, Any]]:
    """The nested key structure: ``[(key, _Spec | subtree)]`` in first-appearance order."""
    root = nest(zip(layout.keys, specs, strict=True))

    def freeze(node: dict[str, Any]) -> list[tuple[str, Any]]:
        return [(k, freeze(v) if isinstance(v, dict) else v) for k, v in node.items()]

    return freeze(root)


class ItemUnpacker:
    """Unpack one item that matches a fixed layout exactly into numpy-assignable leaves.

    Build it with :meth:`for_layout` (``None`` where a layout has no numpy twin). Then
    :meth:`unpack` returns the leaves in layout order (numpy arrays, numpy scalars, Python
    numbers, or numpy views of CPU tensors) or ``None`` for the general path.

    Examples:
        >>> import numpy as np, torch
        >>> from rbdata._layout import Layout
        >>> item = {"obs": torch.zeros(3), "next": {"r": torch.zeros(())}}
        >>> layout = Layout.from_data(item, batched=False)
        >>> unpack = ItemUnpacker.for_layout(layout).unpack
        >>> unpack({"obs": np.ones(3, np.float32), "next": {"r": 1.5}})
        [array([1., 1., 1.], dtype=float32), 1.5]
        >>> unpack({"obs": np.ones(3), "next": {"r": 1.5}}) is None  # float64: general path
        True
    """

    def __init__(self, layout: Layout, specs: list[_Spec]) -> None:
        self.size = len(specs)
        self._plain = specs[0] if layout.kind == "tensor" else None
        self._tree = _tree(layout, specs) if self._plain is None else []

    @classmethod
    def for_layout(cls, layout: Layout) -> ItemUnpacker | None:
        """An unpacker for ``layout`` (``None``: a leaf is variable or has no numpy dtype)."""
        specs = []
        for i, leaf in enumerate(layout.leaves):
            np_dtype = _numpy_dtype(leaf.dtype) if leaf.kind == TENSOR and leaf.numel else None
            if np_dtype is None:
                return None
            specs.append(_Spec(i, leaf, np_dtype))
        if not specs:
            return None
        return cls(layout, specs)

    def unpack(self, item: Any) -> list[Any] | None:
        """The leaves of ``item`` in layout order, or ``None``: take the general path."""
        plain = self._plain
        if plain is not None:
            value = _value(item, plain)
            return None if value is _MISS else [value]
        kind = type(item)
        if kind is dict:
            root = item
        elif kind is TensorDict and not item._batch_size:
            root = item._tensordict
        else:
            return None
        out: list[Any] = [None] * self.size
        return out if _collect(root, self._tree, out) else None

    def unpack_batch(self, data: Any) -> tuple[list[Any], int] | None:
        """The leaves of a batch (leading dimension ``n >= 1``) in layout order and ``n``.

        Numpy arrays and CPU tensors of the leaf's dtype and per-item shape only (no
        Python numbers: a batch has a leading dimension); ``None``: the general path.
        """
        plain = self._plain
        n = [-1]
        if plain is not None:
            value = _batch_value(data, plain, n)
            return None if value is _MISS or n[0] < 1 else ([value], n[0])
        kind = type(data)
        if kind is dict:
            root = data
        elif kind is TensorDict and len(data._batch_size) == 1:
            root = data._tensordict
        else:
            return None
        out: list[Any] = [None] * self.size
        if not _collect(root, self._tree, out, n) or n[0] < 1:
            return None
        return out, n[0]


_MISS = object()


def _batch_value(v: Any, spec: _Spec, n: list[int]) -> Any:
    """A batch leaf ready for a numpy slice assignment, or ``_MISS``; ``n[0]``: batch size."""
    kind = type(v)
    if kind is torch.Tensor:
        try:
            v = v.numpy()  # refuses what numpy() refuses, see _value
        except (RuntimeError, TypeError):
            return _MISS
    elif kind is not np.ndarray:
        return _MISS
    shape = v.shape
    if v.dtype is not spec.np_dtype or shape[1:] != spec.shape or not shape:
        return _MISS
    if n[0] < 0:
        n[0] = shape[0]
    elif shape[0] != n[0]:
        return _MISS
    return v


def _value(v: Any, spec: _Spec) -> Any:
    """``v`` ready for a numpy row assignment into the leaf, or ``_MISS``."""
    kind = type(v)
    if kind is np.ndarray:
        if v.dtype is spec.np_dtype and v.shape == spec.shape:
            return v
        return _MISS
    if kind is torch.Tensor:
        # numpy() refuses what a plain copy of the bytes would get wrong or must not touch
        # (autograd, a conjugate or negative bit, another device, a sparse layout); its view
        # has the tensor's shape and the numpy twin of its dtype (one per torch dtype)
        try:
            a = v.numpy()
        except (RuntimeError, TypeError):
            return _MISS
        if a.dtype is spec.np_dtype and a.shape == spec.shape:
            return a
        return _MISS
    if kind is spec.np_scalar:
        return v
    if kind in spec.numbers:
        if kind is bool:
            return v
        lo, hi = spec.int_range if kind is int else spec.float_range
        if lo <= v <= hi:  # (NaN fails: the general path takes it)
            return v
    return _MISS


def _collect(
    node: dict[str, Any], tree: list[tuple[str, Any]], out: list[Any], n: list[int] | None = None
) -> bool:
    """Fill ``out`` with the leaves of ``node`` (one item, or a batch of ``n[0]`` if ``n``)."""
    if len(node) != len(tree):
        return False
    for key, sub in tree:
        v = node.get(key, _MISS)
        if type(sub) is _Spec:
            value = _value(v, sub) if n is None else _batch_value(v, sub, n)
            if value is _MISS:
                return False
            out[sub.index] = value
            continue
        kind = type(v)
        if kind is dict:
            inner = v
        elif kind is TensorDict and (not v._batch_size if n is None else v._batch_size):
            inner = v._tensordict
        else:
            return False
        if not _collect(inner, sub, out, n):
            return False
    return True
