"""The writer contract, run over every writer (subclass ``WriterContract``, define ``make``).

Expectations come from brute-force models of the slot choice (:class:`RingModel`,
:class:`TopKModel`, :class:`RefuseModel`), never from the writer code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from storage_contract import same_state, snapshot
from tensordict import TensorDict

from rbdata.errors import ReadOnlyError
from rbdata.storages import Storage, TensorStorage

__all__ = [
    "RefuseModel",
    "RingModel",
    "TopKModel",
    "WriterContract",
    "WriterModel",
    "ranked",
    "slot_contents",
]


class WriterModel:
    """Brute-force slot choice of a writer: ``write(ranks)`` returns the slots, or ``None`` if
    the writer refuses every write."""

    #: whether the writer puts each kept row in the model's slot (else: same slots, same rows)
    exact = True

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        #: the batch row written to each slot returned by the last ``write`` (in its order)
        self.rows: list[int] = []

    def write(self, ranks: list[float]) -> list[int] | None:  # pragma: no cover - overridden
        raise NotImplementedError


class RingModel(WriterModel):
    """The next slot after the last one written, wrapping at the capacity."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.cursor = 0

    def write(self, ranks: list[float]) -> list[int] | None:
        slots = [(self.cursor + i) % self.capacity for i in range(len(ranks))]
        self.rows = list(range(len(ranks)))
        self.cursor = (self.cursor + len(ranks)) % self.capacity
        return slots


class TopKModel(WriterModel):
    """Item by item: the first empty slot, else replace the minimum if strictly higher.

    Within one batch ``MaxValueWriter`` gives the slots it frees to the kept rows in slot
    order (``plan_top_k``), not in replacement order: the items kept and the slots written
    are the model's, which kept row lands in which freed slot is not (``exact = False``).
    """

    exact = False

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.held: list[tuple[float, int] | None] = [None] * capacity  # (rank, arrival)
        self.arrival = 0

    def write(self, ranks: list[float]) -> list[int] | None:
        written: dict[int, int] = {}  # slot -> batch row (a later row may replace an earlier)
        for row, rank in enumerate(ranks):
            self.arrival += 1
            if None in self.held:
                slot = self.held.index(None)
            else:  # lowest rank; among ties the newest
                slot = min(range(self.capacity), key=lambda s: (self.held[s][0], -self.held[s][1]))  # type: ignore[index]
                if not rank > self.held[slot][0]:  # type: ignore[index]
                    continue
            self.held[slot] = (rank, self.arrival)
            written[slot] = row
        kept = sorted(written.items(), key=lambda kv: kv[1])
        self.rows = [row for _, row in kept]
        return [slot for slot, _ in kept]


class RefuseModel(WriterModel):
    def write(self, ranks: list[float]) -> list[int] | None:
        return None


def ranked(n: int, start: int = 0, seed: int = 0) -> TensorDict:
    """``n`` items with an ``id`` and a distinct, seeded ``rank`` (``float64``)."""
    ids = torch.arange(start, start + n)
    rank = torch.randperm(1000, generator=torch.Generator().manual_seed(seed + start))[:n]
    return TensorDict({"id": ids, "rank": rank.to(torch.float64) + 0.5}, batch_size=[n])


#: the writes of the writer tests: ``("extend", n)`` or ``("add", 1)``
WRITES = [("extend", 3), ("add", 1), ("extend", 5), ("extend", 7), ("add", 1), ("extend", 2)]


