"""Key paths of stored items: flatten nested data into leaves by key path, and back.

An item (or a batch) is a tensor, a TensorDict or a nested dict of tensors; its *leaves* are
addressed by key paths (tuples of strings, ``()`` for a plain tensor). :func:`flatten` walks
the data into ``{key path: value}``, :func:`nest` builds nested dicts back, :func:`key_name`
names a key in errors. A :class:`Leaf` records one stored field: its key path, per-item shape,
dtype and kind.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

# what flatten says data is, and the kinds of leaves (torch-free: rbdata._core.spec)
from rbdata._core.spec import DICT_KIND, RAGGED, STRING, TENSOR, TENSOR_KIND

__all__ = [
    "DICT_KIND",
    "NON_TENSOR",
    "RAGGED",
    "STRING",
    "TENSOR",
    "TENSOR_KIND",
    "Key",
    "Leaf",
    "flatten",
    "is_structured",
    "key_name",
    "key_names",
    "nest",
    "non_tensor_value",
]

Key = tuple[str, ...]


def key_name(key: Key) -> str:
    """How errors name a key: ``'observation'`` or ``('next', 'reward')``.

    Examples:
        >>> key_name(("obs",)), key_name(("next", "done"))
        ("'obs'", "('next', 'done')")
    """
    return repr(key[0]) if len(key) == 1 else repr(key)


def key_names(keys: Sequence[Key]) -> str:
    """A list of key names for error messages."""
    return "[" + ", ".join(key_name(k) for k in keys) + "]"


@dataclass(frozen=True)
class Leaf:
    """One stored field: its key path, per-item shape and dtype (and kind, see above)."""

    key: Key
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str = TENSOR

    @property
    def numel(self) -> int:
        """Number of elements of one item of this leaf."""
        return math.prod(self.shape)

    @property
    def name(self) -> str:
        """Human-readable key, e.g. ``('next', 'reward')`` or ``'observation'``."""
        return key_name(self.key)


def nest(pairs: Iterable[tuple[Key, Any]]) -> dict[str, Any]:
    """Nested dicts from ``(key path, value)`` pairs, in first-appearance order.

    Examples:
        >>> nest([(("a",), 1), (("next", "b"), 2), (("next", "c"), 3)])
        {'a': 1, 'next': {'b': 2, 'c': 3}}
    """
    out: dict[str, Any] = {}
    for key, value in pairs:
        node = out
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return out


def is_structured(data: Any) -> bool:
    """Whether ``data`` is a tensor, array, TensorDict or (nested) mapping of tensors/arrays.

    Examples:
        >>> is_structured({"a": torch.zeros(2)}), is_structured({"a": 1}), is_structured("s")
        (True, False, False)
    """
    if isinstance(data, (torch.Tensor, np.ndarray, TensorDictBase)):
        return True
    if isinstance(data, Mapping):
        return bool(data) and all(is_structured(v) for v in data.values())
    return False


#: What a TensorDict holds for strings (and other objects): one leaf each, never walked into
NON_TENSOR = (NonTensorData, NonTensorStack)


def _walk(data: Any, prefix: Key, out: dict[Key, Any]) -> None:
    # exact TensorDict: read its plain dict of entries (the public items() is ~5x slower)
    items = data._tensordict.items() if type(data) is TensorDict else data.items()
    for k, v in items:
        key = (*prefix, k) if type(k) is str else (*prefix, *k)
        if type(v) is torch.Tensor:
            out[key] = v
        elif type(v) is TensorDict or type(v) is dict:
            _walk(v, key, out)
        elif isinstance(v, NON_TENSOR):  # a TensorDictBase with no entries of its own
            out[key] = v
        elif isinstance(v, (Mapping, TensorDictBase)):
            # (exact types first: the ABC isinstance costs ~0.5 us on the per-step path)
            _walk(v, key, out)
        else:
            out[key] = v


def non_tensor_value(value: Any) -> Any:
    """The Python value(s) of a TensorDict's non-tensor leaf: a list for a batch, else one.

    ``rb.storage[[0, 1]]["text"]`` is a ``NonTensorStack`` and ``rb.storage[0]["text"]`` a
    ``NonTensorData``; a TensorDict built from a list of ``str`` (or of tensors of varying
    length) holds a ``NonTensorStack`` too. Anything else is returned as it is.

    Examples:
        >>> non_tensor_value(NonTensorStack.from_list(["a", "b"]))
        ['a', 'b']
        >>> non_tensor_value(NonTensorData("a")), non_tensor_value("a")
        ('a', 'a')
    """
    if not isinstance(value, NON_TENSOR):
        return value
    return value.tolist() if value.batch_dims else value.data


def flatten(data: Any) -> tuple[str, dict[Key, Any]]:
    """Split ``data`` into its kind (``"tensor"`` or ``"tensordict"``) and leaves by key path.

    Examples:
        >>> kind, leaves = flatten({"a": torch.zeros(2), "next": {"b": torch.ones(2)}})
        >>> kind, sorted(leaves)
        ('tensordict', [('a',), ('next', 'b')])
    """
    exact = type(data) is TensorDict or type(data) is dict  # the per-step path: no ABC checks
    if not exact and isinstance(data, (torch.Tensor, np.ndarray)):
        return TENSOR_KIND, {(): data}
    if exact or isinstance(data, (TensorDictBase, Mapping)):
        out: dict[Key, Any] = {}
        _walk(data, (), out)
        if not out:
            raise ValueError("data has no entries: expected at least one tensor")
        return DICT_KIND, out
    raise TypeError(
        "data must be a torch.Tensor, a numpy array, a TensorDict or a (nested) dict of "
        f"tensors/arrays, got {type(data).__name__}"
    )
