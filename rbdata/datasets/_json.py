"""Source metadata as JSON: what ``dataset.json`` keeps of HDF5 and Minari metadata."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = ["json_safe"]


def json_safe(value: Any, special: Callable[[Any], Any] | None = None) -> Any:
    """``value`` as JSON: text decoded as UTF-8, numpy values as Python numbers or lists.

    Mappings keep their (stringified) keys, sets become sorted lists, and anything else
    becomes its ``str``. ``special`` may claim a value first (return non-``None``), e.g. to
    serialize gymnasium spaces.

    Examples:
        >>> json_safe({"algorithm": np.bytes_(b"SAC"), "w": np.zeros((1, 2), np.float32)})
        {'algorithm': 'SAC', 'w': [[0.0, 0.0]]}
        >>> json_safe({np.int64(3), np.int64(1)}), json_safe(np.bool_(True))
        ([1, 3], True)
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if special is not None:
        claimed = special(value)
        if claimed is not None:
            return claimed
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, special) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(v, special) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [json_safe(v, special) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biuf":  # tolist already gives Python numbers
            return value.tolist()
        return json_safe(value.tolist(), special)
    if isinstance(value, np.generic):
        return json_safe(value.item(), special)
    return str(value)