class WriterContract:
    """Subclass with ``make()`` (a fresh writer) and ``model`` (a :class:`WriterModel` class).

    Items are :func:`ranked`: an ``id`` and a distinct ``rank`` (read by rank writers).
    """

    model: type[WriterModel] = RingModel
    capacity = 8

    def make(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def bad_states(self, state: dict[str, Any]) -> list[tuple[dict[str, Any], type, str]]:
        """States this writer must refuse, with the error and its message."""
        return []

    def write(
        self, writer: Any, storage: Storage, model: WriterModel, how: str, n: int, start: int
    ) -> None:
        """One write, checked against the model: the slots returned and what they hold."""
        data = ranked(n, start)
        expected = model.write(data["rank"].tolist())
        if expected is None:
            before = slot_contents(storage)
            with pytest.raises(ReadOnlyError, match="read-only"):
                writer.add(storage, data[0]) if how == "add" else writer.extend(storage, data)
            assert slot_contents(storage) == before
            return
        if how == "add":
            slot = writer.add(storage, data[0])
            got = [slot] if slot >= 0 else []
        else:
            slots = writer.extend(storage, data)
            assert slots.dtype == torch.long
            got = slots.tolist()
        ids = getattr(model, "ids", {})
        for slot, row in zip(expected, model.rows, strict=True):
            ids[slot] = start + row
        model.ids = ids  # type: ignore[attr-defined]
        held = {s: i for s, (_, i) in slot_contents(storage).items()}
        if model.exact:
            assert got == expected
            assert held == ids
        else:
            assert sorted(got) == sorted(expected)
            assert held.keys() == ids.keys() and sorted(held.values()) == sorted(ids.values())
            # follow the writer's pairing, so the next writes are checked slot by slot
            by_id = {ids[s]: model.held[s] for s in ids}  # type: ignore[attr-defined]
            for slot, item in held.items():
                model.held[slot] = by_id[item]  # type: ignore[attr-defined]
            model.ids = dict(held)  # type: ignore[attr-defined]

    def run_writes(
        self,
        writer: Any,
        storage: Storage,
        model: WriterModel,
        writes: list[tuple[str, int]],
        start: int = 0,
    ) -> int:
        for how, n in writes:
            self.write(writer, storage, model, how, n, start)
            start += n
        return start

    # --- slot choice -----------------------------------------------------------------------
    def test_slots_match_the_model(self) -> None:
        storage, model = TensorStorage(self.capacity), self.model(self.capacity)
        writer = self.make()
        self.run_writes(writer, storage, model, WRITES)
        held = slot_contents(storage)
        ids = {s: i for s, (_, i) in held.items()}
        expected = getattr(model, "ids", {})
        if model.exact:
            assert ids == expected
        else:
            assert ids.keys() == expected.keys()
            assert sorted(ids.values()) == sorted(expected.values())
        if isinstance(model, TopKModel):  # the ranks kept are the model's
            assert sorted(r for r, _ in held.values()) == sorted(h[0] for h in model.held if h)

    def test_same_writes_same_slots_and_state(self) -> None:
        a, b = self.make(), self.make()
        sa, sb = TensorStorage(self.capacity), TensorStorage(self.capacity)
        self.run_writes(a, sa, self.model(self.capacity), WRITES)
        self.run_writes(b, sb, self.model(self.capacity), WRITES)
        assert same_state(a.state_dict(), b.state_dict())
        assert slot_contents(sa) == slot_contents(sb)

    # --- state_dict ------------------------------------------------------------------------
    @pytest.mark.parametrize("split", [0, 2, 4])
    def test_state_dict_round_trip_continues_the_slots(self, split: int) -> None:
        storage, model = TensorStorage(self.capacity), self.model(self.capacity)
        writer = self.make()
        start = self.run_writes(writer, storage, model, WRITES[:split])
        state = snapshot(writer.state_dict())
        other = self.make()
        self.run_writes(
            other, TensorStorage(self.capacity), self.model(self.capacity), WRITES[:1], 500
        )
        other.load_state_dict(state)
        assert same_state(other.state_dict(), state)
        self.run_writes(other, storage, model, WRITES[split:], start)  # same slots as without

    def test_fresh_writer_continues_a_filled_storage(self) -> None:
        storage, model = TensorStorage(self.capacity), self.model(self.capacity)
        start = self.run_writes(self.make(), storage, model, WRITES[:4])  # full and wrapped
        self.run_writes(self.make(), storage, model, WRITES[4:], start)

    # --- bad input -------------------------------------------------------------------------
    @pytest.mark.parametrize("written", [0, 3])
    @pytest.mark.parametrize(
        ("mutate", "error", "pattern"),
        [
            (lambda td: td.exclude("id"), ValueError, "missing key 'id'"),
            (lambda td: td.set("id", td["id"].float()), TypeError, "'id': expected dtype"),
            (lambda td: td.set("id", td["id"].unsqueeze(1)), ValueError, "per-item shape"),
        ],
        ids=["missing", "dtype", "shape"],
    )
    @pytest.mark.parametrize("how", ["extend", "add"])
    def test_bad_data_changes_nothing(
        self, written: int, mutate: Callable, error: type, pattern: str, how: str
    ) -> None:
        storage, model = TensorStorage(self.capacity), self.model(self.capacity)
        writer = self.make()
        start = self.run_writes(writer, storage, model, WRITES[:written])
        if not len(storage):  # the layout comes from a first good write
            storage.set(slice(0, 1), ranked(1, 900))
        before, contents = snapshot(writer.state_dict()), slot_contents(storage)
        data = mutate(ranked(3, start))
        if model.write([]) is None:  # refuses every write, whatever the data
            error, pattern = ReadOnlyError, "read-only"
        with pytest.raises(error, match=pattern):
            writer.add(storage, data[0]) if how == "add" else writer.extend(storage, data)
        assert same_state(writer.state_dict(), before)
        assert slot_contents(storage) == contents

    @pytest.mark.parametrize("written", [0, 4])
    @pytest.mark.parametrize("how", ["extend", "add"])
    def test_refused_check_changes_nothing(self, written: int, how: str) -> None:
        storage, model = TensorStorage(self.capacity), self.model(self.capacity)
        writer = self.make()
        start = self.run_writes(writer, storage, model, WRITES[:written])
        before, contents = snapshot(writer.state_dict()), slot_contents(storage)
        seen: list[Any] = []

        def refuse(slots: Any, data: Any) -> None:
            seen.append(slots)
            raise RuntimeError("refused by the check")

        data = ranked(3, start, seed=1)
        data["rank"] += 10_000  # ranks above every stored one: a top-k writer keeps them
        if model.write([]) is None:
            with pytest.raises(ReadOnlyError, match="read-only"):
                writer.extend(storage, data, refuse)
            assert seen == []
        else:
            with pytest.raises(RuntimeError, match="refused by the check"):
                writer.add(storage, data[0], refuse) if how == "add" else writer.extend(
                    storage, data, refuse
                )
            assert len(seen) == 1
        assert same_state(writer.state_dict(), before)
        assert slot_contents(storage) == contents
        self.run_writes(writer, storage, model, WRITES[written:], start)  # as if never tried

    def test_bad_state_is_refused_and_changes_nothing(self) -> None:
        storage, model = TensorStorage(self.capacity), self.model(self.capacity)
        writer = self.make()
        start = self.run_writes(writer, storage, model, WRITES[:3])
        before = snapshot(writer.state_dict())
        for state, error, pattern in self.bad_states(snapshot(before)):
            with pytest.raises(error, match=pattern):
                writer.load_state_dict(state)
            assert same_state(writer.state_dict(), before)
        self.run_writes(writer, storage, model, WRITES[3:], start)


def slot_contents(storage: Storage) -> dict[int, tuple[float, int]]:
    """Slot -> (rank, id) of every item in ``storage``."""
    n = len(storage)
    if not n:
        return {}
    batch = storage[list(range(n))]
    return {
        i: (float(r), int(d))
        for i, (r, d) in enumerate(zip(batch["rank"], batch["id"], strict=True))
    }
