"""Layout of stored items: which leaves (keys), their per-item shapes and dtypes.

A storage takes its layout from the first write and validates every later write
against it *before* touching any data, so bad input leaves the storage as it was.
The layout also turns gathered leaves back into the user's structure: a plain
tensor, or a :class:`~tensordict.TensorDict` built once without re-validation.

Key paths and leaves are :mod:`!rbdata._core.layout.keys`' (:func:`flatten`, :func:`nest` and the
leaf types are importable from here too); values are checked and converted by
:mod:`!rbdata._core.layout.values`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rbdata._core.layout.keys import (
    DICT_KIND,
    RAGGED,
    STRING,
    TENSOR,
    TENSOR_KIND,
    Key,
    Leaf,
    flatten,
    key_name,
    key_names,
    nest,
)
from rbdata._core.layout.values import (
    cast_rule,
    convert,
    example_value,
    one_item_message,
    split_variable,
    to_tensor,
    variable_leaf,
)
from rbdata._core.spec import LayoutSpec, LeafSpec

__all__ = ["RAGGED", "STRING", "TENSOR", "Key", "Layout", "Leaf", "flatten", "nest"]

_CPU = torch.device("cpu")


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
        if kind not in (TENSOR_KIND, DICT_KIND):
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
                leaf = variable_leaf(key, value, batched, key in ragged)
                if leaf is not None:
                    leaves.append(leaf)
                    continue
            t = to_tensor(value, name)
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
        return self.spec().to_json()

    def spec(self) -> LayoutSpec:
        """The layout as a metadata record (dtypes as names; see :mod:`rbdata._core.spec`)."""
        leaves = (
            LeafSpec(leaf.key, leaf.shape, str(leaf.dtype)[6:], leaf.kind) for leaf in self.leaves
        )
        return LayoutSpec(self.kind, tuple(leaves))

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Layout:
        """Rebuild a layout written by :meth:`to_json`; refuses unknown dtypes.

        The JSON is read by :meth:`LayoutSpec.from_json <rbdata._core.spec.LayoutSpec>`, the
        torch-free reader that ``rbdata inspect`` uses too.
        """
        return cls.from_spec(LayoutSpec.from_json(obj))

    @classmethod
    def from_spec(cls, spec: LayoutSpec) -> Layout:
        """The layout of a checked metadata record (dtype names become torch dtypes)."""
        leaves = [
            Leaf(leaf.key, leaf.shape, getattr(torch, leaf.dtype), leaf.kind)
            for leaf in spec.leaves
        ]
        return cls(spec.kind, leaves)

    # --- validation ----------------------------------------------------------------------
    def _castable(self, given: torch.dtype, expected: torch.dtype) -> bool:
        return cast_rule(given, expected)[0]

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
            expected = "a tensor" if self.kind == TENSOR_KIND else "a TensorDict or dict"
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
                items = split_variable(leaf, value, batched, self._castable, device, densify)
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
            t = value if type(value) is torch.Tensor else to_tensor(value, leaf.name)
            try:
                shape = t.shape
            except RuntimeError:  # a strided nested tensor has no shape
                convert(t, leaf, device, densify)
                raise
            if batched:
                if not shape:
                    if not leaf_shape:
                        raise ValueError(one_item_message(leaf.name, leaf_shape, ()))
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
                    raise ValueError(one_item_message(leaf.name, leaf_shape, tuple(shape)))
                raise ValueError(
                    f"key {leaf.name}: expected per-item shape {tuple(leaf_shape)}, "
                    f"got {tuple(item_shape)}"
                )
            if t.dtype is not dtype:
                if not self._castable(t.dtype, dtype):
                    raise TypeError(
                        f"key {leaf.name}: expected dtype {dtype} (or one that casts "
                        f"safely to it), got {t.dtype}{example_value(t)}"
                    )
                t = convert(t, leaf, device, densify)
            elif (
                t.requires_grad
                or t.layout is not strided
                or (not t.is_cpu if on_cpu else t.is_meta if device is None else t.device != device)
            ):
                t = convert(t, leaf, device, densify)
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
        if self.kind == TENSOR_KIND:
            return tensors[0]
        source = nest(zip(self.keys, tensors, strict=True))
        if extra:
            source.update(extra)
        return TensorDict._new_unsafe(
            source=source,  # type: ignore[arg-type]  # nested dicts become sub-TensorDicts
            batch_size=batch_size,
            device=device,
        )
