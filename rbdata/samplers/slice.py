"""``SliceSampler``: contiguous sub-trajectories that never cross an episode end or the ring seam.

The sampler keeps an episode index in *time* coordinates, updated on every write with the new
steps' end flags only: the absolute time ``T`` of the next step, the times of the episode ends
still in the buffer (sorted, pruned as the ring overwrites them), and the slot of time 0. The
buffer holds the times ``[max(0, T - capacity), T)``; a segment is a maximal run of those times
inside one episode, so the oldest retained steps (whose episode start was overwritten) and the
newest (an episode still running) are segments too, and no slice joins the newest step to the
oldest. Sampling picks a start uniformly among all valid slice starts with one ``searchsorted``
over per-segment counts, rebuilt lazily after writes from the episode ends only: it never scans
the data, so its cost does not grow with the buffer.
"""

from __future__ import annotations

import numbers
from collections.abc import Sized
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rbdata._core.layout import Key, flatten
from rbdata._core.layout.keys import key_name
from rbdata._core.layout.values import stack_items
from rbdata._core.shown import shown
from rbdata._core.torchrl_names import SLICE_KEYWORDS, torchrl_keywords
from rbdata.samplers import _slices
from rbdata.samplers._draw_state import GeneratorDrawState
from rbdata.samplers.base import Sampler, check_bool

__all__ = ["SliceSampler"]


def _as_key(key: str | tuple[str, ...]) -> Key:
    return (key,) if isinstance(key, str) else tuple(key)


