"""Shared data of the MixedBuffer tests: small storages and the bundled D4RL sample, converted."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from rbdata import PrioritizedSampler, ReplayBuffer, TensorStorage
from rbdata.datasets import D4RL, write_sample

#: the keys an online buffer shares with the D4RL sample
ONLINE_KEYS = ["observation", "action", ("next", "observation"), ("next", "reward")]
ONLINE_KEYS += [("next", "done"), ("next", "terminated"), ("next", "truncated")]


def rows(n: int, start: float = 0.0, dim: int = 3) -> TensorDict:
    """``n`` rows whose ``"id"`` is ``start + row``: a row says where it came from."""
    ids = torch.arange(n, dtype=torch.float64) + start
    return TensorDict(
        {"id": ids, "obs": ids[:, None].float().expand(n, dim).clone()}, batch_size=[n]
    )


def storage(n: int, start: float, capacity: int | None = None) -> TensorStorage:
    """A storage holding ``rows(n, start)``."""
    out = TensorStorage(capacity or max(n, 1))
    if n:
        out.set(slice(0, n), rows(n, start))
    return out


def prioritized_buffer(capacity: int, n: int, start: float, seed: int) -> ReplayBuffer:
    """A live buffer with a prioritized sampler holding ``rows(n, start)``."""
    gen = torch.Generator().manual_seed(seed)
    sampler = PrioritizedSampler(capacity, alpha=1.0, beta=0.5, generator=gen)
    rb = ReplayBuffer(TensorStorage(capacity), sampler)
    if n:
        rb.extend(rows(n, start))
    return rb


def reference_counts(weights: list[float], total: int) -> list[int]:
    """Hamilton's method, one seat at a time, in exact arithmetic (a brute-force reference).

    Every source first gets the whole part of its quota; then, seat after seat, the source
    whose quota exceeds its seats the most gets one (ties: the earlier source).
    """
    wsum = sum(Fraction(w) for w in weights)
    quotas = [Fraction(w) * total / wsum for w in weights]
    seats = [math.floor(q) for q in quotas]
    while sum(seats) < total:
        best = max(range(len(seats)), key=lambda i: (quotas[i] - seats[i], -i))
        seats[best] += 1
    return seats


def d4rl_sample(root: Path, **kwargs: Any) -> D4RL:
    """The bundled ``cartpole-random-v0`` sample, built and converted under ``root``."""
    file = root / "cartpole-random-v0.hdf5"
    if not file.exists():
        write_sample("cartpole-random-v0", file)
    return D4RL("cartpole-random-v0", root=root / "cache", file=file, progress=False, **kwargs)
