"""``ReplayBuffer``'s direct access and lifecycle, in torchrl's spellings where they read well.

``rb[index]``, ``rb.write_count``, ``rb.close()`` / ``with ReplayBuffer(...) as rb:``, the
batch form of ``rb.update_priority(batch)``, and the errors that name rbdata's spelling for
torchrl's other names (``rb.update_tensordict_priority``). These functions are
``ReplayBuffer``'s methods (bound in its class body, as :mod:`rbdata._buffer_sync`'s are).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from tensordict import TensorDictBase

from rbdata._torchrl_names import BUFFER_ATTRIBUTES, torchrl_attribute_error

if TYPE_CHECKING:
    from rbdata.buffer import ReplayBuffer

__all__ = [
    "ClosedStorage",
    "check_open",
    "close",
    "closed",
    "enter",
    "exit",
    "getitem",
    "missing_attribute",
    "priority_of_batch",
    "write_count",
]

_CLOSED = "the buffer is closed (ReplayBuffer.close() was called)"


class ClosedStorage:
    """What ``rb.storage`` is once the buffer is closed: every use raises ``ValueError``.

    Every path of the buffer (``add``, ``extend``, ``sample``, ``len``, iteration,
    ``rb[index]``, checkpoints) reaches its storage first, so a closed buffer says so there,
    at no cost to an open one.
    """

    def __getattr__(self, name: str) -> NoReturn:
        raise ValueError(_CLOSED)

    def __len__(self) -> int:
        raise ValueError(_CLOSED)

    def __getitem__(self, index: Any) -> NoReturn:
        raise ValueError(_CLOSED)

    def __repr__(self) -> str:
        return "<closed>"


def check_open(self: ReplayBuffer) -> None:
    """Raise ``ValueError`` if the buffer is closed (for paths that do not read the storage)."""
    if isinstance(self.storage, ClosedStorage):
        raise ValueError(_CLOSED)


def getitem(self: ReplayBuffer, index: Any) -> Any:
    """``rb[index]``: the items at ``index`` as the storage gathers them, then the transform.

    ``index`` is anything ``storage[index]`` takes (an int, indices, a slice...): an int gives
    one item, anything else a batch (without an ``"index"`` entry: that is ``sample``'s).
    """
    batch = self.storage[index]
    transform = self.transform
    return batch if transform is None else transform(batch)


def write_count(self: ReplayBuffer) -> int:
    """Items written through this buffer by ``add`` and ``extend``, overwritten ones included.

    torchrl's ``rb.write_count``. It starts at the number of items the storage holds when the
    buffer is built or loaded, and :meth:`empty` sets it to 0. Items a writer drops
    (:class:`~rbdata.writers.MaxValueWriter`) are not counted.
    """
    return self._written


def closed(self: ReplayBuffer) -> bool:
    """Whether :meth:`close` was called."""
    return isinstance(self.storage, ClosedStorage)


def close(self: ReplayBuffer) -> None:
    """Close the storage (if it has ``close()``: memory-mapped and Arrow storages) and the buffer.

    Idempotent. Afterwards every use of the buffer (``add``, ``extend``, ``sample``, ``len``,
    iteration, ``rb[index]``, ``dumps``) raises ``ValueError``; a storage on disk with an
    explicit ``path`` can be reopened (``MemmapStorage.open(path)``). ``with ReplayBuffer(...)
    as rb:`` closes on leaving the block.
    """
    storage = self.storage
    if isinstance(storage, ClosedStorage):
        return
    close_storage = getattr(storage, "close", None)
    if callable(close_storage):
        close_storage()
    self.storage = ClosedStorage()  # type: ignore[assignment]
    self._trusted = False  # sample() then asks the storage first, not the sampler


def enter(self: ReplayBuffer) -> ReplayBuffer:
    """``with ReplayBuffer(...) as rb:`` gives the buffer; leaving the block closes it."""
    check_open(self)
    return self


def exit(
    self: ReplayBuffer,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    traceback: TracebackType | None,
) -> None:
    """Close the buffer on leaving a ``with`` block (:meth:`close`)."""
    self.close()


def missing_attribute(self: ReplayBuffer, name: str) -> NoReturn:
    """``rb.<torchrl name>``: an ``AttributeError`` that names rbdata's spelling."""
    raise torchrl_attribute_error(self, name, BUFFER_ATTRIBUTES)


def priority_of_batch(batch: Any, priority_key: Any) -> tuple[Any, Any]:
    """``(batch["index"], batch[priority_key])`` of a sampled TensorDict (or dict) batch.

    Raises:
        TypeError: ``batch`` is no TensorDict or dict (a plain tensor has no index: sample
            with ``return_info=True``).
        ValueError: an entry is missing; the message names it.
    """
    if not isinstance(batch, (TensorDictBase, Mapping)):
        raise TypeError(
            f"update_priority(index, priority): priority is missing, and a "
            f"{type(batch).__name__} carries no index to update; plain-tensor batches have "
            "no 'index' entry: draw them with `batch, info = rb.sample(return_info=True)` "
            "and call rb.update_priority(info['index'], priority)"
        )
    found = []
    for key, role in (("index", "the slots ('index', as sampled)"), (priority_key, None)):
        value: Any = batch
        for part in (key,) if isinstance(key, str) else key:
            if not isinstance(value, (TensorDictBase, Mapping)) or part not in value.keys():
                what = role or f"the priorities (the buffer's priority_key {key!r})"
                raise ValueError(
                    f"update_priority(batch): the batch has no {key!r} entry for {what}; "
                    "set ReplayBuffer(priority_key=...) or call update_priority(index, priority)"
                )
            value = value[part]
        found.append(value.detach() if isinstance(value, torch.Tensor) else value)
    return found[0], found[1]
