"""``ImmutableWriter``: refuses every write (read-only datasets)."""

from __future__ import annotations

from typing import Any, NoReturn

from rbdata.errors import ReadOnlyError
from rbdata.storages.base import Storage
from rbdata.writers.base import WriteCheck, Writer

__all__ = ["ImmutableWriter"]


class ImmutableWriter(Writer):
    """A writer for read-only buffers such as offline datasets: any write raises.

    Examples:
        >>> import torch
        >>> from rbdata.storages import TensorStorage
        >>> ImmutableWriter().add(TensorStorage(4), torch.zeros(2))
        Traceback (most recent call last):
        ...
        rbdata.errors.ReadOnlyError: this buffer is read-only (ImmutableWriter): add is not allowed
    """

    def _refuse(self, what: str) -> NoReturn:
        raise ReadOnlyError(f"this buffer is read-only (ImmutableWriter): {what} is not allowed")

    def add(self, storage: Storage, item: Any, check: WriteCheck | None = None) -> int:
        """Raise :class:`~rbdata.errors.ReadOnlyError`."""
        self._refuse("add")

    def extend(self, storage: Storage, data: Any, check: WriteCheck | None = None) -> Any:
        """Raise :class:`~rbdata.errors.ReadOnlyError`."""
        self._refuse("extend")
