"""``EpisodeIndex``: the episode bounds of every step of a storage, kept current from its writes.

The index works in *time* coordinates, like :class:`~rbdata.samplers.SliceSampler`'s: the
storage holds the times ``[oldest, time)`` with ``oldest = max(0, time - capacity)``, time ``t``
lives in slot ``(base + t) % capacity``, and ``ends`` are the sorted times of the episode ends
still held. An episode is a maximal run of held times between two ends: the oldest held steps
(whose episode start the ring overwrote) start at ``oldest``, and the steps after the last end
form an episode still running, whose last step so far is the newest one (``time - 1``).

It follows the storage by itself (:meth:`EpisodeIndex.sync`, called by its users before each
read): the steps written since the last look are those that end at the storage's
``next_slot``, counted by the storage's
:attr:`~rbdata.storages.Storage.items_written` (every write of this process on every
storage, and other processes' on a shared :class:`~rbdata.storages.MemmapStorage`). Only
their end flags are read (one column, never whole items), so a look costs what the new steps
cost, not what the storage holds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rbdata._core.layout import Key, flatten
from rbdata._core.layout.keys import key_name
from rbdata.errors import MissingKeyError

__all__ = ["EpisodeIndex"]

#: rows read per gather when a storage has no plain column to slice (ListStorage, Arrow)
_CHUNK = 65536


def as_key(key: str | tuple[str, ...], name: str) -> Key:
    """``key`` as a key path (a tuple of str), or raise naming the argument ``name``.

    Raises:
        TypeError: neither a str nor a non-empty tuple of str.
        ValueError: an empty name (``""``, or ``""`` in the tuple): no entry has it.
    """
    path = (key,) if isinstance(key, str) else key
    if not (isinstance(path, tuple) and path and all(isinstance(part, str) for part in path)):
        raise TypeError(f"{name}: expected a str or a non-empty tuple of str, got {key!r}")
    if not all(path):
        raise ValueError(
            f"{name}: expected a key of non-empty names (e.g. 'reward' or ('next', "
            f"'reward')), got {key!r}"
        )
    return path


def read_column(storage: Any, key: Key, slots: torch.Tensor) -> torch.Tensor:
    """The values of ``key`` at ``slots`` (one column, not whole items).

    A storage with plain backing tensors (``buffers`` in ``layout`` order: tensor and memmap
    storages) is read with one ``index_select`` of that column; any other storage item by
    item through its batched ``__getitems__``, in chunks.

    Raises:
        KeyError: if the storage's items have no ``key`` (naming the keys they have).
    """
    layout = getattr(storage, "layout", None)
    keys = getattr(layout, "keys", None)
    buffers = getattr(storage, "buffers", None) if keys is not None else None
    if keys is not None and key not in keys:
        raise MissingKeyError(f"the storage has no key {key_name(key)} (its keys: {list(keys)})")
    if buffers is not None:
        column = buffers[keys.index(key)]  # type: ignore[union-attr]
        if slots.device != column.device:
            slots = slots.to(column.device)
        return column.index_select(0, slots)
    parts = []
    for start in range(0, slots.shape[0], _CHUNK):
        _, leaves = flatten(storage.__getitems__(slots[start : start + _CHUNK]))
        if key not in leaves:
            raise MissingKeyError(
                f"the storage has no key {key_name(key)} (its keys: {list(leaves)})"
            )
        parts.append(torch.as_tensor(leaves[key]))
    return torch.cat(parts) if parts else torch.zeros(0)


class EpisodeIndex:
    """Episode bounds of the steps of a storage written in time order through a ring.

    Episode boundaries come from ``end_key`` (a per-step done flag: the episode ends at that
    step) or ``traj_key`` (a per-step episode id: a change of id starts a new episode). Writes
    must go in time order through a ring (:class:`~rbdata.RoundRobinWriter`, every offline
    dataset); :meth:`sync` picks them up, however many (a write of a whole multiple of the
    capacity included: the storage's :attr:`~rbdata.storages.Storage.items_written` moves).

    Args:
        storage: the storage to index.
        end_key: key of the per-step end flag.
        traj_key: key of a per-step episode id, used instead of ``end_key`` when given.

    Examples:
        >>> import torch
        >>> from rbdata import ReplayBuffer, TensorStorage
        >>> rb = ReplayBuffer(TensorStorage(8))
        >>> done = torch.tensor([0, 0, 1, 0, 1, 0], dtype=torch.bool).unsqueeze(1)
        >>> _ = rb.extend({"t": torch.arange(6), "next": {"done": done}})
        >>> episodes = EpisodeIndex(rb.storage)
        >>> start, end, finished = episodes.bounds(torch.tensor([0, 3, 5]))
        >>> start.tolist(), end.tolist(), finished.tolist()
        ([0, 3, 5], [2, 4, 5], [True, True, False])
        >>> _ = rb.extend({"t": torch.arange(6, 9), "next": {"done": done[:3]}})  # wraps
        >>> start, end, finished = episodes.bounds(torch.tensor([1, 3, 0]))
        >>> start.tolist(), end.tolist(), finished.tolist()  # slot 0 now holds step 8
        ([1, 3, 5], [2, 4, 0], [True, True, True])
    """

    def __init__(
        self,
        storage: Any,
        *,
        end_key: str | tuple[str, ...] = ("next", "done"),
        traj_key: str | tuple[str, ...] | None = None,
    ) -> None:
        if not callable(getattr(storage, "__getitems__", None)) or not hasattr(storage, "capacity"):
            raise TypeError(f"storage must be an rbdata Storage, got {type(storage).__name__}")
        self.storage = storage
        self.end_key = as_key(end_key, "end_key")
        self.traj_key = None if traj_key is None else as_key(traj_key, "traj_key")
        self.reset()

    def reset(self) -> None:
        """Forget every step (the next :meth:`sync` indexes the storage anew)."""
        self.time = 0  #: absolute time of the next step
        self.base = 0  #: slot of time 0
        self.ends = np.empty(0, np.int64)  #: times of the episode ends held, sorted
        self._last_traj: Any = None
        self._seen = (0, 0, 0)  # the storage's items_written, len and next_slot at the last look

    @property
    def capacity(self) -> int:
        """The storage's capacity (the ring's length)."""
        return int(self.storage.capacity)

    @property
    def oldest(self) -> int:
        """The time of the oldest step held."""
        return max(0, self.time - self.capacity)

    # --- following the storage --------------------------------------------------------------
    def sync(self) -> None:
        """Index the steps written since the last look (a no-op when nothing was written)."""
        storage = self.storage
        seen = (storage.items_written, len(storage), storage.next_slot)
        if seen == self._seen:
            return
        count, n, end = seen
        old_count, old_n, _ = self._seen
        new = count - old_count
        if self.time == 0 or n < old_n or new >= min(self.capacity, n) or new <= 0:
            self.rebuild()
            return
        self._append(torch.arange(end - new, end).remainder_(self.capacity), end - new)
        self._seen = seen

    def rebuild(self) -> None:
        """Index the whole storage anew, in ring order from its oldest slot (one column read)."""
        storage = self.storage
        seen = (storage.items_written, len(storage), storage.next_slot)
        self.reset()
        n, capacity = seen[1], self.capacity
        if n:
            base = seen[2] if n >= capacity else 0
            self._append((torch.arange(n) + base).remainder_(capacity), base)
        self._seen = seen

    def _append(self, slots: torch.Tensor, first: int) -> None:
        """Index the steps at ``slots`` (ring order, continuing the time order at ``first``)."""
        key = self.traj_key or self.end_key
        values = read_column(self.storage, key, slots)
        n = slots.shape[0]
        if values.dim() == 0 or values.numel() != n:
            raise ValueError(
                f"EpisodeIndex: {key_name(key)} must hold one value per step, got shape "
                f"{tuple(values.shape)} for {n} steps"
            )
        flags = values.reshape(n).cpu().numpy()
        if self.time == 0:
            self.base = first % self.capacity
        start = self.time
        if self.traj_key is None:
            new_ends = np.flatnonzero(flags) + start
        else:
            changes = np.flatnonzero(flags[1:] != flags[:-1]) + start
            last = self._last_traj
            before = [start - 1] if last is not None and flags[0].item() != last else []
            new_ends = np.concatenate([np.asarray(before, np.int64), changes])
            self._last_traj = flags[-1].item()
        self.time = start + n
        ends = self.ends
        if new_ends.size:
            ends = np.concatenate([ends, new_ends.astype(np.int64)])
        oldest = self.oldest
        if ends.size and ends[0] < oldest:
            ends = ends[int(np.searchsorted(ends, oldest)) :]
        self.ends = ends

    # --- reading ------------------------------------------------------------------------------
    def times(self, slots: torch.Tensor) -> np.ndarray:
        """The times of the steps at ``slots`` (in ``[oldest, time)``)."""
        s = np.asarray(slots.cpu().numpy() if isinstance(slots, torch.Tensor) else slots)
        oldest = self.oldest
        return oldest + (s.astype(np.int64) - self.base - oldest) % self.capacity

    def bounds(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each step's episode: its first and last slot held, and whether it has ended.

        The first slot is the episode's start, or the oldest step held if the ring overwrote
        the start; the last is the step that ended it, or the newest step written if it is
        still running (``finished`` is ``False``). Syncs first.
        """
        self.sync()
        t = self.times(slots)
        ends = self.ends
        k = np.searchsorted(ends, t)  # the first end at or after t
        finished = k < ends.size
        oldest = self.oldest
        # ends padded with the time before the oldest step and the newest step (running)
        padded = np.concatenate([[oldest - 1], ends, [self.time - 1]])
        last = padded[k + 1]
        first = np.maximum(padded[k] + 1, oldest)
        capacity, base = self.capacity, self.base
        return (
            torch.from_numpy((first + base) % capacity),
            torch.from_numpy((last + base) % capacity),
            torch.from_numpy(np.asarray(finished)),
        )
