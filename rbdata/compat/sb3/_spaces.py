"""Shapes and dtypes of Stable-Baselines3 buffers, read from gymnasium spaces without SB3.

The spaces are recognised by their class names (``Box``, ``Discrete``, ``MultiDiscrete``,
``MultiBinary``, or subclasses) and read through ``.shape``, ``.dtype``, ``.n`` and ``.nvec``:
nothing here imports gymnasium or stable-baselines3. The rules are SB3's
(``stable_baselines3.common.preprocessing.get_obs_shape`` / ``get_action_dim`` and
``ReplayBuffer._maybe_cast_dtype``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = [
    "ObsSpec",
    "action_dim",
    "action_dtype",
    "dict_obs_specs",
    "is_dict_space",
    "maybe_cast_dtype",
    "obs_spec",
    "resolve_device",
    "space_kind",
]

_KINDS = ("Box", "Discrete", "MultiDiscrete", "MultiBinary")


def space_kind(space: Any, name: str) -> str:
    """``"Box"``, ``"Discrete"``, ``"MultiDiscrete"`` or ``"MultiBinary"`` for ``space``.

    Raises:
        NotImplementedError: for a ``Dict`` space (:class:`DictReplayBuffer` takes those) or
            a ``Tuple`` space (SB3 has no buffer for them).
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
        if cls.__name__ == "Dict":
            raise NotImplementedError(
                f"{name}: Dict spaces need rbdata.compat.sb3.DictReplayBuffer (as in SB3), "
                "not ReplayBuffer"
            )
        if cls.__name__ == "Tuple":
            raise NotImplementedError(
                f"{name}: Tuple spaces are not supported (as in SB3); flatten the space"
            )
    raise TypeError(
        f"{name}: expected a gymnasium Box, Discrete, MultiDiscrete or MultiBinary space, "
        f"got {type(space).__name__}"
    )


class ObsSpec(NamedTuple):
    """How one observation array is stored: per-env shape, dtype, and whether ``Discrete``."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    discrete: bool


def obs_spec(space: Any, name: str = "observation_space") -> ObsSpec:
    """The :class:`ObsSpec` of a ``Box``, ``Discrete``, ``MultiDiscrete`` or ``MultiBinary``.

    Examples:
        >>> class Discrete:
        ...     n, dtype = 5, np.dtype(np.int64)
        >>> obs_spec(Discrete())
        ObsSpec(shape=(1,), dtype=dtype('int64'), discrete=True)
    """
    kind = space_kind(space, name)
    if kind == "Discrete":
        shape: tuple[int, ...] = (1,)
    elif kind == "MultiDiscrete":
        shape = (len(space.nvec),)
    else:
        shape = tuple(int(d) for d in space.shape)
    return ObsSpec(shape, np.dtype(space.dtype), kind == "Discrete")


def is_dict_space(space: Any) -> bool:
    """Whether ``space`` is a gymnasium ``Dict`` space (or a subclass), by class name."""
    return any(cls.__name__ == "Dict" for cls in type(space).__mro__)


def dict_obs_specs(space: Any) -> dict[str, ObsSpec]:
    """One :class:`ObsSpec` per key of a ``Dict`` observation space, in the space's order.

    Raises:
        TypeError: if ``space`` is not a ``Dict`` space, or a key is not a non-empty string.
        NotImplementedError: for a nested ``Dict`` or a ``Tuple`` sub-space (as SB3).
        ValueError: for a ``Dict`` space without keys.

    Examples:
        >>> from gymnasium import spaces
        >>> space = spaces.Dict({"a": spaces.Box(0, 1, (2,)), "b": spaces.Discrete(3)})
        >>> specs = dict_obs_specs(space)
        >>> {k: (v.shape, str(v.dtype)) for k, v in specs.items()}
        {'a': ((2,), 'float32'), 'b': ((1,), 'int64')}
    """
    subspaces: Any = getattr(space, "spaces", None)
    if not is_dict_space(space) or not hasattr(subspaces, "items"):
        raise TypeError(
            "observation_space: DictReplayBuffer must be used with Dict obs space only, "
            f"got {type(space).__name__}"
        )
    specs: dict[str, ObsSpec] = {}
    for key, sub in subspaces.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"observation_space: expected string keys, got {key!r}")
        if is_dict_space(sub):
            raise NotImplementedError(
                f"observation_space[{key!r}]: nested Dict spaces are not supported (as in SB3)"
            )
        specs[key] = obs_spec(sub, f"observation_space[{key!r}]")
    if not specs:
        raise ValueError("observation_space: a Dict space without keys")
    return specs


def maybe_cast_dtype(dtype: Any) -> Any:
    """SB3's ``ReplayBuffer._maybe_cast_dtype``: ``np.float64`` becomes ``np.float32``.

    Any other dtype (``None`` included) is returned unchanged.

    Examples:
        >>> maybe_cast_dtype(np.float64), maybe_cast_dtype(np.dtype("int8")), maybe_cast_dtype(None)
        (<class 'numpy.float32'>, dtype('int8'), None)
    """
    if dtype == np.float64:
        return np.float32
    return dtype


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
    return np.dtype(maybe_cast_dtype(np.dtype(space.dtype)))


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
