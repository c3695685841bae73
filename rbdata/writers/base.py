"""The writer contract: choose the slots incoming data goes to."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from rbdata.storages.base import Storage

__all__ = ["Writer"]


class Writer(ABC):
    """Base class of writers: ``add`` one item, ``extend`` with a batch; stateful (a cursor).

    Writers validate through the storage's two-phase write (``prepare`` then ``commit``), so
    bad input never reaches the data or moves the cursor.
    """

    @abstractmethod
    def add(self, storage: Storage, item: Any) -> int:
        """Write one item; return its slot."""

    @abstractmethod
    def extend(self, storage: Storage, data: Any) -> torch.Tensor:
        """Write a batch; return the slots as a ``LongTensor``."""

    def reset(self) -> None:  # noqa: B027 - optional hook, stateless writers need nothing
        """Forget the write position (called by ``ReplayBuffer.empty``)."""

    def config(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this writer (used by checkpoints)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The writer's state (JSON-able values and tensors)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - stateless default
        """Restore a state from :meth:`state_dict`."""
