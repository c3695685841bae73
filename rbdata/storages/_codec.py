"""The :class:`Codec` protocol that checkpoints lend to a storage's persistence hooks.

Re-exported by :mod:`rbdata.storages.base` (and :mod:`rbdata.storages`).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

__all__ = ["Codec"]


class Codec(Protocol):
    """The pickle-free encoding that checkpoints lend to a storage's persistence hooks.

    ``encode`` turns a value (nested containers, numbers, strings, tensors...) into JSON,
    appending its tensors to ``tensors``; ``decode`` does the reverse and checks what it
    reads. ``where`` names the value in error messages. See :mod:`rbdata.checkpoint`.
    """

    def encode(self, obj: Any, tensors: list[torch.Tensor], where: str) -> Any:
        """``obj`` as JSON, its tensors appended to ``tensors``."""

    def decode(self, obj: Any, tensors: list[torch.Tensor], where: str) -> Any:
        """The value that ``encode`` turned into ``obj`` (checked)."""
