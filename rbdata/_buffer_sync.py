"""``ReplayBuffer``'s view of writes by other processes: new slots handed to its sampler.

A storage shared between processes (a ``MemmapStorage`` other processes write) counts every
commit in ``write_count``; the buffer remembers the last count it saw and, on ``sample``,
``len`` and its own writes, tells its sampler about the slots the other processes filled.
These functions are ``ReplayBuffer``'s methods ``_sync`` and ``_after_write`` (bound in its
class body: a call costs what a method defined there costs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rbdata.buffer import ReplayBuffer

__all__ = ["after_write", "sync"]


def sync(self: ReplayBuffer) -> None:
    """Hand the items other processes wrote since the last look to the sampler.

    The storage's ``write_count`` (shared by every process) is compared with the last
    value seen here; when it moved, the new slots are the ``d`` slots of the ring that end
    at the shared ``next_slot`` (read together under the write lock, so they agree), or
    every slot if ``d`` is at least the capacity. The sampler's ``on_write`` gets them
    (the data is read only for samplers that index it, e.g. the slice sampler's end
    flags), so they become sampleable with the default priority.
    """
    storage, seen = self.storage, self._seen
    if seen is None or storage.write_count == seen:
        return
    if not storage.shared:  # writes of this process bypassing the buffer (storage.set)
        self._seen, self._own_seen = storage.write_count, storage.own_writes
        return
    with storage.write_lock():
        count, end, own = storage.write_count, storage.next_slot, storage.own_writes
    if count is not None:
        # this process's own writes that bypassed the buffer (storage.set) are not
        # other processes' items: the sampler is not told of them (as when unshared)
        catch_up(self, count - seen - (own - self._own_seen), end)
        self._seen, self._own_seen = count, own


def catch_up(self: ReplayBuffer, d: int, end: int) -> None:
    """The ``d`` items of other processes whose writes ended at slot ``end``."""
    storage, capacity = self.storage, self.storage.capacity
    n = len(storage)
    if d <= 0 or n == 0:
        return
    if d >= min(capacity, n):
        slots = torch.arange(n) if n < capacity else (torch.arange(n) + end) % capacity
    else:
        slots = torch.arange(end - d, end).remainder_(capacity)
    data = storage.__getitems__(slots) if self._wants_data else None
    self.sampler.on_write(slots, data)


def after_write(self: ReplayBuffer, first: int) -> None:
    """After a write of this process at slot ``first``: other writes just before it?"""
    storage = self.storage
    before, after = storage.last_write
    seen = self._seen
    if seen is None or after == seen:
        return
    own = storage.own_writes
    if before != seen and storage.shared:  # own bypassing writes are no one else's
        catch_up(self, before - seen - (own - (after - before) - self._own_seen), first)
    self._seen, self._own_seen = after, own
