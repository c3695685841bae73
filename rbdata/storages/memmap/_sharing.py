"""How a :class:`~rbdata.storages.MemmapStorage` becomes shared between processes.

- :data:`LIVE` and the fork hook: every open storage becomes shared in the parent and the
  child of a fork (``os.register_at_fork``);
- :func:`become_shared`: ``shared.bin`` mapped (seeded with this process's count) and the
  per-slot version words (``versions.bin``) opened;
- :func:`write_lock`: the directory's write lock (``MemmapStorage.write_lock``);
- :func:`marks`: the version marks around a write of a shared storage.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rbdata._files import inside
from rbdata.storages._target import WriteTarget
from rbdata.storages.memmap._shared import SharedState
from rbdata.storages.memmap._versions import VERSIONS_FILE, SlotVersions

if TYPE_CHECKING:
    from rbdata.storages.memmap.storage import MemmapStorage

__all__ = ["LIVE", "SHARED_FILE", "become_shared", "marks", "write_lock"]

SHARED_FILE = "shared.bin"
LIVE: weakref.WeakSet[MemmapStorage] = weakref.WeakSet()


def _mark_shared_before_fork() -> None:
    """Parent and child of a fork both may write: every open storage becomes shared."""
    for storage in list(LIVE):
        if not storage._closed and not storage._private:
            storage._become_shared()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_mark_shared_before_fork)


def become_shared(storage: MemmapStorage) -> None:
    """Map ``shared.bin`` (seeded with this process's count) and the slots' version words."""
    if storage._private or storage._shared:
        return
    if storage._holders is not None:  # first: a later open joins shared, never refused
        storage._holders.share()
    if storage._state.path is None:  # map shared.bin, seeded with this process's count
        state = SharedState(inside(storage._path, SHARED_FILE), seed=storage._state.writes)
        storage._state.close()
        storage._state = state
    storage._versions = SlotVersions(inside(storage._path, VERSIONS_FILE), storage.capacity)
    storage._shared = True


@contextlib.contextmanager
def write_lock(storage: MemmapStorage) -> Iterator[None]:
    """Hold the write lock of the directory: no other process writes meanwhile.

    Inside, ``len``, ``next_slot`` and the layout are current (a layout fixed by another
    process is mapped on entry). Writers of a shared storage hold it across reserve +
    write + publish; a reader may hold it to read rows no writer is changing.
    """
    storage._check_open()
    state = storage._state
    outer = storage._lock_depth == 0  # nested (a reader's fallback inside a locked read)
    if outer:
        state.lock()
    storage._lock_depth += 1
    try:
        if storage._layout is None:
            storage._current_layout()
        yield
    finally:
        storage._lock_depth -= 1
        if outer:
            state.unlock()


def marks(storage: MemmapStorage, target: WriteTarget) -> contextlib.AbstractContextManager[Any]:
    """The version marks of a write of ``target`` (shared storages; else nothing)."""
    versions = storage._versions if storage._shared else None
    return contextlib.nullcontext() if versions is None else versions.writing(target)
