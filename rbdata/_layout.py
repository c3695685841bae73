"""Layout of stored items: which leaves (keys), their per-item shapes and dtypes.

A storage takes its layout from the first write and validates every later write
against it *before* touching any data, so bad input leaves the storage as it was.
The layout also turns gathered leaves back into the user's structure: a plain
tensor, or a :class:`~tensordict.TensorDict` built once without re-validation.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

__all__ = [
    "RAGGED",
    "STRING",
    "TENSOR",
    "Key",
    "Layout",
    "Leaf",
    "flatten",
    "is_structured",
    "key_name",
    "key_names",
    "stack_items",
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


_TENSOR_KIND = "tensor"
_DICT_KIND = "tensordict"


#: Kinds of leaves: fixed-shape tensors (every storage), and the variable-length kinds that
#: only :class:`~rbdata.storages.ArrowStorage` keeps: tensors whose first dimension varies per
#: item (``shape`` is then the fixed trailing shape) and strings.
TENSOR, RAGGED, STRING = "tensor", "ragged", "string"


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


def _to_tensor(value: Any, name: str) -> torch.Tensor:
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
    raise TypeError(f"key {name}: expected a tensor, array or number, got {type(value).__name__}")


def _walk(data: Any, prefix: Key, out: dict[Key, Any]) -> None:
    # exact TensorDict: read its plain dict of entries (the public items() is ~5x slower)
    items = data._tensordict.items() if type(data) is TensorDict else data.items()
    for k, v in items:
        key = (*prefix, k) if type(k) is str else (*prefix, *k)
        if type(v) is torch.Tensor:
            out[key] = v
        elif type(v) is TensorDict or type(v) is dict or isinstance(v, (Mapping, TensorDictBase)):
            # (exact types first: the ABC isinstance costs ~0.5 us on the per-step path)
            _walk(v, key, out)
        else:
            out[key] = v


def flatten(data: Any) -> tuple[str, dict[Key, Any]]:
    """Split ``data`` into its kind (``"tensor"`` or ``"tensordict"``) and leaves by key path.

    Examples:
        >>> kind, leaves = flatten({"a": torch.zeros(2), "next": {"b": torch.ones(2)}})
        >>> kind, sorted(leaves)
        ('tensordict', [('a',), ('next', 'b')])
    """
    exact = type(data) is TensorDict or type(data) is dict  # the per-step path: no ABC checks
    if not exact and isinstance(data, (torch.Tensor, np.ndarray)):
        return _TENSOR_KIND, {(): data}
    if exact or isinstance(data, (TensorDictBase, Mapping)):
        out: dict[Key, Any] = {}
        _walk(data, (), out)
        if not out:
            raise ValueError("data has no entries: expected at least one tensor")
        return _DICT_KIND, out
    raise TypeError(
        "data must be a torch.Tensor, a numpy array, a TensorDict or a (nested) dict of "
        f"tensors/arrays, got {type(data).__name__}"
    )


def stack_items(items: Sequence[Any]) -> Any:
    """Stack a list of unbatched items (tensors, TensorDicts or dicts) into one batch."""
    if not items:
        raise ValueError("cannot extend with an empty list of items")
    first = items[0]
    if isinstance(first, (torch.Tensor, np.ndarray)):
        return torch.stack([_to_tensor(x, "item") for x in items])
    if isinstance(first, (TensorDictBase, Mapping)):
        tds = [x if isinstance(x, TensorDictBase) else TensorDict(x, []) for x in items]
        return torch.stack(tds)  # type: ignore[arg-type]  # TensorDict implements stack
    raise TypeError(f"cannot stack items of type {type(first).__name__} into a batch")


def _is_jagged(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_nested


def _variable_leaf(key: Key, value: Any, batched: bool, ragged: bool) -> Leaf | None:
    """The string or ragged leaf of a first write, or ``None`` for a fixed-shape tensor."""
    name = key_name(key)
    if isinstance(value, str) and not batched:
        return Leaf(key, (), torch.uint8, STRING)
    if batched and isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"key {name}: an empty list has no items")
        if all(isinstance(v, str) for v in value):
            return Leaf(key, (), torch.uint8, STRING)
        first = _to_tensor(value[0], name)
    elif batched and _is_jagged(value):
        first = value[0]
    elif ragged and not batched:
        first = _to_tensor(value, name)
    else:
        return None
    if first.dim() == 0:
        raise ValueError(f"key {name}: a variable-length item needs a first dimension")
    return Leaf(key, tuple(first.shape[1:]), first.dtype, RAGGED)


def _split_variable(leaf: Leaf, value: Any, batched: bool, castable: Any) -> Any:
    """Validate a string or ragged value: a list (batch) or one item, nothing copied."""
    name = leaf.name
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
        items = [_to_tensor(v, name) for v in value]
    else:
        items = [_to_tensor(value, name)]
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
    return items if batched else items[0]


class Layout:
    """The keys, per-item shapes and dtypes a storage holds.

    Args:
        kind: ``"tensor"`` for plain-tensor items, ``"tensordict"`` for dict-like items.
        leaves: one :class:`Leaf` per stored field (a single leaf with key ``()`` for tensors).

    Examples:
        >>> layout = Layout.from_data({"obs": torch.zeros(8, 3)}, batched=True)
        >>> [(leaf.key, leaf.shape, leaf.dtype) for leaf in layout.leaves]
        [(('obs',), (3,), torch.float32)]
    """

    def __init__(self, kind: str, leaves: Sequence[Leaf]) -> None:
        if kind not in (_TENSOR_KIND, _DICT_KIND):
            raise ValueError(f"kind must be 'tensor' or 'tensordict', got {kind!r}")
        self.kind = kind
        self.leaves: tuple[Leaf, ...] = tuple(leaves)
        self.keys: tuple[Key, ...] = tuple(leaf.key for leaf in self.leaves)
        self._cast_ok: dict[tuple[torch.dtype, torch.dtype], bool] = {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self.kind == other.kind and self.leaves == other.leaves

    def __hash__(self) -> int:
        return hash((self.kind, self.leaves))

    def __repr__(self) -> str:
        fields = ", ".join(f"{leaf.name}: {leaf.dtype} {list(leaf.shape)}" for leaf in self.leaves)
        return f"Layout({self.kind}; {fields})"

    @property
    def fixed(self) -> bool:
        """Whether every leaf is a fixed-shape tensor (what tensor and memmap storages keep)."""
        return all(leaf.kind == TENSOR for leaf in self.leaves)

    @property
    def item_nbytes(self) -> int:
        """Bytes of one item over all leaves."""
        return sum(leaf.numel * leaf.dtype.itemsize for leaf in self.leaves)

    # --- construction --------------------------------------------------------------------
    @classmethod
    def from_data(
        cls, data: Any, batched: bool, variable: bool = False, ragged: Sequence[Key] = ()
    ) -> Layout:
        """Infer the layout of ``data`` (a batch if ``batched``, else one item).

        With ``variable`` (storages that keep variable-length fields), a batch value that is a
        list of strings is a string leaf, a list of tensors/arrays (or a jagged nested tensor)
        a ragged leaf; keys in ``ragged`` are ragged even for a single item.
        """
        kind, flat = flatten(data)
        leaves = []
        for key, value in flat.items():
            name = key_name(key)
            if variable:
                leaf = _variable_leaf(key, value, batched, key in ragged)
                if leaf is not None:
                    leaves.append(leaf)
                    continue
            t = _to_tensor(value, name)
            if batched and t.dim() == 0:
                raise ValueError(
                    f"key {name}: a batch needs a leading batch dimension, got a scalar"
                )
            shape = tuple(t.shape[1:] if batched else t.shape)
            leaves.append(Leaf(key, shape, t.dtype))
        return cls(kind, leaves)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able description (keys, shapes, dtype names)."""
        return {
            "kind": self.kind,
            "leaves": [
                {
                    "key": list(leaf.key),
                    "shape": list(leaf.shape),
                    "dtype": str(leaf.dtype)[6:],
                    **({} if leaf.kind == TENSOR else {"kind": leaf.kind}),
                }
                for leaf in self.leaves
            ],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Layout:
        """Rebuild a layout written by :meth:`to_json`; refuses unknown dtypes."""
        leaves = []
        for entry in obj["leaves"]:
            dtype = getattr(torch, str(entry["dtype"]), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown dtype {entry['dtype']!r} in layout")
            kind = str(entry.get("kind", TENSOR))
            if kind not in (TENSOR, RAGGED, STRING):
                raise ValueError(f"unknown leaf kind {kind!r} in layout")
            shape = tuple(int(s) for s in entry["shape"])
            leaves.append(Leaf(tuple(entry["key"]), shape, dtype, kind))
        return cls(str(obj["kind"]), leaves)

    # --- validation ----------------------------------------------------------------------
    def _castable(self, given: torch.dtype, expected: torch.dtype) -> bool:
        ok = self._cast_ok.get((given, expected))
        if ok is None:
            ok = self._cast_ok[(given, expected)] = torch.can_cast(given, expected)
        return ok

    def split(self, data: Any, batched: bool) -> tuple[list[torch.Tensor], int]:
        """Validate ``data`` against the layout; return its leaves in layout order and its size.

        Raises ``ValueError`` for a missing/unknown key or a wrong shape and
        ``TypeError`` for a dtype that cannot be cast safely; nothing is written.
        """
        kind, flat = flatten(data)
        if kind != self.kind:
            expected = "a tensor" if self.kind == _TENSOR_KIND else "a TensorDict or dict"
            raise ValueError(f"data: expected {expected} like the first write, got {kind}")
        tensors: list[torch.Tensor] = []
        n = -1
        for leaf in self.leaves:
            try:
                value = flat.pop(leaf.key)
            except KeyError:
                raise ValueError(
                    f"missing key {leaf.name}: expected keys {key_names(self.keys)}"
                ) from None
            if leaf.kind != TENSOR:
                items = _split_variable(leaf, value, batched, self._castable)
                if batched:
                    if n < 0:
                        n = len(items)
                    elif len(items) != n:
                        raise ValueError(
                            f"key {leaf.name}: expected batch size {n} like the other keys, "
                            f"got {len(items)}"
                        )
                tensors.append(items)  # a list: a variable-length leaf
                continue
            t = value if type(value) is torch.Tensor else _to_tensor(value, leaf.name)
            shape = t.shape
            if batched:
                if not shape:
                    raise ValueError(f"key {leaf.name}: expected a batch, got a scalar")
                item_shape = shape[1:]
                if n < 0:
                    n = shape[0]
                elif shape[0] != n:
                    raise ValueError(
                        f"key {leaf.name}: expected batch size {n} like the other keys, "
                        f"got {shape[0]}"
                    )
            else:
                item_shape = shape
            if item_shape != leaf.shape:
                raise ValueError(
                    f"key {leaf.name}: expected per-item shape {tuple(leaf.shape)}, "
                    f"got {tuple(item_shape)}"
                )
            if t.dtype is not leaf.dtype and not self._castable(t.dtype, leaf.dtype):
                raise TypeError(
                    f"key {leaf.name}: expected dtype {leaf.dtype} (or one that casts safely "
                    f"to it), got {t.dtype}"
                )
            tensors.append(t)
        if flat:
            raise ValueError(
                f"unknown key {key_names(tuple(flat))[1:-1]}: expected keys {key_names(self.keys)}"
            )
        if isinstance(data, TensorDictBase) and batched and data.batch_dims:
            n = data.batch_size[0]
        return tensors, (n if batched else 1)

    # --- assembly ------------------------------------------------------------------------
    def assemble(
        self,
        tensors: Sequence[torch.Tensor],
        batch_size: torch.Size,
        device: torch.device | None,
        extra: Mapping[str, torch.Tensor] | None = None,
    ) -> Any:
        """Build the user-facing batch from leaves in layout order, without re-validation."""
        if self.kind == _TENSOR_KIND:
            return tensors[0]
        source: dict[str, Any] = {}
        for key, t in zip(self.keys, tensors, strict=True):
            node = source
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = t
        if extra:
            source.update(extra)
        return TensorDict._new_unsafe(
            source=source,  # type: ignore[arg-type]  # nested dicts become sub-TensorDicts
            batch_size=batch_size,
            device=device,
        )
