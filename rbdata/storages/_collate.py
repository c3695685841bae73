"""Let ``default_collate`` take a batch that ``__getitems__`` gathered in one read, untouched.

``DataLoader`` hands ``__getitems__``'s result to its ``collate_fn``. ``default_collate`` would
treat such a batch as a list of samples: it evaluates ``batch[0]`` to look up an entry of
``default_collate_fn_map``, then collates the samples again. A tensor batch fails there
(torch's tensor entry calls ``torch.stack`` on one tensor), a TensorDict batch is indexed for
nothing (10-40 us per batch, as much as the gather of a small batch), and a list of objects
from a :class:`~rbdata.storages.ListStorage` would be collated twice.

So when the caller of ``__getitems__`` is DataLoader's map-style fetch and its ``collate_fn``
is ``default_collate`` or :func:`tensordict_collate` (torchrl's name, for code ported from
it; :func:`feeds_default_collate`), the storage wraps the batch in a
:class:`GatheredBatch` (:func:`mark_for_default_collate`). Its ``[0]`` is a marker of a type
of rbdata's own, and the marker's entry in ``default_collate_fn_map`` returns the batch
inside, so ``default_collate`` (and :func:`tensordict_collate`, which unwraps it the same way)
is the only code that ever sees the wrapper and returns exactly what ``storage[indices]``
returns. Nothing else in DataLoader changes: workers, ``pin_memory``
and ``StatefulDataLoader`` get the batch that ``collate`` returns.

Importing rbdata adds that one entry, for a type of its own (as tensordict does for its
types); torch's entries for torch's types are left as they are.
"""

from __future__ import annotations

from types import FrameType
from typing import Any

import torch
from tensordict import TensorDictBase
from torch.utils.data import default_collate
from torch.utils.data._utils.collate import default_collate_fn_map
from torch.utils.data._utils.fetch import _MapDatasetFetcher

__all__ = [
    "GatheredBatch",
    "feeds_default_collate",
    "install",
    "mark_for_default_collate",
    "tensordict_collate",
    "wrap_for_collate",
]

_FETCH_CODE = _MapDatasetFetcher.fetch.__code__


class _FirstOfGathered:
    """What a :class:`GatheredBatch`'s ``[0]`` returns: a key of ``default_collate_fn_map``."""

    __slots__ = ()


_FIRST = _FirstOfGathered()


class GatheredBatch:
    """A gathered batch on its way from ``__getitems__`` into ``default_collate``.

    Args:
        batch: what the storage gathered (a tensor, a TensorDict, a list...).
    """

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __getitem__(self, index: Any) -> Any:
        if type(index) is int and index == 0:
            return _FIRST  # all default_collate looks at
        return self.batch[index]

    def __len__(self) -> int:
        return len(self.batch)

    def __repr__(self) -> str:
        return f"GatheredBatch({self.batch!r})"


def _return_gathered(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """``default_collate``'s entry for a :class:`GatheredBatch`: the batch inside it."""
    return batch.batch


def feeds_default_collate(frame: FrameType | None) -> bool:
    """Whether ``frame`` (which called ``__getitems__``) is DataLoader's fetch into default collate.

    Its ``collate_fn`` is ``default_collate`` or :func:`tensordict_collate`: both take a
    :class:`GatheredBatch` and return the batch inside it.

    Examples:
        >>> import sys
        >>> feeds_default_collate(sys._getframe(0))
        False
    """
    if frame is None or frame.f_code is not _FETCH_CODE:
        return False
    fetcher = frame.f_locals.get("self")
    collate_fn = getattr(fetcher, "collate_fn", None)
    return collate_fn is default_collate or collate_fn is tensordict_collate


def mark_for_default_collate(batch: Any) -> GatheredBatch:
    """Wrap ``batch`` so that ``default_collate`` returns it as it is, without indexing it.

    Examples:
        >>> import torch
        >>> from torch.utils.data import default_collate
        >>> batch = torch.arange(6).view(3, 2)
        >>> default_collate(mark_for_default_collate(batch)) is batch
        True
    """
    return GatheredBatch(batch)


def wrap_for_collate(batch: Any, caller: FrameType | None) -> Any:
    """``batch`` as a ``__getitems__`` returns it to ``caller`` (for implementers).

    A map-style dataset whose ``__getitems__`` gathers a whole batch in one read (as
    :meth:`rbdata.storages.Storage.__getitems__` does) returns
    ``wrap_for_collate(batch, sys._getframe(1))``: when its caller is ``DataLoader``'s fetch
    into ``default_collate``, the batch is wrapped so that ``default_collate`` returns it
    untouched instead of collating its items again; for any other caller it is ``batch``.

    Examples:
        >>> import sys, torch
        >>> batch = torch.zeros(3)
        >>> wrap_for_collate(batch, sys._getframe(0)) is batch
        True
    """
    if feeds_default_collate(caller):
        return mark_for_default_collate(batch)
    return batch


def tensordict_collate(batch: Any) -> Any:
    """Collate what ``DataLoader`` passes its ``collate_fn`` into one batch (torchrl's name).

    For code ported from torchrl (``collate_fn=tensordict_collate``). A batch that a storage's
    ``__getitems__`` gathered in one read comes back as it is, exactly what
    ``storage[indices]`` returns: a TensorDict, a tensor (or, from a
    :class:`~rbdata.storages.ListStorage` of other objects, what it gathered). Storages wrap
    such a batch for this function as for ``default_collate`` (:func:`wrap_for_collate`), so
    it is never collated twice. A list of single items (from a dataset without
    ``__getitems__``, or ``storage[i]`` read one by one) is stacked: TensorDicts with
    ``torch.stack``, anything else with ``default_collate``.

    Args:
        batch: a batch from ``__getitems__`` (wrapped or not), or a list of single items.

    Returns:
        One TensorDict or tensor with the items along its first dimension.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> items = [TensorDict({"t": torch.tensor(i)}, batch_size=[]) for i in range(3)]
        >>> tensordict_collate(items)["t"]
        tensor([0, 1, 2])
        >>> tensordict_collate([torch.zeros(2), torch.ones(2)]).shape
        torch.Size([2, 2])
        >>> batch = torch.arange(6).view(3, 2)
        >>> tensordict_collate(batch) is batch  # already a batch
        True
    """
    if type(batch) is GatheredBatch:
        return batch.batch
    if isinstance(batch, (torch.Tensor, TensorDictBase)):
        return batch  # a gathered batch handed over as it is
    items = list(batch)
    if items and all(isinstance(item, TensorDictBase) for item in items):
        return torch.stack(items)
    return default_collate(items)


def install() -> None:
    """Register the marker's entry of ``default_collate_fn_map`` (a type of rbdata's own)."""
    default_collate_fn_map[_FirstOfGathered] = _return_gathered


install()
