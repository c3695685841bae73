"""Layout of stored items: which leaves (keys), their per-item shapes and dtypes.

A storage takes its layout from the first write and validates every later write
against it *before* touching any data, so bad input leaves the storage as it was.
The layout also turns gathered leaves back into the user's structure: a plain
tensor, or a :class:`~tensordict.TensorDict` built once without re-validation.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

__all__ = [
    "EMPTY_BATCH",
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
    "nest",
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
    hint = ""
    if isinstance(value, (str, *_NON_TENSOR)):
        hint = " (strings are kept by an ArrowStorage)"
    raise TypeError(
        f"key {name}: expected a tensor, array or number, got {type(value).__name__}{hint}"
    )


#: what a TensorDict holds for strings (and other objects): one leaf each, never walked into
_NON_TENSOR = (NonTensorData, NonTensorStack)


def _walk(data: Any, prefix: Key, out: dict[Key, Any]) -> None:
    # exact TensorDict: read its plain dict of entries (the public items() is ~5x slower)
    items = data._tensordict.items() if type(data) is TensorDict else data.items()
    for k, v in items:
        key = (*prefix, k) if type(k) is str else (*prefix, *k)
        if type(v) is torch.Tensor:
            out[key] = v
        elif type(v) is TensorDict or type(v) is dict:
            _walk(v, key, out)
        elif isinstance(v, _NON_TENSOR):  # a TensorDictBase with no entries of its own
            out[key] = v
        elif isinstance(v, (Mapping, TensorDictBase)):
            # (exact types first: the ABC isinstance costs ~0.5 us on the per-step path)
            _walk(v, key, out)
        else:
            out[key] = v


def _non_tensor_value(value: Any) -> Any:
    """The Python value(s) of a TensorDict's non-tensor leaf: a list for a batch, else one.

    ``rb.storage[[0, 1]]["text"]`` is a ``NonTensorStack`` and ``rb.storage[0]["text"]`` a
    ``NonTensorData``; a TensorDict built from a list of ``str`` (or of tensors of varying
    length) holds a ``NonTensorStack`` too. Anything else is returned as it is.

    Examples:
        >>> _non_tensor_value(NonTensorStack.from_list(["a", "b"]))
        ['a', 'b']
        >>> _non_tensor_value(NonTensorData("a")), _non_tensor_value("a")
        ('a', 'a')
    """
    if not isinstance(value, _NON_TENSOR):
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


_CPU = torch.device("cpu")

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
        tensors = [_to_tensor(x, "item") for x in items]
        try:
            return torch.stack(tensors)
        except RuntimeError:
            _explain_items([{(): t} for t in tensors])
            raise
    if isinstance(first, (TensorDictBase, Mapping)):
        tds = [x if isinstance(x, TensorDictBase) else TensorDict(x, []) for x in items]
        try:
            return torch.stack(tds)  # type: ignore[arg-type]  # TensorDict implements stack
        except (RuntimeError, ValueError, TypeError):
            _explain_items([flatten(x)[1] for x in items])
            raise
    raise TypeError(f"cannot stack items of type {type(first).__name__} into a batch")


def _explain_items(items: Sequence[Mapping[Key, Any]]) -> None:
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


def _variable_leaf(key: Key, value: Any, batched: bool, ragged: bool) -> Leaf | None:
    """The string or ragged leaf of a first write, or ``None`` for a fixed-shape tensor."""
    name = key_name(key)
    value = _non_tensor_value(value)
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


def _split_variable(
    leaf: Leaf,
    value: Any,
    batched: bool,
    castable: Any,
    device: torch.device | None = None,
    densify: bool = True,
) -> Any:
    """Validate a string or ragged value: a list (batch) or one item.

    Ragged items come back ready to write like fixed-shape leaves (see :func:`_convert`);
    items that need no change are not copied.
    """
    name = leaf.name
    value = _non_tensor_value(value)  # a TensorDict holds lists of str or tensors this way
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
    items = [_convert(t, leaf, device, densify) for t in items]
    return items if batched else items[0]


def _one_item_message(name: str, expected: tuple[int, ...], given: tuple[int, ...]) -> str:
    """The error for a single item where a batch was expected (``extend(item)``)."""
    return (
        f"key {name}: expected a batch (a leading batch dimension, then the per-item shape "
        f"{expected}), got shape {given}, which is one item: extend (and set at a slice or a "
        "list of slots) takes a batch; use add (or set at an int slot) for one item, or add a "
        "batch dimension (e.g. item.unsqueeze(0))"
    )


def _example(t: torch.Tensor) -> str:
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
def _cast_rule(given: torch.dtype, expected: torch.dtype) -> tuple[bool, bool]:
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


def _convert(
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
    if t.dtype is not leaf.dtype and _cast_rule(t.dtype, leaf.dtype)[1]:
        _check_values(t, leaf)
    if device is not None and t.device != device:
        t = t.to(device, leaf.dtype)  # cast on the way: fewer bytes to move
    return t


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
        # what split reads per leaf, unpacked once (attribute reads cost on the per-step path)
        self._specs = tuple(
            (leaf, leaf.key, leaf.kind == TENSOR, leaf.shape, leaf.dtype) for leaf in self.leaves
        )

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
                    f"key {name}: a batch needs a leading batch dimension, got a scalar "
                    "(extend takes a batch; use add for one item)"
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
        return _cast_rule(given, expected)[0]

    def split(
        self,
        data: Any,
        batched: bool,
        device: torch.device | None = None,
        densify: bool = True,
    ) -> tuple[list[torch.Tensor], int]:
        """Validate ``data`` against the layout; return its leaves in layout order and its size.

        Everything that can fail happens here, before a storage writes anything: the
        fixed-shape leaves come back ready to copy — detached from autograd, dense, on
        ``device`` (when given), with values the leaf's dtype keeps (a storage casts while
        it copies, which cannot fail then). A leaf whose dtype, layout, device and
        ``requires_grad`` already match is returned as it is: the per-step path pays a few
        attribute reads, and narrowing casts are checked (one ``aminmax`` per leaf) only
        where the dtypes differ.

        Args:
            data: a batch (``batched``) or one item, structured like the first write.
            batched: whether ``data`` has a leading batch dimension.
            device: where fixed-shape leaves must end up (``None``: leave them where they are).
            densify: turn sparse leaves dense (``True``) or refuse them (``False``, for a
                storage that keeps the given tensors and stacks them on reads).

        Raises:
            ValueError: a missing/unknown key, a wrong shape (a single item where a batch
                was expected says so), or a value the cast to the leaf's dtype would not
                keep (out of an integer leaf's range, negative into an unsigned leaf, a
                finite value that becomes ``inf``); the error names the key, the dtypes
                and the value.
            TypeError: a dtype of another kind (a float into an integer leaf), a nested,
                ``meta`` or (with ``densify=False``) sparse tensor.
        """
        kind, flat = flatten(data)
        if kind != self.kind:
            expected = "a tensor" if self.kind == _TENSOR_KIND else "a TensorDict or dict"
            raise ValueError(f"data: expected {expected} like the first write, got {kind}")
        tensors: list[torch.Tensor] = []
        n = -1
        strided = torch.strided
        on_cpu = device == _CPU  # (not device.type: that property costs ~0.2 us)
        for leaf, key, fixed, leaf_shape, dtype in self._specs:
            try:
                value = flat.pop(key)
            except KeyError:
                raise ValueError(
                    f"missing key {leaf.name}: expected keys {key_names(self.keys)}"
                ) from None
            if not fixed:
                items = _split_variable(leaf, value, batched, self._castable, device, densify)
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
            try:
                shape = t.shape
            except RuntimeError:  # a strided nested tensor has no shape
                _convert(t, leaf, device, densify)
                raise
            if batched:
                if not shape:
                    if not leaf_shape:
                        raise ValueError(_one_item_message(leaf.name, leaf_shape, ()))
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
            if item_shape != leaf_shape:
                if batched and tuple(shape) == leaf_shape:
                    raise ValueError(_one_item_message(leaf.name, leaf_shape, tuple(shape)))
                raise ValueError(
                    f"key {leaf.name}: expected per-item shape {tuple(leaf_shape)}, "
                    f"got {tuple(item_shape)}"
                )
            if t.dtype is not dtype:
                if not self._castable(t.dtype, dtype):
                    raise TypeError(
                        f"key {leaf.name}: expected dtype {dtype} (or one that casts "
                        f"safely to it), got {t.dtype}{_example(t)}"
                    )
                t = _convert(t, leaf, device, densify)
            elif (
                t.requires_grad
                or t.layout is not strided
                or (not t.is_cpu if on_cpu else t.is_meta if device is None else t.device != device)
            ):
                t = _convert(t, leaf, device, densify)
            tensors.append(t)
        if flat:
            raise ValueError(
                f"unknown key {key_names(tuple(flat))[1:-1]}: expected keys {key_names(self.keys)}"
            )
        tensordict = type(data) is TensorDict or (
            type(data) is not dict and isinstance(data, TensorDictBase)
        )
        if batched and tensordict and data.batch_dims:
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
        source = nest(zip(self.keys, tensors, strict=True))
        if extra:
            source.update(extra)
        return TensorDict._new_unsafe(
            source=source,  # type: ignore[arg-type]  # nested dicts become sub-TensorDicts
            batch_size=batch_size,
            device=device,
        )
