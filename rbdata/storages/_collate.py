"""Let ``default_collate`` take a batch that ``__getitems__`` gathered in one read, untouched.

``DataLoader`` hands ``__getitems__``'s result to its ``collate_fn``. Two things stand in the
way of ``default_collate`` returning such a batch as it is:

* A storage of plain tensors returns one tensor, which torch's tensor entry would try to
  ``torch.stack`` (and fail: ``stack`` wants a sequence). :func:`collate_tensor_or_batch`
  returns a tensor batch unchanged and hands any list of samples to torch's own function,
  so the only behaviour it changes is a call that always raised.
* A TensorDict batch reaches tensordict's entry of ``default_collate_fn_map``, which returns a
  gathered batch as it is, but only after torch's ``collate`` evaluated ``batch[0]`` to look
  up the entry: indexing every leaf of the batch, 10-40 us per batch (as much as the gather
  of a small batch). When the caller of ``__getitems__`` is DataLoader's map-style fetch and
  its ``collate_fn`` is ``default_collate`` (:func:`feeds_default_collate`), the storage
  marks the batch (:func:`mark_for_default_collate`): its class becomes a TensorDict
  subclass whose ``[0]`` is a marker. The marker's entry in ``default_collate_fn_map``
  turns the batch back into a plain ``TensorDict`` and returns it, so ``default_collate`` is
  the only code that ever sees the subclass; anything else that indexes a marked batch turns
  it back first. Nothing else in DataLoader changes: workers, ``pin_memory`` and
  ``StatefulDataLoader`` get the plain ``TensorDict`` that ``collate`` returns.
"""

from __future__ import annotations

from types import FrameType
from typing import Any

import torch
from tensordict import TensorDict
from torch.utils.data import default_collate
from torch.utils.data._utils.collate import collate_tensor_fn, default_collate_fn_map
from torch.utils.data._utils.fetch import _MapDatasetFetcher

__all__ = [
    "collate_tensor_or_batch",
    "feeds_default_collate",
    "install",
    "mark_for_default_collate",
]

_FETCH_CODE = _MapDatasetFetcher.fetch.__code__


class _FirstOfGathered:
    """What a marked batch's ``[0]`` returns: a key of ``default_collate_fn_map``."""

    __slots__ = ()


_FIRST = _FirstOfGathered()


class _GatheredBatch(TensorDict):
    """A gathered batch on its way from ``__getitems__`` into ``default_collate``."""

    __slots__ = ()

    def __getitem__(self, index: Any) -> Any:
        self.__class__ = TensorDict  # one look, then a plain TensorDict again
        if type(index) is int and index == 0:
            return _FIRST
        return self[index]


def _return_gathered(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """``default_collate``'s entry for a marked batch: the batch itself, as a TensorDict."""
    if type(batch) is _GatheredBatch:  # not indexed yet (a caller of collate's own)
        batch.__class__ = TensorDict
    return batch


def feeds_default_collate(frame: FrameType | None) -> bool:
    """Whether ``frame`` (which called ``__getitems__``) is DataLoader's fetch into default collate.

    Examples:
        >>> import sys
        >>> feeds_default_collate(sys._getframe(0))
        False
    """
    if frame is None or frame.f_code is not _FETCH_CODE:
        return False
    fetcher = frame.f_locals.get("self")
    return getattr(fetcher, "collate_fn", None) is default_collate


def mark_for_default_collate(batch: Any) -> Any:
    """Let ``default_collate`` return ``batch`` (a plain TensorDict) without indexing it.

    Anything other than a plain ``TensorDict`` is returned as it is.
    """
    if type(batch) is TensorDict:
        batch.__class__ = _GatheredBatch
    return batch


def collate_tensor_or_batch(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """Return a gathered tensor batch as is; stack a list of tensors like torch does."""
    if isinstance(batch, torch.Tensor):
        return batch
    return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)


def install() -> None:
    """Register the two entries of ``default_collate_fn_map`` (the tensor one unless replaced)."""
    default_collate_fn_map[_FirstOfGathered] = _return_gathered
    if default_collate_fn_map.get(torch.Tensor) is collate_tensor_fn:
        default_collate_fn_map[torch.Tensor] = collate_tensor_or_batch


install()
