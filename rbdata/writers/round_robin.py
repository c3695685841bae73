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
    held across reserve + write + publish, not from this process's cursor: concurrent
    writers form one ring.

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
        #: a loaded cursor not yet checked against a storage's capacity (see _check_loaded)
        self._loaded = False

    @property
    def cursor(self) -> int | None:
        """The next slot to write.

        ``None`` until the first write, which starts at the storage's ``next_slot``: a buffer
        over a reopened storage continues its ring.
        """
        return self._cursor

    def _start(self, storage: Storage) -> int:
        cursor = self._cursor
        if cursor is None:
            cursor = storage.next_slot if len(storage) else 0
        return cursor

    def add(self, storage: Storage, item: Any, check: WriteCheck | None = None) -> int:
        """Write one item at the cursor; return its slot.

        ``check(slot, item)``, if given, runs after validation and before the write.
        """
        if self._loaded:
            self._check_loaded(storage)
        slot = self._cursor
        if slot is None and not storage.shared:  # shared: read under the lock (below)
            slot = self._start(storage)
        if slot is not None and storage.add_fast(slot, item, check):  # the per-step path
            nxt = slot + 1
            self._cursor = nxt if nxt < storage.capacity else 0
            return slot
        prepared = storage.prepare(item, batched=False)
        if storage.shared:
            with storage.write_lock():
                return self._add(storage, storage.next_slot, item, prepared, check)
        return self._add(storage, self._start(storage), item, prepared, check)

    def _add(
        self, storage: Storage, index: int, item: Any, prepared: Any, check: WriteCheck | None
    ) -> int:
        if check is not None:
            check(index, item)
        storage.commit(WriteTarget.one(index), prepared)
        nxt = index + 1
        self._cursor = nxt if nxt < storage.capacity else 0
        return index

    def extend(self, storage: Storage, data: Any, check: WriteCheck | None = None) -> torch.Tensor:
        """Write a batch at the cursor, wrapping around; return the slots written.

        ``check(slots, data)``, if given, runs after validation and before the write.
        """
        if self._loaded:
            self._check_loaded(storage)
        start = self._cursor
        if start is None and not storage.shared:  # shared: read under the lock (below)
            start = self._start(storage)
        if start is not None:  # small batches: the per-step path (never for a shared storage)
            index = storage.extend_fast(start, data, check)
            if index is not None:
                self._cursor = (start + index.shape[0]) % storage.capacity
                return index
        prepared = storage.prepare(data, batched=True)
        n, capacity = prepared.n, storage.capacity
        if n > capacity:
            raise ValueError(
                f"data: a batch of {n} items is more than the storage capacity {capacity}"
            )
        if storage.shared:
            with storage.write_lock():
                return self._extend(storage, storage.next_slot, n, data, prepared, check)
        return self._extend(storage, self._start(storage), n, data, prepared, check)

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
        return index

    def reset(self) -> None:
        """Restart writing at slot 0."""
        self._cursor = 0

    def state_dict(self) -> dict[str, Any]:
        """``{"cursor": int | None}``."""
        return {"cursor": self._cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the cursor: ``None`` or an int ``>= 0``.

        The cursor is checked against the storage's capacity at the next write.

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
        self._loaded = False
