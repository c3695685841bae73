"""Pixel storage: :class:`FrameStackStorage` (each frame stored once, optionally compressed)."""

from rbdata.storages.frames.storage import FrameStackStorage

__all__ = ["FrameStackStorage"]
