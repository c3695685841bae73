"""The sample tuples of :mod:`rbdata.compat.sb3` (SB3's field names) and argument checks."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = [
    "DictReplayBufferSamples",
    "PrioritizedReplayBufferSamples",
    "ReplayBufferSamples",
    "positive_int",
]


class ReplayBufferSamples(NamedTuple):
    """SB3's ``ReplayBufferSamples``: same fields, shapes ``[B, ...]`` and ``[B, 1]``."""

    observations: torch.Tensor
    actions: torch.Tensor
    next_observations: torch.Tensor
    dones: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor | None = None


class DictReplayBufferSamples(NamedTuple):
    """SB3's ``DictReplayBufferSamples``: observations are dicts of ``[B, ...]`` tensors."""

    observations: dict[str, torch.Tensor]
    actions: torch.Tensor
    next_observations: dict[str, torch.Tensor]
    dones: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor | None = None


class PrioritizedReplayBufferSamples(NamedTuple):
    """:class:`ReplayBufferSamples` plus ``indices`` ``[B]`` and importance ``weights`` ``[B, 1]``.

    ``indices`` are flat transition indices ``slot * n_envs + env``, for
    :meth:`PrioritizedReplayBuffer.update_priorities`.
    """

    observations: torch.Tensor
    actions: torch.Tensor
    next_observations: torch.Tensor
    dones: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor | None = None
    indices: torch.Tensor | None = None
    weights: torch.Tensor | None = None


def positive_int(value: Any, name: str) -> int:
    """``value`` as an ``int`` if it is a positive integer (not a bool).

    Raises:
        ValueError: naming ``name`` otherwise.

    Examples:
        >>> positive_int(np.int64(3), "n_envs")
        3
        >>> positive_int(0, "n_envs")
        Traceback (most recent call last):
        ...
        ValueError: n_envs: expected a positive int, got 0
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return int(value)
