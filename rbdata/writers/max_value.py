"""``MaxValueWriter``: keep the top-k items by a rank key (e.g. the episode return).

The slot choice is a pure function over tensors, :func:`plan_top_k`; the writer is a thin
stateful wrapper (the rank and the arrival stamp of the item in each slot).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from rbdata._core.index import check_capacity
from rbdata._core.layout import Key, Layout
from rbdata._core.layout.keys import key_name, key_names
from rbdata.storages.base import Prepared, Storage, WriteTarget
from rbdata.writers.base import WriteCheck, Writer

__all__ = ["MaxValueWriter", "plan_top_k"]


def plan_top_k(
    ranks: torch.Tensor, stamps: torch.Tensor, count: int, new: torch.Tensor, next_stamp: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the slots of a batch of ``new`` ranks in a top-k buffer; return ``(slots, rows)``.

    The buffer has ``k = ranks.numel()`` slots; slots ``[0, count)`` hold items with the
    given ranks and arrival ``stamps``, the others are empty. The items kept, and the set of
    slots written, equal writing the batch item by item: an item goes to the first empty
    slot, else it replaces the current minimum if it ranks strictly higher (among items of
    equal rank the newest counts as the minimum, so ties keep the older item). An item of the
    batch that is replaced by a later one of the same batch is not kept. Which kept row lands
    in which freed slot may differ: the freed slots go to the kept rows in slot order.

    Vectorised: batch items not above the current minimum are dropped at once; the stored
    items that can be dropped are among the ``m`` lowest (``topk``), ``m`` the number of
    batch items left, and one lexicographic sort over those and the batch items picks the
    drops.

    Args:
        ranks: ``float64`` ranks of the ``k`` slots.
        stamps: ``int64`` arrival stamps of the ``k`` slots (smaller is older).
        count: the number of filled slots (a prefix).
        new: ``float64`` ranks of the batch, in arrival order.
        next_stamp: the stamp of the batch's first item (larger than every stored stamp).

    Returns:
        ``slots`` and ``rows`` (``LongTensor`` s of equal length): the batch row kept in each
        slot written, sorted by row. Rows missing from ``rows`` were dropped.

    Examples:
        >>> ranks = torch.tensor([1.0, 5.0, -math.inf], dtype=torch.float64)
        >>> new = torch.tensor([3.0, 0.5, 4.0], dtype=torch.float64)
        >>> slots, rows = plan_top_k(ranks, torch.tensor([0, 1, 0]), 2, new, 2)
        >>> slots.tolist(), rows.tolist()
        ([2, 0], [0, 2])
    """
    k, n = ranks.numel(), new.numel()
    fill = min(k - count, n)
    fill_slots = torch.arange(count, count + fill)
    fill_rows = torch.arange(fill)
    rest = n - fill
    if rest == 0:
        return fill_slots, fill_rows
    if fill:  # the batch completes the buffer: its first items take the empty slots
        ranks = torch.cat([ranks[:count], new[:fill]])
        stamps = torch.cat([stamps[:count], torch.arange(next_stamp, next_stamp + fill)])
    # a batch item not above the current minimum can never be kept (the minimum only rises)
    live = torch.nonzero(new[fill:] > ranks.min()).squeeze(1)
    if not live.numel():
        return fill_slots, fill_rows
    m = min(live.numel(), k)  # the m lowest stored items hold every stored item dropped
    if m == k:
        threshold = ranks.max()
    else:
        threshold = torch.topk(ranks, m, largest=False, sorted=False).values.max()
    cand = torch.nonzero(ranks <= threshold).squeeze(1)
    n_cand = cand.numel()
    cand_ranks = torch.cat([ranks.index_select(0, cand), new[fill:].index_select(0, live)])
    cand_stamps = torch.cat([stamps.index_select(0, cand), live + (next_stamp + fill)])
    # order by (rank descending, stamp ascending): two stable sorts
    by_stamp = torch.argsort(cand_stamps, stable=True)
    order = by_stamp[torch.argsort(cand_ranks[by_stamp], descending=True, stable=True)]
    kept, dropped = order[:n_cand], order[n_cand:]
    freed = cand.index_select(0, dropped[dropped < n_cand]).sort().values
    incoming = (live.index_select(0, kept[kept >= n_cand] - n_cand) + fill).sort().values
    keep_fill = torch.ones(fill, dtype=torch.bool)
    keep_fill[freed[freed >= count] - count] = False  # batch items replaced by later ones
    slots = torch.cat([fill_slots[keep_fill], freed])
    rows = torch.cat([fill_rows[keep_fill], incoming])
    by_row = torch.argsort(rows)
    return slots.index_select(0, by_row), rows.index_select(0, by_row)


