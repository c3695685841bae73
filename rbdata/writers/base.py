"""The writer contract: choose the slots incoming data goes to."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

from rbdata.storages.base import Storage

__all__ = ["WriteCheck", "Writer"]

#: A pre-write check: called with the slots chosen for a write (an int for ``add``, a
#: ``LongTensor`` for ``extend``) and the data as given, after validation and before anything
#: is written; it raises to refuse the write (e.g. :meth:`rbdata.samplers.Sampler.check_write`).
WriteCheck = Callable[[Any, Any], None]


class Writer(ABC):
    """Base class of writers: ``add`` one item, ``extend`` with a batch; stateful (a cursor).

    Writers validate through the storage's two-phase write (``prepare`` then ``commit``), so
    bad input never reaches the data or moves the cursor. Between the two phases, once the
    slots are chosen, they call ``check(slots, data)`` if given (a :data:`!WriteCheck`): a
    :class:`~rbdata.ReplayBuffer` passes its sampler's ``check_write`` there, so a write the
    sampler would refuse leaves the storage, the writer and the sampler as they were.
    """

    @abstractmethod
    def add(self, storage: Storage, item: Any, check: WriteCheck | None = None) -> int:
        """Write one item; return its slot (``check``: see the class doc)."""

    @abstractmethod
    def extend(self, storage: Storage, data: Any, check: WriteCheck | None = None) -> torch.Tensor:
        """Write a batch; return the slots as a ``LongTensor`` (``check``: see the class doc)."""

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
