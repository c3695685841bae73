"""Layouts as metadata files write them, read without torch: leaf kinds, dtype names, shapes.

A storage's metadata (``layout.json``, ``_rbdata.json``, ``frames.json``) records its layout
as JSON: a kind, and per leaf a key path, a per-item shape, a dtype *name* (``"float32"``)
and a leaf kind. :class:`LayoutSpec` is that record checked, with dtypes kept as names, so
that ``rbdata inspect`` reads metadata without importing torch;
:class:`~rbdata._core.layout.Layout` is built from it (``Layout.from_json``), so both go
through the same checks. :data:`DTYPES` names every torch dtype (and its aliases) with its
canonical name, item size and whether it is floating (``tests/core/test_spec.py`` checks it
against torch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "DICT_KIND",
    "DTYPES",
    "RAGGED",
    "STRING",
    "TENSOR",
    "TENSOR_KIND",
    "DtypeInfo",
    "LayoutSpec",
    "LeafSpec",
]

#: What a layout holds: a plain tensor (one leaf, key ``()``) or dict-like items.
TENSOR_KIND, DICT_KIND = "tensor", "tensordict"

#: Kinds of leaves: fixed-shape tensors (every storage), and the variable-length kinds that
#: only :class:`~rbdata.storages.ArrowStorage` keeps: tensors whose first dimension varies per
#: item (``shape`` is then the fixed trailing shape) and strings.
TENSOR, RAGGED, STRING = "tensor", "ragged", "string"


class DtypeInfo(NamedTuple):
    """A torch dtype as metadata names it: canonical name, bytes per element, floating."""

    name: str
    itemsize: int
    floating: bool


def _table() -> dict[str, DtypeInfo]:
    out: dict[str, DtypeInfo] = {}
    for names, itemsize, floating in (
        ("float64", 8, True),
        ("float32", 4, True),
        ("float16 bfloat16", 2, True),
        ("float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu", 1, True),
        ("float4_e2m1fn_x2", 1, True),
        ("complex128", 16, False),
        ("complex64", 8, False),
        ("complex32", 4, False),
        ("int64 uint64", 8, False),
        ("int32 uint32 qint32", 4, False),
        ("int16 uint16 bits16", 2, False),
        ("int8 uint8 bool qint8 quint8 quint2x4 quint4x2 bits8 bits1x8 bits2x4 bits4x2", 1, False),
        ("int1 int2 int3 int4 int5 int6 int7 uint1 uint2 uint3 uint4 uint5 uint6 uint7", 1, False),
    ):
        for name in names.split():
            out[name] = DtypeInfo(name, itemsize, floating)
    for alias, name in (
        ("double", "float64"),
        ("float", "float32"),
        ("half", "float16"),
        ("cdouble", "complex128"),
        ("cfloat", "complex64"),
        ("chalf", "complex32"),
        ("long", "int64"),
        ("int", "int32"),
        ("short", "int16"),
        ("bit", "uint1"),
    ):
        out[alias] = out[name]
    return out


#: every dtype name torch has (``getattr(torch, name)`` is a ``torch.dtype``), aliases included
DTYPES: dict[str, DtypeInfo] = _table()


@dataclass(frozen=True)
class LeafSpec:
    """One leaf as metadata records it: key path, per-item shape, dtype name and kind."""

    key: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    kind: str = TENSOR

    @property
    def numel(self) -> int:
        """Number of elements of one item of this leaf."""
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element of the leaf's dtype."""
        return DTYPES[self.dtype].itemsize

    @property
    def name(self) -> str:
        """Human-readable key, e.g. ``('next', 'reward')`` or ``'observation'``."""
        return repr(self.key[0]) if len(self.key) == 1 else repr(self.key)


@dataclass(frozen=True)
class LayoutSpec:
    """A layout as metadata records it (see the module doc); dtypes as canonical names.

    Examples:
        >>> spec = LayoutSpec.from_json(
        ...     {"kind": "tensordict", "leaves": [{"key": ["obs"], "shape": [3], "dtype": "float"}]}
        ... )
        >>> spec.leaves[0].dtype, spec.leaves[0].itemsize, spec.leaves[0].numel
        ('float32', 4, 3)
    """

    kind: str
    leaves: tuple[LeafSpec, ...]

    def to_json(self) -> dict[str, Any]:
        """The JSON object :meth:`from_json` reads (what ``Layout.to_json`` writes)."""
        return {
            "kind": self.kind,
            "leaves": [
                {
                    "key": list(leaf.key),
                    "shape": list(leaf.shape),
                    "dtype": leaf.dtype,
                    **({} if leaf.kind == TENSOR else {"kind": leaf.kind}),
                }
                for leaf in self.leaves
            ],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> LayoutSpec:
        """Read a layout's JSON (``Layout.to_json``); refuses unknown dtypes and leaf kinds.

        Raises:
            ValueError: an unknown dtype name, leaf kind or layout kind.
            KeyError, TypeError: a field missing or of another type.
        """
        leaves = []
        for entry in obj["leaves"]:
            dtype = DTYPES.get(str(entry["dtype"]))
            if dtype is None:
                raise ValueError(f"unknown dtype {entry['dtype']!r} in layout")
            kind = str(entry.get("kind", TENSOR))
            if kind not in (TENSOR, RAGGED, STRING):
                raise ValueError(f"unknown leaf kind {kind!r} in layout")
            shape = tuple(int(s) for s in entry["shape"])
            leaves.append(LeafSpec(tuple(entry["key"]), shape, dtype.name, kind))
        kind = str(obj["kind"])
        if kind not in (TENSOR_KIND, DICT_KIND):
            raise ValueError(f"kind must be 'tensor' or 'tensordict', got {kind!r}")
        return cls(kind, tuple(leaves))
