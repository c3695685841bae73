"""The torch-free layout records (:mod:`rbdata._core.spec`) against torch itself."""

from __future__ import annotations

import pytest
import torch

from rbdata._core.layout import Layout
from rbdata._core.spec import DTYPES, LayoutSpec


def test_every_torch_dtype_name_is_known_with_its_size() -> None:
    names = {n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
    assert set(DTYPES) == names
    for name in names:
        dtype = getattr(torch, name)
        info = DTYPES[name]
        assert info.name == str(dtype).removeprefix("torch."), name
        assert (info.itemsize, info.floating) == (dtype.itemsize, dtype.is_floating_point), name


def test_layout_and_spec_read_the_same_json() -> None:
    layout = Layout.from_data(
        {"obs": torch.zeros(2, 3, 4), "next": {"done": torch.zeros(2, 1, dtype=torch.bool)}},
        batched=True,
    )
    spec = LayoutSpec.from_json(layout.to_json())
    assert spec.kind == layout.kind
    got = [(s.key, s.shape, s.dtype, s.kind, s.numel * s.itemsize) for s in spec.leaves]
    want = [
        (leaf.key, leaf.shape, str(leaf.dtype)[6:], leaf.kind, leaf.numel * leaf.dtype.itemsize)
        for leaf in layout.leaves
    ]
    assert got == want


@pytest.mark.parametrize(
    ("leaf", "kind", "message"),
    [
        ({"key": ["a"], "shape": [], "dtype": "Tensor"}, "tensordict", "unknown dtype 'Tensor'"),
        ({"key": ["a"], "shape": [], "dtype": "int8", "kind": "x"}, "tensordict", "leaf kind"),
        ({"key": ["a"], "shape": [], "dtype": "int8"}, "table", "kind must be"),
    ],
)
def test_spec_and_layout_refuse_alike(leaf: dict, kind: str, message: str) -> None:
    obj = {"kind": kind, "leaves": [leaf]}
    with pytest.raises(ValueError, match=message):
        LayoutSpec.from_json(obj)
    with pytest.raises(ValueError, match=message):
        Layout.from_json(obj)
