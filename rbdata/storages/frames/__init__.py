"""Pixel storage: :class:`FrameStackStorage` (each frame stored once, optionally compressed).

The name below is imported on first use: ``rbdata inspect`` reads a directory's
``frames.json`` through ``_format`` alone, without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rbdata._core.lazy import lazy_names

if TYPE_CHECKING:
    from rbdata.storages.frames.storage import FrameStackStorage

__all__ = ["FrameStackStorage"]


__getattr__, __dir__ = lazy_names(
    __name__, {"FrameStackStorage": "rbdata.storages.frames.storage"}, globals()
)
