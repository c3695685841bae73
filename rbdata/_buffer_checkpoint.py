"""``ReplayBuffer``'s checkpoints: ``dumps``, ``load``, ``state_dict``, ``load_state_dict``.

These functions are ``ReplayBuffer``'s methods of the same names (bound in its class body,
as :mod:`rbdata._buffer_sync`'s are); ``loads`` and ``from_state_dict``, which build a new
buffer, stay in :mod:`rbdata.buffer`. The work is :mod:`rbdata.checkpoint`'s: it iterates over
the components and calls their own state and persistence hooks.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rbdata import checkpoint

if TYPE_CHECKING:
    from rbdata.buffer import ReplayBuffer

__all__ = ["adopt", "dumps", "load", "load_state_dict", "state_dict"]


def dumps(  # noqa: D417 - self is the buffer (a method of ReplayBuffer)
    self: ReplayBuffer, path: str | os.PathLike[str], *, fsync: bool = True
) -> None:
    """Write the whole buffer to directory ``path``, atomically and without pickle.

    The storage's items (raw memory-mapped arrays, or Arrow IPC files), the sampler's
    state (priority trees as raw arrays, generator state), the writer's state and the
    batch size are saved; the transform is not. A previous checkpoint at ``path`` stays
    live until the new one is complete, then is replaced in one atomic step: a process
    killed at any moment leaves one complete checkpoint. See ``docs/checkpoints.md``.

    Args:
        path: the checkpoint directory (created if needed).
        fsync: fsync every file and directory before the switch (default), so the
            checkpoint also survives a power loss. ``False`` does not wait for the disk
            writeback (for 1M transitions that wait is longer than writing the files)
            and keeps the guarantee for a killed process, not for a machine that loses
            power.

    Raises:
        TypeError: if a component cannot be saved without pickle (e.g. a
            :class:`~rbdata.storages.ListStorage` item of another type); nothing is
            written then.
        FileExistsError: if ``path`` holds files that are not a checkpoint's.
    """
    checkpoint.dump(*self._components(), path, fsync=fsync)


def load(  # noqa: D417 - self is the buffer (a method of ReplayBuffer)
    self: ReplayBuffer, path: str | os.PathLike[str], *, verify: bool = False
) -> None:
    """Load checkpoint ``path`` into this buffer (its components must match).

    The storage, sampler and writer classes and their configuration (capacity, priority
    exponents...) must equal the checkpoint's; the items are copied into this buffer's
    own storage. ``batch_size`` and ``transform`` are kept. ``rb.loads(path)`` does the
    same and returns ``rb``.

    Args:
        path: a directory written by :meth:`dumps`.
        verify: check every file against its recorded CRC-32 first (see :meth:`loads`).

    Raises:
        ValueError: if the components differ (nothing is changed then).
        rbdata.errors.CheckpointError: for a missing, tampered or foreign checkpoint.
    """
    adopt(self, checkpoint.load(path, verify=verify), str(path))


def state_dict(self: ReplayBuffer) -> dict[str, Any]:
    """The whole buffer as a dict for ``torch.save`` (small buffers).

    It holds tensors and plain values only: ``torch.load(..., weights_only=True)``
    reads it back. For large buffers prefer :meth:`dumps`, which writes whole arrays and
    loads lazily.
    """
    return checkpoint.state_dict(*self._components())


def load_state_dict(self: ReplayBuffer, state: dict[str, Any]) -> None:
    """Restore a :meth:`state_dict` into this buffer (same component checks as :meth:`load`)."""
    adopt(self, checkpoint.from_state_dict(state), "state")


def adopt(self: ReplayBuffer, parts: checkpoint.Components, source: str) -> None:
    """Check that ``parts`` match this buffer's components, then take their contents."""
    checkpoint.load_into(parts, *self._components()[:3], source)
    if self._seen is not None:  # the copied items are not other processes' writes
        self._seen, self._own_seen = self.storage.write_count, self.storage.own_writes
    self._written = len(self.storage)
