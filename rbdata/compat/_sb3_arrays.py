"""SB3's array attributes of :mod:`rbdata.compat.sb3`'s buffers: views of the storage."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["SB3Array"]


class SB3Array:
    """Data descriptor of one of SB3's arrays: a view of the storage's memory.

    Read: ``[buffer_size, n_envs, ...]`` over the storage's buffer (no copy), what SB3 keeps
    as a numpy array. Assigned: the value is copied into that memory (as
    ``buffer.<name>[...] = value``).
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return obj._writer.array(obj._storage, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        target = obj._writer.array(obj._storage, self.name)
        if isinstance(target, dict):
            if not isinstance(value, Mapping) or set(value) != set(target):
                raise ValueError(f"{self.name}: expected a dict with keys {list(target)}")
            for key, array in target.items():
                _copy_into(array, value[key], f"{self.name}[{key!r}]")
        else:
            _copy_into(target, value, self.name)


def _copy_into(target: Any, value: Any, name: str) -> None:
    try:
        if isinstance(target, torch.Tensor):
            target.copy_(torch.as_tensor(np.asarray(value)).broadcast_to(target.shape))
        else:
            np.copyto(target, np.broadcast_to(np.asarray(value), target.shape), "unsafe")
    except (ValueError, TypeError, RuntimeError) as err:
        shape = getattr(value, "shape", None)
        raise ValueError(
            f"{name}: expected shape {tuple(target.shape)}, got {shape}: {err}"
        ) from None
