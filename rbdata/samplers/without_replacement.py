"""``SamplerWithoutReplacement``: epochs over a shuffled permutation of the storage."""

from __future__ import annotations

import math
from collections.abc import Sized
from typing import Any

import torch

from rbdata._core.torchrl_names import WITHOUT_REPLACEMENT_KEYWORDS, torchrl_keywords
from rbdata.samplers.base import Sampler, check_bool

__all__ = ["SamplerWithoutReplacement"]


class SamplerWithoutReplacement(Sampler):
    """Every item once per epoch, in a random order; a new permutation starts each epoch.

    ``sample(batch_size)`` hands out consecutive slices of the epoch's permutation. The last
    batch of an epoch is shorter unless ``drop_last``, in which case it is skipped. Items added
    during an epoch join the next one. Iterating the sampler, a
    :class:`~rbdata.samplers.BatchSampler` over it, or a :class:`~rbdata.ReplayBuffer` using
    it runs one fresh epoch.

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

    epoch_based = True

    @torchrl_keywords(WITHOUT_REPLACEMENT_KEYWORDS)
    def __init__(
        self,
        data_source: Sized | None = None,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(data_source, generator)
        self.drop_last = check_bool(drop_last, "drop_last")
        self._perm: torch.Tensor | None = None
        self._pos = 0

    def epoch_over(self, batch_size: int) -> bool:
        """Whether the permutation is used up (or, with ``drop_last``, has no full batch left)."""
        perm = self._perm
        if perm is None:
            return True
        remaining = perm.shape[0] - self._pos
        return remaining <= 0 or (self.drop_last and remaining < batch_size)

    def _new_epoch(self) -> None:
        n = self._length()
        self._perm = torch.randperm(n, generator=self.generator)
        self._pos = 0

    def begin_epoch(self) -> None:
        """Draw a fresh permutation of the items."""
        self._new_epoch()

    def _epoch_batches(self, batch_size: int) -> int:
        n = len(self)
        return n // batch_size if self.drop_last else math.ceil(n / batch_size)

    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The next ``batch_size`` indices of the epoch (a new epoch starts when it ends)."""
        if self.epoch_over(batch_size):
            if self.drop_last and batch_size > self._length():
                raise ValueError(
                    f"batch_size {batch_size} is larger than the {self._length()} items in the "
                    "buffer, so drop_last=True leaves no batch"
                )
            self._new_epoch()
        perm = self._perm
        assert perm is not None  # set by _new_epoch
        out = perm[self._pos : self._pos + batch_size]
        self._pos += out.shape[0]
        return out, {}

    def reset(self) -> None:
        """End the current epoch."""
        self._perm = None
        self._pos = 0

    def config(self) -> dict[str, Any]:
        """``drop_last``."""
        return {"drop_last": self.drop_last}

    def state_dict(self) -> dict[str, Any]:
        """Generator state, the epoch's permutation and the position in it."""
        state = super().state_dict()
        state.update(perm=self._perm, pos=self._pos)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore generator, permutation and position."""
        perm, pos = state["perm"], int(state["pos"])
        if perm is not None:
            perm = torch.as_tensor(perm)
            m = perm.numel()
            bound = self.data_source is not None and m > len(self.data_source)
            if perm.dim() != 1 or perm.dtype != torch.long or bound:
                raise ValueError(f"state: perm must be a 1-D LongTensor, got {perm.dtype} {m}")
            if not torch.equal(perm.sort().values, torch.arange(m)) or not 0 <= pos <= m:
                raise ValueError("state: perm is not a permutation, or pos is out of range")
        super().load_state_dict(state)
        self._perm = perm
        self._pos = pos
