"""``UniformSampler``: uniform indices, with or without replacement within a batch."""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

import torch

from rbdata._core.shown import shown
from rbdata.samplers.base import Sampler, check_batch_size, check_bool

__all__ = ["UniformSampler"]


class UniformSampler(Sampler):
    """Uniform random indices over the filled part of the storage.

    Args:
        data_source: the storage to sample from (``None``: bound by the buffer).
        replacement: draw with replacement. Without it, each batch has distinct indices
            (batches are independent of each other).
        num_samples: indices per iteration of ``iter(sampler)``; default ``len(data_source)``.
        generator: random generator (``None``: a private one seeded from torch's global RNG).

    Examples:
        >>> import torch
        >>> sampler = UniformSampler(range(10), generator=torch.Generator().manual_seed(0))
        >>> sampler.sample(4).tolist()
        [4, 9, 3, 0]
    """

    def __init__(
        self,
        data_source: Sized | None = None,
        replacement: bool = True,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(data_source, generator)
        self.replacement = check_bool(replacement, "replacement")
        if num_samples is not None and (not isinstance(num_samples, int) or num_samples <= 0):
            raise ValueError(f"num_samples must be a positive integer, got {shown(num_samples)}")
        self.num_samples = num_samples

    def config(self) -> dict[str, Any]:
        """``replacement`` and ``num_samples``."""
        return {"replacement": self.replacement, "num_samples": self.num_samples}

    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Draw ``batch_size`` indices (no extras)."""
        return self.sample(batch_size), {}

    def sample(self, batch_size: int) -> torch.Tensor:
        """Draw ``batch_size`` indices (a positive int or integer-like, e.g. ``np.int64``)."""
        batch_size = check_batch_size(batch_size)
        n = self._length()
        if self.replacement:
            return torch.randint(n, (batch_size,), generator=self.generator)
        if batch_size > n:
            raise ValueError(
                f"batch_size {batch_size} is larger than the {n} items available for "
                "sampling without replacement"
            )
        return torch.randperm(n, generator=self.generator)[:batch_size]

    def __len__(self) -> int:
        if self.num_samples is not None:
            return self.num_samples
        return super().__len__()
