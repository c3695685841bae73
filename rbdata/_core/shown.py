"""How error messages show a value the user passed: never the values of a tensor or array.

A tensor, array or TensorDict given where a number was expected (torchrl's
``TensorStorage(tensor)``) would otherwise print all its values into the message.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["shown"]

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80


def shown(value: Any) -> str:
    """``value`` for a message: data by type, shape and dtype; anything else as a short repr.

    Examples:
        >>> import torch
        >>> shown(torch.zeros(1000, 3))
        'a Tensor of shape (1000, 3) and dtype torch.float32'
        >>> shown(0), shown("ten"), shown(torch.tensor(4))
        ('0', "'ten'", 'tensor(4)')
    """
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, type):
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            dims = None
        if dims:  # data with at least one dimension: never its values
            dtype = getattr(value, "dtype", None)
            kind = f"a {type(value).__name__} of shape {dims}"
            return kind if dtype is None else f"{kind} and dtype {dtype}"
    return _REPR.repr(value)
