"""The writer contract over every writer, plus the rules that differ by writer."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from storage_contract import snapshot
from writer_contract import RefuseModel, TopKModel, WriterContract, ranked, slot_contents

from rbdata.errors import ReadOnlyError
from rbdata.storages import TensorStorage
from rbdata.writers import ImmutableWriter, MaxValueWriter, RoundRobinWriter


class TestRoundRobinWriter(WriterContract):
    def make(self) -> Any:
        return RoundRobinWriter()

    def bad_states(self, state: dict[str, Any]) -> list[tuple[dict[str, Any], type, str]]:
        return [
            ({**state, "cursor": "x"}, ValueError, "cursor must be None or an int"),
            ({**state, "cursor": -1}, ValueError, "cursor must be >= 0"),
            ({**state, "cursor": True}, ValueError, "cursor must be None or an int"),
        ]

    def test_batch_larger_than_the_storage_changes_nothing(self) -> None:
        # by design: a ring cannot keep more than its capacity (a top-k writer drops the rest)
        storage, writer = TensorStorage(8), RoundRobinWriter()
        writer.extend(storage, ranked(3))
        before, contents = writer.state_dict(), slot_contents(storage)
        with pytest.raises(ValueError, match="a batch of 9 items is more than the storage"):
            writer.extend(storage, ranked(9, 10))
        assert writer.state_dict() == before and slot_contents(storage) == contents

    @pytest.mark.parametrize("cursor", [-3, 8, 100])
    def test_a_cursor_outside_the_storage_is_refused(self, cursor: int) -> None:
        storage, writer = TensorStorage(8), RoundRobinWriter()
        writer.extend(storage, ranked(3))
        contents = slot_contents(storage)
        try:
            writer.load_state_dict({"cursor": cursor})
        except ValueError:
            return  # refused at load: fine
        with pytest.raises(ValueError, match="cursor"):  # else at the next write, cleanly
            writer.extend(storage, ranked(2, 10))
        assert slot_contents(storage) == contents and len(storage) == 3


class TestMaxValueWriter(WriterContract):
    model = TopKModel

    def make(self) -> Any:
        return MaxValueWriter("rank")

    def bad_states(self, state: dict[str, Any]) -> list[tuple[dict[str, Any], type, str]]:
        ranks = state["ranks"]
        nan = ranks.clone()
        nan[0] = float("nan")
        return [
            ({**state, "rank_key": ["other"]}, ValueError, "does not match"),
            ({**state, "ranks": ranks[:-1]}, ValueError, "of equal shape"),
            ({**state, "capacity": 4}, ValueError, "8 ranks for a capacity of 4"),
            ({**state, "count": 9}, ValueError, "count 9 or ranks invalid"),
            ({**state, "ranks": nan}, ValueError, f"count {state['count']} or ranks invalid"),
            ({**state, "capacity": 0}, ValueError, "capacity"),
        ]

    def test_writer_larger_than_its_storage_is_refused(self) -> None:
        storage, writer = TensorStorage(8), MaxValueWriter("rank", capacity=16)
        with pytest.raises(ValueError, match="keeps 16 items, more than the storage capacity 8"):
            writer.extend(storage, ranked(3))
        assert len(storage) == 0 and writer.state_dict()["ranks"] is None

    def test_writer_smaller_than_its_storage_uses_the_first_slots(self) -> None:
        storage, writer, model = TensorStorage(8), MaxValueWriter("rank", capacity=4), TopKModel(4)
        self_writes = [ranked(3), ranked(5, 3), ranked(2, 8)]
        for data in self_writes:
            slots = writer.extend(storage, data).tolist()
            assert sorted(slots) == sorted(model.write(data["rank"].tolist()) or [])
        assert len(storage) == 4
        kept = sorted(r for r, _ in slot_contents(storage).values())
        assert kept == sorted(h[0] for h in model.held if h is not None)

    def test_a_rank_writer_over_another_storage_keeps_its_ranks(self) -> None:
        # by design: the ranks are the writer's; only its first write reads a storage's
        writer, model = MaxValueWriter("rank"), TopKModel(8)
        first = ranked(8)
        model.write(first["rank"].tolist())
        writer.extend(TensorStorage(8), first)
        other = TensorStorage(8)
        other.set(slice(0, 2), ranked(2, 500))  # ranks the writer never reads
        new = ranked(3, 900)
        slots = writer.extend(other, new).tolist()
        assert sorted(slots) == sorted(model.write(new["rank"].tolist()) or [])
        assert sorted(writer.ranks.tolist()) == sorted(h[0] for h in model.held if h)


class TestImmutableWriter(WriterContract):
    model = RefuseModel  # by design: every write is refused, whatever the data or the state

    def make(self) -> Any:
        return ImmutableWriter()

    def test_state_is_empty(self) -> None:
        writer = ImmutableWriter()
        assert writer.state_dict() == {}
        writer.load_state_dict({})
        with pytest.raises(ReadOnlyError, match="add is not allowed"):
            writer.add(TensorStorage(4), torch.zeros(2))
        assert snapshot(writer.state_dict()) == {}
