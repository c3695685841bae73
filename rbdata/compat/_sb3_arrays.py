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
        if not isinstance(target, dict):
            _write(target, _fit(target, value, self.name))
            return
        if not isinstance(value, Mapping) or set(value) != set(target):
            raise ValueError(f"{self.name}: expected a dict with keys {list(target)}")
        # every key checked before any is written: a bad one changes nothing
        fitted = {k: _fit(a, value[k], f"{self.name}[{k!r}]") for k, a in target.items()}
        for key, array in target.items():
            _write(array, fitted[key])


def _write(target: Any, fitted: Any) -> None:
    if isinstance(target, torch.Tensor):
        target.copy_(fitted)
    else:
        np.copyto(target, fitted, "unsafe")  # numpy assignment's casting, as SB3's


def _fit(target: Any, value: Any, name: str) -> Any:
    """``value`` broadcast to ``target``'s shape (a tensor for a tensor target)."""
    try:
        if isinstance(target, torch.Tensor):
            return torch.as_tensor(np.asarray(value)).broadcast_to(target.shape)
        return np.broadcast_to(np.asarray(value), target.shape)
    except (ValueError, TypeError, RuntimeError) as err:
        shape = getattr(value, "shape", None)
        raise ValueError(
            f"{name}: expected shape {tuple(target.shape)}, got {shape}: {err}"
        ) from None
