"""The sampler contract: a seeded, stateful :class:`torch.utils.data.Sampler` of storage indices."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler as TorchSampler

from rbdata.errors import EmptyBufferError

__all__ = ["Sampler", "check_batch_size", "default_generator"]


def default_generator() -> torch.Generator:
    """A private generator seeded once from torch's global RNG (so ``torch.manual_seed`` rules).

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> a = default_generator().initial_seed()
        >>> _ = torch.manual_seed(0)
        >>> a == default_generator().initial_seed()
        True
    """
    seed = int(torch.empty((), dtype=torch.int64).random_().item())
    return torch.Generator().manual_seed(seed)


def check_batch_size(batch_size: Any) -> int:
    """Return ``batch_size`` as a positive int or raise ``ValueError`` naming it."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    return batch_size


class Sampler(TorchSampler[int]):
    """Base class: iterate indices like any torch sampler, or draw a batch with ``sample``.

    Args:
        data_source: the storage (anything with ``__len__``) to sample from; ``None`` lets a
            :class:`~rbdata.ReplayBuffer` bind its storage.
        generator: the random generator; ``None`` creates a private one seeded from torch's
            global RNG. Its state is part of :meth:`state_dict`.
    """

    def __init__(self, data_source: Sized | None, generator: torch.Generator | None) -> None:
        self.data_source = data_source
        self.generator = default_generator() if generator is None else generator

    def _length(self) -> int:
        source = self.data_source
        if source is None:
            raise RuntimeError(
                f"{type(self).__name__} has no data_source: pass one or use it in a ReplayBuffer"
            )
        n = len(source)
        if n == 0:
            raise EmptyBufferError("cannot sample: the buffer is empty (add or extend first)")
        return n

    @abstractmethod
    def sample(self, batch_size: int) -> torch.Tensor:
        """Draw one batch of ``batch_size`` indices as a ``LongTensor``."""

    def batches(self, batch_size: int) -> Iterator[torch.Tensor]:
        """Index batches for ``for batch in buffer``: endless unless the sampler has epochs."""
        while True:
            yield self.sample(batch_size)

    def reset(self) -> None:
        """Forget any epoch position (called by ``ReplayBuffer.empty``)."""

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state, including its generator."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`."""
        self.generator.set_state(state["generator"])
