"""Let ``default_collate`` accept a batch that ``__getitems__`` gathered in one read.

``DataLoader`` hands ``__getitems__``'s result to its ``collate_fn``. tensordict registers an
entry in torch's ``default_collate_fn_map`` that returns a gathered TensorDict as it is; for a
storage of plain tensors the batch is one tensor, which torch's tensor entry would try to
``torch.stack`` (and fail: ``stack`` wants a sequence). The entry installed here returns a
tensor batch unchanged and hands any list of samples to torch's own function, so the only
behaviour it changes is a call that always raised.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data._utils.collate import collate_tensor_fn, default_collate_fn_map

__all__ = ["collate_tensor_or_batch", "install"]


def collate_tensor_or_batch(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """Return a gathered tensor batch as is; stack a list of tensors like torch does."""
    if isinstance(batch, torch.Tensor):
        return batch
    return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)


def install() -> None:
    """Register :func:`collate_tensor_or_batch` for tensors, unless someone else replaced it."""
    if default_collate_fn_map.get(torch.Tensor) is collate_tensor_fn:
        default_collate_fn_map[torch.Tensor] = collate_tensor_or_batch


install()
