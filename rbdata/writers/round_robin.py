"""``RoundRobinWriter``: a ring buffer that overwrites the oldest items."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rbdata.storages.base import Storage, WriteTarget
from rbdata.writers.base import WriteCheck, Writer

__all__ = ["RoundRobinWriter"]


class RoundRobinWriter(Writer):
    """Write at a cursor that wraps around at the storage capacity (FIFO overwrite).

    A batch that wraps is written as at most two contiguous slice copies.

    On a storage shared between processes (:attr:`~rbdata.storages.Storage.shared`, e.g. a
    pickled or forked :class:`~rbdata.storages.MemmapStorage`) the slots are taken from the
    storage's shared ``next_slot`` under its :meth:`~rbdata.storages.Storage.write_lock`,
    held across reserve + write + publish: concurrent writers form one ring. Unshared, the
    writes start at ``next_slot`` too: one ring cursor, kept by the storage, whoever holds it
    (see :attr:`cursor`).

    Examples:
        >>> import torch
        >>> from rbdata.storages import TensorStorage
        >>> storage, writer = TensorStorage(4), RoundRobinWriter()
        >>> writer.extend(storage, torch.zeros(3, 2)).tolist()
        [0, 1, 2]
        >>> writer.extend(storage, torch.ones(2, 2)).tolist()
        [3, 0]
    """

    def __init__(self) -> None:
        self._cursor: int | None = None
        #: a cursor set by load_state_dict or reset: where the next write goes (checked
        #: against the storage's capacity first), instead of the storage's next slot
        self._loaded = False

    @property
    def cursor(self) -> int | None:
        """The slot after this writer's last write (``None`` before its first).

        The ring's cursor itself is the storage's
        :attr:`~rbdata.storages.Storage.next_slot`: every write starts there (a buffer over
        a reopened storage continues its ring), so the ring is the same whoever writes it
        (this writer, another process sharing the storage, a ``storage.set`` that continues
        the ring). A cursor given by :meth:`load_state_dict` or :meth:`reset` is where the
        next write goes instead.
        """
        return self._cursor

    def _slot(self, storage: Storage) -> int | None:
        """Where the next write goes; ``None`` for a shared storage (read under its lock)."""
        if storage.shared:
            return None
        if self._loaded:
            self._check_loaded(storage)
            return self._cursor
        return storage.next_slot

    def add(self, storage: Storage, item: Any, check: WriteCheck | None = None) -> int:
        """Write one item at the cursor; return its slot.

        ``check(slot, item)``, if given, runs after validation and before the write.
        """
        slot = self._slot(storage)
        if slot is not None and storage.add_fast(slot, item, check):  # the per-step path
            nxt = slot + 1
            self._cursor = nxt if nxt < storage.capacity else 0
            self._loaded = False
            return slot
        prepared = storage.prepare(item, batched=False)
        if slot is None or storage.shared:  # shared meanwhile (pickled by another thread)?
            with storage.write_lock():
                return self._add(storage, storage.next_slot, item, prepared, check)
        return self._add(storage, slot, item, prepared, check)

    def _add(
        self, storage: Storage, index: int, item: Any, prepared: Any, check: WriteCheck | None
    ) -> int:
        if check is not None:
            check(index, item)
        storage.commit(WriteTarget.one(index), prepared)
        nxt = index + 1
        self._cursor = nxt if nxt < storage.capacity else 0
        self._loaded = False
        return index

    def extend(self, storage: Storage, data: Any, check: WriteCheck | None = None) -> torch.Tensor:
        """Write a batch at the cursor, wrapping around; return the slots written.

        ``check(slots, data)``, if given, runs after validation and before the write.
        """
        start = self._slot(storage)
        if start is not None:  # small batches: the per-step path (never for a shared storage)
            index = storage.extend_fast(start, data, check)
            if index is not None:
                self._cursor = (start + index.shape[0]) % storage.capacity
                self._loaded = False
                return index
        prepared = storage.prepare(data, batched=True)
        n, capacity = prepared.n, storage.capacity
        if n > capacity:
            raise ValueError(
                f"data: a batch of {n} items is more than the storage capacity {capacity}"
            )
        if start is None or storage.shared:  # shared meanwhile (pickled by another thread)?
            with storage.write_lock():
                return self._extend(storage, storage.next_slot, n, data, prepared, check)
        return self._extend(storage, start, n, data, prepared, check)

    def _extend(
        self,
        storage: Storage,
        start: int,
        n: int,
        data: Any,
        prepared: Any,
        check: WriteCheck | None,
    ) -> torch.Tensor:
        capacity = storage.capacity
        index = torch.arange(start, start + n)
        if start + n > capacity:
            index.remainder_(capacity)
        if check is not None:
            check(index, data)
        storage.commit(WriteTarget.ring(start, n, capacity), prepared)
        self._cursor = (start + n) % capacity
        self._loaded = False
        return index

    def reset(self) -> None:
        """Restart writing at slot 0 (the next write goes there)."""
        self._cursor = 0
        self._loaded = True

    def state_dict(self) -> dict[str, Any]:
        """``{"cursor": int | None}``."""
        return {"cursor": self._cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the cursor: ``None`` or an int ``>= 0``.

        The cursor is checked against the storage's capacity at the next write.

        An int is where the next write goes; ``None`` leaves the ring's cursor to the storage
        (its ``next_slot``).

        Raises:
            ValueError: for a cursor that is not ``None`` or an integer ``>= 0``.
        """
        cursor = state["cursor"]
        if cursor is not None:
            if isinstance(cursor, bool) or not isinstance(cursor, (int, np.integer)):
                raise ValueError(f"state: cursor must be None or an int, got {cursor!r}")
            if cursor < 0:
                raise ValueError(f"state: cursor must be >= 0, got {cursor}")
        self._cursor = None if cursor is None else int(cursor)
        self._loaded = self._cursor is not None

    def _check_loaded(self, storage: Storage) -> None:
        """Refuse a loaded cursor past ``storage``'s slots (before anything is written)."""
        cursor = self._cursor
        if cursor is not None and cursor >= storage.capacity:
            raise ValueError(
                f"cursor: the writer's state says slot {cursor}, but the storage has "
                f"{storage.capacity} slots; load a state that belongs to this storage"
            )
