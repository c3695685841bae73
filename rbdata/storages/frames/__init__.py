"""Pixel storage: :class:`FrameStackStorage` (each frame stored once, optionally compressed).

The name below is imported on first use: ``rbdata inspect`` reads a directory's
``frames.json`` through ``_format`` alone, without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rbdata.storages.frames.storage import FrameStackStorage

__all__ = ["FrameStackStorage"]


def __getattr__(name: str) -> Any:
    """Import :class:`FrameStackStorage` on first use (PEP 562)."""
    if name != "FrameStackStorage":
        raise AttributeError(f"module 'rbdata.storages.frames' has no attribute {name!r}")
    value = importlib.import_module("rbdata.storages.frames.storage").FrameStackStorage
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