class MaxValueWriter(Writer):
    """Keep the top-``capacity`` items by a rank key (e.g. the episode return).

    Empty slots are filled first, in order; once full, a new item replaces the current
    minimum only if it ranks strictly higher (ties keep the older item; within a batch,
    earlier items win ties). ``extend`` gives the same result as adding the items one by
    one, in a few vectorised passes over the ranks.

    Each item's rank is the entry ``rank_key`` of a TensorDict or (nested) dict item, one
    value per item (per-item shape ``()`` or ``(1,)``), taken as ``float64`` after the cast
    to the stored dtype. The writer keeps the rank of each slot (``-inf`` when empty) on
    the CPU. A writer over a storage that already holds items (e.g. a reopened
    :class:`~rbdata.storages.MemmapStorage`) reads their ranks at its first write.

    Writes go through the storage's two-phase write: the whole batch is validated first
    (layout, rank key, one value per item, no NaN), so bad input leaves the storage and the
    writer as they were; then only the kept rows are committed.

    Args:
        rank_key: the key of the rank: a string or a tuple of strings for a nested key,
            e.g. ``("next", "episode_return")``.
        capacity: the number of items to keep, in slots ``[0, capacity)``; ``None`` (default)
            uses the whole storage. It must not exceed the storage capacity.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rbdata.storages import TensorStorage
        >>> storage, writer = TensorStorage(3), MaxValueWriter("return")
        >>> def episodes(*returns):
        ...     return TensorDict({"return": torch.tensor(returns)}, [len(returns)])
        >>> writer.extend(storage, episodes(1.0, 5.0)).tolist()
        [0, 1]
        >>> writer.extend(storage, episodes(3.0, 0.5, 4.0)).tolist()  # 0.5 is dropped
        [2, 0]
        >>> storage[[0, 1, 2]]["return"].tolist()
        [4.0, 5.0, 3.0]
        >>> writer.add(storage, TensorDict({"return": torch.tensor(2.0)}, []))
        -1
    """

    def __init__(self, rank_key: str | tuple[str, ...], capacity: int | None = None) -> None:
        if isinstance(rank_key, str):
            key: Key = (rank_key,)
        elif (
            isinstance(rank_key, tuple)
            and rank_key
            and all(isinstance(part, str) for part in rank_key)
        ):
            key = rank_key
        else:
            raise TypeError(
                f"rank_key must be a string or a non-empty tuple of strings, got {rank_key!r}"
            )
        self._key = key
        self._capacity = None if capacity is None else check_capacity(capacity, "capacity")
        self._ranks: torch.Tensor | None = None  # per slot; None until the first write
        self._stamps = torch.zeros(0, dtype=torch.long)
        self._count = 0  # filled slots: always the prefix [0, count)
        self._next_stamp = 0

    @property
    def rank_key(self) -> Key:
        """The rank's key path, e.g. ``("return",)``."""
        return self._key

    @property
    def ranks(self) -> torch.Tensor:
        """The rank of the item in each slot (``float64``, ``-inf`` for an empty slot).

        Empty (zero slots) until the first write fixes the capacity.
        """
        if self._ranks is None:
            return torch.zeros(0, dtype=torch.float64)
        return self._ranks

    def __repr__(self) -> str:
        return f"MaxValueWriter(rank_key={key_name(self._key)}, capacity={self._capacity})"

    # --- ranks of incoming data ----------------------------------------------------------
    def _ranks_of(self, prepared: Prepared) -> torch.Tensor:
        """The ``float64`` CPU ranks of a prepared batch or item, validated."""
        name = key_name(self._key)
        layout = prepared.layout
        if layout is None:  # objects (ListStorage): look the key up item by item
            values = [self._lookup(item) for item in prepared.payload]
            ranks = torch.stack(values) if values else torch.zeros(0, dtype=torch.float64)
        else:
            ranks = self._from_layout(layout, prepared.payload, prepared.n, prepared.batched)
        nan = torch.isnan(ranks)
        if bool(nan.any()):
            where = f"batch row {int(nan.nonzero()[0])}" if prepared.batched else "the item"
            raise ValueError(f"rank_key {name}: NaN rank at {where}; ranks must be comparable")
        return ranks

    def _from_layout(
        self, layout: Layout, payload: list[Any], n: int, batched: bool
    ) -> torch.Tensor:
        name = key_name(self._key)
        if layout.kind == "tensor":
            raise ValueError(
                f"rank_key {name}: missing from the data, which is a plain tensor; "
                "MaxValueWriter needs TensorDict or dict items"
            )
        try:
            i = layout.keys.index(self._key)
        except ValueError:
            raise ValueError(
                f"rank_key {name}: missing from the data (keys: {key_names(layout.keys)})"
            ) from None
        leaf = layout.leaves[i]
        if leaf.numel != 1:
            raise ValueError(
                f"rank_key {name}: expected one value per item (per-item shape () or (1,)), "
                f"got per-item shape {leaf.shape}"
            )
        values: torch.Tensor = payload[i]
        return self._as_ranks(values.to(leaf.dtype).reshape(n if batched else 1))

    def _lookup(self, item: Any) -> torch.Tensor:
        name = key_name(self._key)
        node = item
        for part in self._key:
            if not isinstance(node, Mapping) or part not in node:
                raise ValueError(
                    f"rank_key {name}: missing from an item of type {type(item).__name__}"
                )
            node = node[part]
        value = torch.as_tensor(node)
        if value.numel() != 1:
            raise ValueError(
                f"rank_key {name}: expected one value per item (per-item shape () or (1,)), "
                f"got shape {tuple(value.shape)}"
            )
        return self._as_ranks(value.reshape(1))[0]

    def _as_ranks(self, values: torch.Tensor) -> torch.Tensor:
        if values.is_complex():
            raise TypeError(
                f"rank_key {key_name(self._key)}: expected real ranks, got {values.dtype}"
            )
        return values.detach().to(device="cpu", dtype=torch.float64)

    # --- state ---------------------------------------------------------------------------
    def _state_for(self, storage: Storage) -> torch.Tensor:
        """The per-slot ranks, allocated at the first write (reading items already stored)."""
        capacity = storage.capacity if self._capacity is None else self._capacity
        if capacity > storage.capacity:
            raise ValueError(
                f"capacity: MaxValueWriter keeps {capacity} items, more than the storage "
                f"capacity {storage.capacity}"
            )
        ranks = self._ranks
        if ranks is not None:
            if ranks.numel() > storage.capacity:
                raise ValueError(
                    f"capacity: MaxValueWriter keeps {ranks.numel()} items, more than the "
                    f"storage capacity {storage.capacity}"
                )
            return ranks
        ranks = torch.full((capacity,), -math.inf, dtype=torch.float64)
        stamps = torch.zeros(capacity, dtype=torch.long)
        count = min(len(storage), capacity)
        if count:
            ranks[:count] = self._stored_ranks(storage, count)
            stamps[:count] = torch.arange(count)
        self._ranks, self._stamps, self._count, self._next_stamp = ranks, stamps, count, count
        return ranks

    def _stored_ranks(self, storage: Storage, count: int) -> torch.Tensor:
        if storage.layout is None:
            prepared = Prepared([storage[i] for i in range(count)], count, None, True)
        else:
            batch = storage.__getitems__(torch.arange(count))
            prepared = storage.prepare(batch, batched=True)
        return self._ranks_of(prepared)

    def _update(self, slots: torch.Tensor, rows: torch.Tensor, new: torch.Tensor) -> None:
        assert self._ranks is not None
        self._ranks[slots] = new.index_select(0, rows)
        self._stamps[slots] = rows + self._next_stamp
        self._count = min(self._ranks.numel(), self._count + new.numel())
        self._next_stamp += new.numel()

    # --- writes --------------------------------------------------------------------------
    def add(self, storage: Storage, item: Any, check: WriteCheck | None = None) -> int:
        """Write one item if it ranks among the top ``capacity``.

        ``check(slot, item)``, if given, runs before a kept item is written; if it raises,
        the storage and the writer are unchanged.

        Returns:
            The slot written, or ``-1`` if the item was not kept (the buffer is full and the
            item does not rank strictly higher than the current minimum).
        """
        prepared = storage.prepare(item, batched=False)
        new = self._ranks_of(prepared)
        fresh = self._ranks is None
        ranks = self._state_for(storage)
        slots, _ = plan_top_k(ranks, self._stamps, self._count, new, self._next_stamp)
        if not slots.numel():
            self._next_stamp += 1
            return -1
        slot = int(slots[0])
        try:
            if check is not None:
                check(slot, item)
            storage.commit(WriteTarget.one(slot), prepared)
        except BaseException:
            if fresh:  # the ranks read at this first write: back to "not read yet"
                self.reset()
            raise
        self._update(slots, torch.zeros(1, dtype=torch.long), new)
        return slot

    def extend(self, storage: Storage, data: Any, check: WriteCheck | None = None) -> torch.Tensor:
        """Write the items of a batch that rank among the top ``capacity``.

        ``check(slots, data)``, if given, runs with the slots of the kept rows (possibly
        none) before anything is written; if it raises, the storage and the writer are
        unchanged.

        Returns:
            The slots written as a ``LongTensor``, one per *kept* row, in batch order.
            Dropped rows have no entry, so the result can be shorter than the batch (a
            sampler's ``on_write`` hook gets these slots and the whole batch).
        """
        prepared = storage.prepare(data, batched=True)
        new = self._ranks_of(prepared)
        fresh = self._ranks is None
        ranks = self._state_for(storage)
        slots, rows = plan_top_k(ranks, self._stamps, self._count, new, self._next_stamp)
        try:
            if check is not None:
                check(slots, data)
            if slots.numel():
                subset = prepared if rows.numel() == prepared.n else prepared.take(rows)
                storage.commit(WriteTarget.of_slots(slots), subset)
        except BaseException:
            if fresh:  # the ranks read at this first write: back to "not read yet"
                self.reset()
            raise
        self._update(slots, rows, new)
        return slots

    # --- state ---------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every rank (the next write re-reads whatever the storage still holds)."""
        self._ranks = None
        self._stamps = torch.zeros(0, dtype=torch.long)
        self._count = 0
        self._next_stamp = 0

    def config(self) -> dict[str, Any]:
        """``rank_key`` and ``capacity``."""
        return {"rank_key": self._key, "capacity": self._capacity}

    def state_dict(self) -> dict[str, Any]:
        """The rank key, capacity, per-slot ``ranks`` and ``stamps`` (tensors), count, stamp.

        ``ranks`` and ``stamps`` are ``None`` before the first write.
        """
        ranks = self._ranks
        return {
            "rank_key": list(self._key),
            "capacity": self._capacity,
            "ranks": None if ranks is None else ranks.clone(),
            "stamps": None if ranks is None else self._stamps.clone(),
            "count": self._count,
            "next_stamp": self._next_stamp,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (of a writer with the same rank key)."""
        key = tuple(state["rank_key"])
        if key != self._key:
            raise ValueError(
                f"state: rank_key {key_name(key)} does not match this writer's "
                f"{key_name(self._key)}"
            )
        capacity = state["capacity"]
        capacity = None if capacity is None else check_capacity(capacity, "capacity")
        ranks, stamps = state["ranks"], state["stamps"]
        count, next_stamp = int(state["count"]), int(state["next_stamp"])
        if ranks is None:
            self.reset()
            self._capacity = capacity
            return
        ranks = torch.as_tensor(ranks, dtype=torch.float64).detach().cpu().clone()
        stamps = torch.as_tensor(stamps, dtype=torch.long).detach().cpu().clone()
        if ranks.dim() != 1 or stamps.shape != ranks.shape:
            raise ValueError(
                f"state: expected 1-D 'ranks' and 'stamps' of equal shape, got "
                f"{tuple(ranks.shape)} and {tuple(stamps.shape)}"
            )
        if capacity is not None and ranks.numel() != capacity:
            raise ValueError(f"state: {ranks.numel()} ranks for a capacity of {capacity}")
        if not 0 <= count <= ranks.numel() or bool(torch.isnan(ranks).any()):
            raise ValueError(f"state: count {count} or ranks invalid for {ranks.numel()} slots")
        self._capacity = capacity
        self._ranks, self._stamps = ranks, stamps
        self._count, self._next_stamp = count, next_stamp
