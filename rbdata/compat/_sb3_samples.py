"""The sample tuples of :mod:`rbdata.compat.sb3` (SB3's field names), checks, default RNG."""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = [
    "DictReplayBufferSamples",
    "PrioritizedReplayBufferSamples",
    "ReplayBufferSamples",
    "positive_int",
    "quiet_generator",
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


def quiet_generator() -> torch.Generator:
    """A generator seeded from the state of torch's global RNG, which it leaves as it was.

    SB3's buffer draws nothing from torch's RNG, so neither may building ours: a model's
    initial weights and its whole run then come out as with SB3's buffer for the same seed.
    ``torch.manual_seed`` still decides the seed (a hash of the global state).

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> a, state = quiet_generator(), torch.get_rng_state()
        >>> _ = torch.manual_seed(0)
        >>> b = quiet_generator()
        >>> torch.equal(state, torch.get_rng_state()), a.initial_seed() == b.initial_seed()
        (True, True)
    """
    digest = hashlib.blake2b(torch.get_rng_state().numpy().tobytes(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little"))
