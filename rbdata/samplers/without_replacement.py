"""``SamplerWithoutReplacement``: epochs over a shuffled permutation of the storage."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch

from rbdata.samplers.base import Sampler

__all__ = ["SamplerWithoutReplacement"]


class SamplerWithoutReplacement(Sampler):
    """Every item once per epoch, in a random order; a new permutation starts each epoch.

    ``sample(batch_size)`` hands out consecutive slices of the epoch's permutation. The last
    batch of an epoch is shorter unless ``drop_last``, in which case it is skipped. Items added
    during an epoch join the next one. Iterating a :class:`~rbdata.ReplayBuffer` with this
    sampler runs one epoch.

    Args:
        data_source: the storage to sample from (``None``: bound by the buffer).
        drop_last: skip the incomplete last batch of each epoch.
        generator: random generator (``None``: a private one seeded from torch's global RNG).

    Examples:
        >>> import torch
        >>> gen = torch.Generator().manual_seed(0)
        >>> sampler = SamplerWithoutReplacement(range(5), generator=gen)
        >>> sorted(torch.cat([sampler.sample(2) for _ in range(3)]).tolist())
        [0, 1, 2, 3, 4]
    """

    def __init__(
        self,
        data_source: Sized | None = None,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(data_source, generator)
        self.drop_last = drop_last
        self._perm: torch.Tensor | None = None
        self._pos = 0

    def _epoch_done(self, batch_size: int) -> bool:
        perm = self._perm
        if perm is None:
            return True
        remaining = perm.shape[0] - self._pos
        return remaining <= 0 or (self.drop_last and remaining < batch_size)

    def sample(self, batch_size: int) -> torch.Tensor:
        """The next ``batch_size`` indices of the epoch (a new epoch starts when it ends)."""
        if self._epoch_done(batch_size):
            n = self._length()
            if self.drop_last and batch_size > n:
                raise ValueError(
                    f"batch_size {batch_size} is larger than the {n} items in the buffer, "
                    "so drop_last=True leaves no batch"
                )
            self._perm = torch.randperm(n, generator=self.generator)
            self._pos = 0
        perm = self._perm
        assert perm is not None
        out = perm[self._pos : self._pos + batch_size]
        self._pos += out.shape[0]
        return out

    def batches(self, batch_size: int) -> Iterator[torch.Tensor]:
        """The remaining batches of the current epoch (or of a new one if it has ended)."""
        yield self.sample(batch_size)
        while not self._epoch_done(batch_size):
            yield self.sample(batch_size)

    def __len__(self) -> int:
        return len(self.data_source) if self.data_source is not None else 0

    def __iter__(self) -> Iterator[int]:
        yield from torch.randperm(self._length(), generator=self.generator).tolist()

    def reset(self) -> None:
        """End the current epoch."""
        self._perm = None
        self._pos = 0

    def state_dict(self) -> dict[str, Any]:
        """Generator state, the epoch's permutation and the position in it."""
        state = super().state_dict()
        state.update(perm=self._perm, pos=self._pos)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore generator, permutation and position."""
        super().load_state_dict(state)
        self._perm = state["perm"]
        self._pos = int(state["pos"])