class SliceSampler(GeneratorDrawState, Sampler):
    """Sample ``num_slices`` slices of ``slice_len`` consecutive steps of one episode each.

    Give exactly one of ``slice_len`` / ``num_slices``; the other is derived from the batch
    size (which must be a multiple of it). A batch is **flat**: ``num_slices * slice_len``
    items, each slice's steps contiguous and in time order, slices one after another; it
    carries ``"slice"`` (the slice number of each item) so ``batch.reshape(num_slices,
    slice_len)`` gives the 2-D view. Episode boundaries come from ``end_key`` (a done flag per
    step) or ``traj_key`` (an episode id per step: a change of id starts a new episode).

    The index assumes writes in time order through a ring (:class:`~rbdata.RoundRobinWriter`);
    other write patterns raise ``ValueError``.

    Like every sampler, it takes the storage it reads first (``SliceSampler(storage,
    slice_len=8)``, or none inside a :class:`~rbdata.ReplayBuffer`); the options are keywords,
    spelled as torchrl's.

    Args:
        data_source: the storage (``None``: bound by the buffer).
        slice_len: steps per slice.
        num_slices: slices per batch.
        end_key: key of the per-step end flag (``("next", "done")`` by default).
        traj_key: key of a per-step episode id, used instead of ``end_key`` when given.
        strict_length: skip episodes shorter than ``slice_len``. Otherwise they come back
            whole, padded to ``slice_len`` by repeating their last step, with a ``"mask"``
            entry that is ``False`` on the padding.
        generator: random generator (``None``: a private one seeded from torch's global RNG).

    Examples:
        >>> import torch
        >>> from rbdata import ReplayBuffer, TensorStorage
        >>> rb = ReplayBuffer(TensorStorage(100), sampler=SliceSampler(slice_len=4))
        >>> done = torch.zeros(20, 1, dtype=torch.bool)
        >>> done[9] = done[19] = True  # two episodes of 10 steps
        >>> _ = rb.extend({"t": torch.arange(20), "next": {"done": done}})
        >>> steps = rb.sample(8).reshape(2, 4)["t"]  # two slices of 4 steps
        >>> consecutive = bool((steps.diff() == 1).all())
        >>> one_episode_each = bool(((steps // 10).diff() == 0).all())
        >>> consecutive, one_episode_each
        (True, True)
    """

    #: the end flags of items written by other processes are read from the storage
    on_write_reads_data = True

    @torchrl_keywords(SLICE_KEYWORDS)
    def __init__(
        self,
        data_source: Sized | None = None,
        *,
        slice_len: int | None = None,
        num_slices: int | None = None,
        end_key: str | tuple[str, ...] = ("next", "done"),
        traj_key: str | tuple[str, ...] | None = None,
        strict_length: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        if isinstance(data_source, numbers.Number):
            raise TypeError(
                f"SliceSampler's first argument is the storage it reads, as for every sampler, "
                f"got {shown(data_source)}: give slice_len= or num_slices= by keyword "
                f"(SliceSampler(slice_len={shown(data_source)}))"
            )
        super().__init__(data_source, generator)
        if (slice_len is None) == (num_slices is None):
            raise ValueError("give exactly one of slice_len and num_slices")
        for name, value in (("slice_len", slice_len), ("num_slices", num_slices)):
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer, got {shown(value)}")
        self.slice_len = slice_len
        self.num_slices = num_slices
        self.end_key = _as_key(end_key)
        self.traj_key = None if traj_key is None else _as_key(traj_key)
        self.strict_length = check_bool(strict_length, "strict_length")
        self._iter_chunk = 64 * (slice_len or 1)
        self.reset()
        # given a storage, not attached by a buffer: the first draw indexes what it holds
        self._unindexed = data_source is not None

    # --- the episode index ----------------------------------------------------------------
    def reset(self) -> None:
        """Forget every episode."""
        self._time = 0  # absolute time of the next step
        self._base: int | None = None  # slot of time 0
        self._ends = np.empty(0, np.int64)  # times of episode ends in the buffer, sorted
        self._last_traj: Any = None
        self._cache: tuple[Any, ...] | None = None
        self._cache_len: int | None = None
        self._ids_cache: dict[tuple[int, int], torch.Tensor] = {}
        self._pending: tuple[Any, Any, Any] | None = None  # check_write's plan for on_write

    @property
    def _capacity(self) -> int:
        source = self.data_source
        capacity = getattr(source, "capacity", None)
        if capacity is None:
            if source is None:
                raise RuntimeError("SliceSampler has no data_source: use it in a ReplayBuffer")
            return len(source)
        return int(capacity)

    def _flags(self, data: Any, n: int, batched: bool) -> np.ndarray:
        key = self.traj_key or self.end_key
        if data is None:
            raise ValueError(f"SliceSampler needs the written data to read {key!r}")
        missing = ValueError(
            f"SliceSampler: the data has no key {key_name(key)} (episode boundaries)"
        )
        if isinstance(data, (list, tuple)):  # a list of items: stack only the flag (other
            values = []  # keys may be strings or ragged, which only the storage stacks)
            for item in data:
                _, item_leaves = flatten(item)
                if key not in item_leaves:
                    raise missing
                values.append(torch.as_tensor(item_leaves[key]))
            data = stack_items(values) if values else torch.zeros(0)
            leaves = {key: data}
        else:
            _, leaves = flatten(data)
        if key not in leaves:
            raise missing
        value = leaves[key]
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        value = np.asarray(value)
        value = value.reshape(n, -1) if batched else value.reshape(1, -1)
        if value.shape[1] != 1:
            raise ValueError(f"SliceSampler: {key_name(key)} must hold one value per step")
        return value[:, 0]

    def _item_ends(self, value: Any, start: int) -> tuple[list[int], Any]:
        """:meth:`_ends_of` for one new step whose flag (or episode id) is ``value``."""
        if self.traj_key is None:
            return ([start] if value else []), None
        last = self._last_traj
        return ([start - 1] if last is not None and value != last else []), value

    def _ends_of(self, values: np.ndarray, start: int) -> tuple[np.ndarray, Any]:
        """Absolute times of episode ends among new steps starting at time ``start``.

        Returns them and the episode id of the last new step (``traj_key``; else ``None``).
        Pure: the sampler's state is not touched.
        """
        if self.traj_key is None:
            return np.flatnonzero(values) + start, None
        ids = values
        changes = np.flatnonzero(ids[1:] != ids[:-1]) + start
        first = ids[0].item()
        self_ends = [start - 1] if self._last_traj is not None and first != self._last_traj else []
        return np.concatenate([np.asarray(self_ends, np.int64), changes]), ids[-1].item()

    def _plan(self, index: int | torch.Tensor, data: Any) -> tuple[Any, ...] | None:
        """The episode index after a write of ``data`` at ``index``, or raise (pure).

        Returns ``(base, time, ends, last_traj)``, or ``None`` for an empty write.
        """
        value: Any = _MISS
        if isinstance(index, int):
            first, n, batched = index, 1, False
            value = _item_value(data, self.traj_key or self.end_key)
        else:
            n, batched = int(index.shape[0]), True
            if n == 0:
                return None
            first = int(index[0])
        capacity = self._capacity
        base = self._base
        if base is None:
            base = first
        elif (base + self._time) % capacity != first:
            raise ValueError(
                f"SliceSampler: a write at slot {first} does not continue the time order "
                f"(expected slot {(base + self._time) % capacity}); it needs a "
                "RoundRobinWriter; nothing was written"
            )
        start = self._time
        new_ends: Any
        if value is _MISS:
            new_ends, last_traj = self._ends_of(self._flags(data, n, batched), start)
        else:  # one step whose flag was read directly (the per-step add)
            new_ends, last_traj = self._item_ends(value, start)
        time = start + n
        oldest = max(0, time - capacity)
        ends = self._ends
        if len(new_ends):
            ends = np.concatenate([ends, np.asarray(new_ends, np.int64)])
        if ends.size and ends[0] < oldest:
            ends = ends[int(np.searchsorted(ends, oldest)) :]
        return base, time, ends, last_traj

    def check_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Refuse a write before it happens; keep what was computed for :meth:`on_write`.

        Refused: a write that does not continue the time order, or data without the episode
        key (``ValueError``).
        """
        self._pending = (index, data, self._plan(index, data))

    def on_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Index the end flags of the steps just written at ``index`` (in time order)."""
        pending, self._pending = self._pending, None
        if (
            pending is not None
            and pending[1] is data
            and (pending[0] is index or (isinstance(index, int) and pending[0] == index))
        ):
            plan = pending[2]  # computed by check_write just before this write
        else:
            plan = self._plan(index, data)
        if plan is None:
            return
        self._base, self._time, self._ends, last_traj = plan
        if self.traj_key is not None:
            self._last_traj = last_traj
        self._cache = None

    def attach(self, storage: Sized) -> None:
        """Bind to a storage and index the episodes already in it (one read of one column).

        A sampler whose state was loaded (:meth:`load_state_dict`) keeps that index.
        """
        super().attach(storage)
        self._unindexed = False
        n = len(storage)
        if n == 0 or self._restored:
            return
        capacity = self._capacity
        base = int(getattr(storage, "next_slot", 0)) if n == capacity else 0
        slots = (torch.arange(n) + base) % capacity
        self.reset()
        self.on_write(slots, storage.__getitems__(slots))  # type: ignore[attr-defined]

    # --- sampling ---------------------------------------------------------------------------
    def _shape(self, batch_size: int) -> tuple[int, int]:
        if self.slice_len is not None:
            if batch_size % self.slice_len:
                raise ValueError(
                    f"batch_size {batch_size} is not a multiple of slice_len {self.slice_len}"
                )
            return batch_size // self.slice_len, self.slice_len
        assert self.num_slices is not None
        if batch_size % self.num_slices:
            raise ValueError(
                f"batch_size {batch_size} is not a multiple of num_slices {self.num_slices}"
            )
        return self.num_slices, batch_size // self.num_slices

    def _segments(self, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        cache = self._cache
        if cache is not None and self._cache_len == length:
            return cache
        cumsum, shift, stops = _slices.segments(
            self._ends, self._time, self._capacity, length, self.strict_length
        )
        cache = (cumsum, shift, stops, int(cumsum[-1]))
        self._cache, self._cache_len = cache, length
        return cache

    def _slice_ids(self, num_slices: int, length: int) -> torch.Tensor:
        key = (num_slices, length)
        ids = self._ids_cache.get(key)
        if ids is None:
            ids = self._ids_cache[key] = torch.arange(num_slices).repeat_interleave(length)
        return ids.clone()  # the caller owns its batch

    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Draw ``num_slices`` slices as one flat batch of indices (see the class doc)."""
        num_slices, length = self._shape(batch_size)
        self._length()  # bound and non-empty
        if self._base is None and self._unindexed:  # SliceSampler(filled_storage, ...)
            self.attach(self.data_source)  # type: ignore[arg-type]
        cumsum, shift, stops, total = self._segments(length)
        if total == 0:
            raise ValueError(
                f"SliceSampler: no episode in the buffer has {length} steps "
                "(use strict_length=False to sample shorter ones)"
            )
        r = torch.randint(total, (num_slices,), generator=self.generator)
        assert self._base is not None  # set by the first write
        index, mask = _slices.draw(
            cumsum, shift, stops, r, length, self._base, self._capacity, self.strict_length
        )
        extras = {"slice": self._slice_ids(num_slices, length)}
        if mask is not None:
            extras["mask"] = mask
        return index, extras

    # --- state ------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Slice length or count, episode keys and ``strict_length``."""
        return {
            "slice_len": self.slice_len,
            "num_slices": self.num_slices,
            "end_key": self.end_key,
            "traj_key": self.traj_key,
            "strict_length": self.strict_length,
        }

    def state_dict(self) -> dict[str, Any]:
        """Generator state and the episode index."""
        state = super().state_dict()
        state.update(time=self._time, base=self._base, ends=torch.from_numpy(self._ends.copy()))
        state["last_traj"] = self._last_traj
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`."""
        time = int(state["time"])
        base = None if state["base"] is None else int(state["base"])
        ends = np.asarray(state["ends"], dtype=np.int64).copy()
        lowest = time - (self._capacity if self.data_source is not None else time)
        if ends.ndim != 1 or (ends.size and (ends[0] < lowest - 1 or ends[-1] >= time)):
            raise ValueError(f"state: episode ends outside the steps [{lowest}, {time})")
        if (np.diff(ends) <= 0).any() or (base is not None and base < 0):
            raise ValueError("state: episode ends not increasing, or a negative base slot")
        super().load_state_dict(state)
        self._time, self._base, self._ends = time, base, ends
        self._last_traj = state["last_traj"]
        self._cache = None


_MISS = object()


def _item_value(item: Any, key: Key) -> Any:
    """The one value at ``key`` of one item as a Python scalar, or ``_MISS`` (general path)."""
    node = item
    try:
        for part in key:
            kind = type(node)
            if kind is not dict and kind is not TensorDict:
                return _MISS
            node = node[part]
    except KeyError:
        return _MISS
    kind = type(node)
    if kind is bool or kind is int or kind is float:
        return node
    if isinstance(node, np.generic):
        return node.item()
    if kind is np.ndarray:
        return node.item() if node.size == 1 and node.dtype.kind in "biuf" else _MISS
    if kind is torch.Tensor and node.dtype is not torch.bfloat16:  # (no numpy twin: _flags)
        try:
            return node.item()  # one element, else RuntimeError
        except RuntimeError:
            return _MISS
    return _MISS
