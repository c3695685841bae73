"""Shapes and dtypes of Stable-Baselines3 buffers, read from gymnasium spaces without SB3.

The spaces are recognised by their class names (``Box``, ``Discrete``, ``MultiDiscrete``,
``MultiBinary``, or subclasses) and read through ``.shape``, ``.dtype``, ``.n`` and ``.nvec``:
nothing here imports gymnasium or stable-baselines3. The rules are SB3's
(``stable_baselines3.common.preprocessing.get_obs_shape`` / ``get_action_dim`` and
``ReplayBuffer._maybe_cast_dtype``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = ["action_dim", "action_dtype", "obs_dtype", "obs_shape", "resolve_device", "space_kind"]

_KINDS = ("Box", "Discrete", "MultiDiscrete", "MultiBinary")


def space_kind(space: Any, name: str) -> str:
    """``"Box"``, ``"Discrete"``, ``"MultiDiscrete"`` or ``"MultiBinary"`` for ``space``.

    Raises:
        NotImplementedError: for a ``Dict`` or ``Tuple`` space (SB3's ``DictReplayBuffer``
            has no rbdata counterpart yet).
        TypeError: for anything that is not one of the four spaces.

    Examples:
        >>> class Box:
        ...     shape, dtype = (3,), np.dtype(np.float32)
        >>> space_kind(Box(), "observation_space")
        'Box'
    """
    for cls in type(space).__mro__:
        if cls.__name__ in _KINDS:
            return cls.__name__
        if cls.__name__ in ("Dict", "Tuple"):
            raise NotImplementedError(
                f"{name}: {cls.__name__} spaces are not supported by rbdata.compat.sb3 "
                "(SB3's DictReplayBuffer has no counterpart yet); flatten the space"
            )
    raise TypeError(
        f"{name}: expected a gymnasium Box, Discrete, MultiDiscrete or MultiBinary space, "
        f"got {type(space).__name__}"
    )


def obs_shape(space: Any) -> tuple[int, ...]:
    """Per-env observation shape as SB3 stores it (``(1,)`` for ``Discrete``)."""
    kind = space_kind(space, "observation_space")
    if kind == "Discrete":
        return (1,)
    if kind == "MultiDiscrete":
        return (len(space.nvec),)
    return tuple(int(d) for d in space.shape)


def obs_dtype(space: Any) -> np.dtype[Any]:
    """The observation dtype (the space's own, as SB3)."""
    space_kind(space, "observation_space")
    return np.dtype(space.dtype)


def action_dim(space: Any) -> int:
    """Flat action size as SB3 stores it (``1`` for ``Discrete``).

    Raises:
        NotImplementedError: for a multi-dimensional ``MultiBinary`` (as SB3).
    """
    kind = space_kind(space, "action_space")
    if kind == "Discrete":
        return 1
    if kind == "MultiDiscrete":
        return len(space.nvec)
    if kind == "MultiBinary":
        if not isinstance(space.n, (int, np.integer)):
            raise NotImplementedError(
                f"action_space: multi-dimensional MultiBinary({space.n}) is not supported "
                "(as in SB3); flatten it"
            )
        return int(space.n)
    return math.prod(int(d) for d in space.shape)


def action_dtype(space: Any) -> np.dtype[Any]:
    """The action dtype: the space's, with ``float64`` stored as ``float32`` (as SB3)."""
    space_kind(space, "action_space")
    dtype = np.dtype(space.dtype)
    return np.dtype(np.float32) if dtype == np.float64 else dtype


def resolve_device(device: torch.device | str) -> torch.device:
    """SB3's ``get_device``: ``"auto"`` is CUDA when available; CUDA falls back to CPU.

    Examples:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device == "auto":
        device = "cuda"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device: expected 'auto', 'cpu', 'cuda'..., got {device!r}") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        return torch.device("cpu")
    return resolved
