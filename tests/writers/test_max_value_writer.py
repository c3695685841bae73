"""MaxValueWriter: top-k by a rank key, against a brute-force one-by-one reference."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rbdata import ListStorage, MaxValueWriter, MemmapStorage, ReplayBuffer, TensorStorage
from rbdata.storages import Prepared, Storage
from rbdata.writers.max_value import plan_top_k

KEY = ("next", "return")
KINDS = ["tensor", "memmap", "list", "objects"]


# --- the reference ---------------------------------------------------------------------------
def reference(capacity: int, batches: list[list[float]]) -> dict[int, float]:
    """Add items one by one: fill empty slots, else replace the minimum if strictly higher.

    Items are numbered in arrival order; among minimum ties the newest one is replaced, so
    ties keep the older item. Returns the kept ``{id: rank}``.
    """
    kept: list[tuple[float, int]] = []
    next_id = 0
    for batch in batches:
        for rank in batch:
            if len(kept) < capacity:
                kept.append((rank, next_id))
            else:
                low = min(range(capacity), key=lambda j: (kept[j][0], -kept[j][1]))
                if rank > kept[low][0]:
                    kept[low] = (rank, next_id)
            next_id += 1
    return {i: r for r, i in kept}


# --- data and storages -----------------------------------------------------------------------
def episodes(kind: str, ranks: list[float], start: int) -> Any:
    """A batch whose item ``j`` has id ``start + j`` and rank ``ranks[j]``."""
    ids = list(range(start, start + len(ranks)))
    if kind == "objects":
        return [
            {"id": i, "return": r, "name": f"episode {i}"} for i, r in zip(ids, ranks, strict=True)
        ]
    n = len(ranks)
    return TensorDict(
        {
            "id": torch.tensor(ids, dtype=torch.long),
            "observation": torch.tensor(ids, dtype=torch.float32).unsqueeze(1).expand(n, 3),
            KEY: torch.tensor(ranks, dtype=torch.float64).reshape(n, 1),
        },
        batch_size=[n],
    )


def one(kind: str, rank: float, i: int) -> Any:
    batch = episodes(kind, [rank], i)
    return batch[0]


def key_for(kind: str) -> str | tuple[str, ...]:
    return "return" if kind == "objects" else KEY


def contents(kind: str, storage: Storage) -> dict[int, tuple[int, float]]:
    """``{slot: (id, rank)}`` of everything stored, read back from the storage."""
    n = len(storage)
    if kind == "objects":
        return {s: (storage[s]["id"], storage[s]["return"]) for s in range(n)}
    if not n:
        return {}
    batch = storage[list(range(n))]
    ids, ranks = batch["id"].tolist(), batch[KEY].reshape(n).tolist()
    for s in range(n):  # every field of the item is the one of its id
        assert batch["observation"][s].tolist() == [float(ids[s])] * 3
    return {s: (ids[s], ranks[s]) for s in range(n)}


@pytest.fixture
def make() -> Iterator[Callable[[str, int], Storage]]:
    opened: list[Storage] = []

    def factory(kind: str, capacity: int) -> Storage:
        storage: Storage
        if kind == "tensor":
            storage = TensorStorage(capacity)
        elif kind == "memmap":
            storage = MemmapStorage(capacity)
        else:
            storage = ListStorage(capacity)
        opened.append(storage)
        return storage

    yield factory
    for storage in opened:
        if isinstance(storage, MemmapStorage):
            storage.close()


def snapshot(rb: ReplayBuffer, kind: str) -> tuple[Any, ...]:
    state = rb.writer.state_dict()
    tensors = {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)}
    plain = {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}
    return len(rb.storage), contents(kind, rb.storage), plain, tensors


def assert_same(before: tuple[Any, ...], after: tuple[Any, ...]) -> None:
    assert after[:3] == before[:3]
    assert after[3].keys() == before[3].keys()
    for key, value in before[3].items():
        torch.testing.assert_close(after[3][key], value, msg=lambda m, k=key: f"{k}: {m}")


RANKS = st.sampled_from([-math.inf, -2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0, math.inf])
OPS = st.lists(
    st.one_of(st.lists(RANKS, max_size=12), RANKS),  # a list is an extend, a float an add
    min_size=1,
    max_size=6,
)


# --- equivalence with the reference ----------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(capacity=st.integers(1, 8), spare=st.integers(0, 3), ops=OPS)
def test_matches_one_by_one_reference(
    make: Callable[[str, int], Storage], kind: str, capacity: int, spare: int, ops: list[Any]
) -> None:
    storage = make(kind, capacity + spare)
    writer = MaxValueWriter(key_for(kind), capacity=capacity if spare else None)
    rb = ReplayBuffer(storage, writer=writer)
    done: list[list[float]] = []
    next_id = 0
    for op in ops:
        batch = op if isinstance(op, list) else [op]
        before = contents(kind, storage)
        if isinstance(op, list):
            slots = rb.extend(episodes(kind, batch, next_id)).tolist()
        else:
            slot = rb.add(one(kind, op, next_id))
            slots = [] if slot == -1 else [slot]
        done.append(batch)
        expected = reference(capacity, done)
        after = contents(kind, storage)
        # the final content is the reference's, each item with its own rank and data
        assert sorted(i for i, _ in after.values()) == sorted(expected)
        for i, rank in after.values():
            assert rank == expected[i]
        # the slots returned hold the kept rows of this batch, in batch order
        new_ids = [i for i in sorted(expected) if next_id <= i < next_id + len(batch)]
        assert [after[s][0] for s in slots] == new_ids
        assert len(set(slots)) == len(slots) and all(0 <= s < capacity for s in slots)
        assert {s: v for s, v in after.items() if s not in slots} == {
            s: v for s, v in before.items() if s not in slots
        }
        # the writer's view of the ranks is the storage's
        ranks = writer.ranks.tolist()
        assert len(ranks) == capacity
        assert ranks == [after[s][1] if s in after else -math.inf for s in range(capacity)]
        next_id += len(batch)
    assert len(storage) <= capacity


def test_large_batches_match_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    storage, writer = TensorStorage(50), MaxValueWriter(KEY)
    batches = [torch.randint(0, 200, (n,), generator=gen).double().tolist() for n in (30, 700)]
    batches.append(torch.randn(2000, generator=gen).mul(100).round().tolist())
    start = 0
    for batch in batches:
        writer.extend(storage, episodes("tensor", batch, start))
        start += len(batch)
    expected = reference(50, batches)
    got = contents("tensor", storage)
    assert {i: r for i, r in got.values()} == expected


def test_ties_keep_the_older_item() -> None:
    storage, writer = TensorStorage(2), MaxValueWriter(KEY)
    writer.extend(storage, episodes("tensor", [1.0, 1.0], 0))
    assert writer.extend(storage, episodes("tensor", [1.0, 1.0], 2)).tolist() == []
    # 2.0 replaces the newest of the tied minimums (id 1), then 3.0 the minimum left (id 0);
    # the kept rows take the freed slots in ascending order
    assert writer.extend(storage, episodes("tensor", [2.0, 3.0], 4)).tolist() == [0, 1]
    assert contents("tensor", storage) == {0: (4, 2.0), 1: (5, 3.0)}
    assert writer.add(storage, one("tensor", 2.0, 6)) == -1
    assert writer.add(storage, one("tensor", 2.5, 7)) == 0


def test_batch_larger_than_capacity_keeps_its_best() -> None:
    storage, writer = TensorStorage(3), MaxValueWriter(KEY)
    slots = writer.extend(storage, episodes("tensor", [5.0, 1.0, 7.0, 5.0, 9.0, 0.0], 0))
    assert slots.dtype == torch.long
    assert sorted(i for i, _ in contents("tensor", storage).values()) == [0, 2, 4]
    assert [contents("tensor", storage)[s][0] for s in slots.tolist()] == [0, 2, 4]


def test_plan_is_a_pure_function() -> None:
    ranks = torch.tensor([2.0, 1.0, 3.0], dtype=torch.float64)
    stamps = torch.tensor([0, 1, 2])
    new = torch.tensor([1.5, 0.0], dtype=torch.float64)
    slots, rows = plan_top_k(ranks, stamps, 3, new, 3)
    assert (slots.tolist(), rows.tolist()) == ([1], [0])
    assert ranks.tolist() == [2.0, 1.0, 3.0] and stamps.tolist() == [0, 1, 2]


# --- through ReplayBuffer --------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_replay_buffer_keeps_the_best_episodes(
    make: Callable[[str, int], Storage], kind: str
) -> None:
    rb = ReplayBuffer(make(kind, 4), writer=MaxValueWriter(key_for(kind)), batch_size=8)
    assert rb.extend(episodes(kind, [3.0, 1.0, 4.0], 0)).tolist() == [0, 1, 2]
    assert rb.extend(episodes(kind, [1.0, 5.0, 9.0, 2.0], 3)).tolist() == [1, 3]
    assert rb.add(one(kind, 2.0, 7)) == -1
    assert rb.add(one(kind, 6.0, 8)) == 0
    assert contents(kind, rb.storage) == {0: (8, 6.0), 1: (4, 5.0), 2: (2, 4.0), 3: (5, 9.0)}
    batch = rb.sample()
    assert set(batch["id"].tolist()) <= {8, 5, 2, 4}  # objects come back collated
    rb.empty()
    assert len(rb) == 0 and rb.writer.state_dict()["ranks"] is None
    assert rb.extend(episodes(kind, [0.0], 9)).tolist() == [0]


def test_writer_capacity_below_storage_capacity_uses_a_prefix() -> None:
    storage, writer = TensorStorage(10), MaxValueWriter(KEY, capacity=3)
    writer.extend(storage, episodes("tensor", [1.0, 2.0, 3.0, 4.0, 5.0], 0))
    assert len(storage) == 3
    assert sorted(r for _, r in contents("tensor", storage).values()) == [3.0, 4.0, 5.0]


def test_state_dict_roundtrip_continues_identically() -> None:
    batches = [[1.0, 1.0, 2.0], [2.0, 0.0, 1.0, 3.0], [1.0, 2.0, 2.0, 5.0]]
    storage_a, writer_a = TensorStorage(4), MaxValueWriter(KEY)
    for j, batch in enumerate(batches):
        writer_a.extend(storage_a, episodes("tensor", batch, 10 * j))
    storage_b, writer_b = TensorStorage(4), MaxValueWriter(KEY)
    writer_b.extend(storage_b, episodes("tensor", batches[0], 0))
    writer_c = MaxValueWriter(KEY)
    writer_c.load_state_dict(writer_b.state_dict())
    for j, batch in enumerate(batches[1:], start=1):
        writer_c.extend(storage_b, episodes("tensor", batch, 10 * j))
    assert contents("tensor", storage_b) == contents("tensor", storage_a)
    assert writer_c.state_dict()["count"] == writer_a.state_dict()["count"]
    torch.testing.assert_close(writer_c.ranks, writer_a.ranks)
    fresh = MaxValueWriter(KEY)
    fresh.load_state_dict(MaxValueWriter(KEY).state_dict())
    assert fresh.state_dict()["ranks"] is None


def test_load_state_dict_refuses_a_foreign_state() -> None:
    writer = MaxValueWriter(KEY)
    writer.extend(TensorStorage(3), episodes("tensor", [1.0], 0))
    with pytest.raises(ValueError, match=r"rank_key 'score' does not match"):
        MaxValueWriter(KEY).load_state_dict({**writer.state_dict(), "rank_key": ["score"]})
    with pytest.raises(ValueError, match=r"state: 3 ranks for a capacity of 2"):
        MaxValueWriter(KEY).load_state_dict({**writer.state_dict(), "capacity": 2})


def test_reopened_storage_keeps_its_top_k(tmp_path: Any) -> None:
    path = tmp_path / "best"
    storage = MemmapStorage(4, path=path)
    MaxValueWriter(KEY).extend(storage, episodes("tensor", [3.0, 1.0, 4.0, 1.5, 5.0], 0))
    storage.close()
    reopened = MemmapStorage.open(path)
    try:
        writer = MaxValueWriter(KEY)  # reads the ranks already stored at its first write
        writer.extend(reopened, episodes("tensor", [9.0, 2.0, 0.0], 5))
        expected = reference(4, [[3.0, 1.0, 4.0, 1.5, 5.0], [9.0, 2.0, 0.0]])
        assert {i: r for i, r in contents("tensor", reopened).values()} == expected
    finally:
        reopened.close()


# --- bad input -------------------------------------------------------------------------------
def without_rank(kind: str, n: int) -> Any:
    if kind == "objects":
        return [{"id": i, "score": 1.0} for i in range(n)]
    return episodes(kind, [0.0] * n, 0).exclude(KEY)


def wide_rank(kind: str, n: int) -> Any:
    if kind == "objects":
        return [{"id": i, "return": [1.0, 2.0]} for i in range(n)]
    batch = episodes(kind, [0.0] * n, 0)
    return batch.set(KEY, torch.zeros(n, 2, dtype=torch.float64))


def nan_rank(kind: str, n: int) -> Any:
    return episodes(kind, [1.0, 2.0, math.nan][:n] + [0.0] * max(0, n - 3), 100)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("filled", [0, 2, 4], ids=["empty", "partial", "full"])
@pytest.mark.parametrize(
    ("bad", "error", "pattern"),
    [
        (without_rank, ValueError, r"(rank_key|missing key) \('next', 'return'\)|'return'"),
        (wide_rank, ValueError, r"one value per item|per-item shape"),
        (nan_rank, ValueError, r"rank_key .*: NaN rank at batch row 2"),
    ],
    ids=["missing", "wide", "nan"],
)
def test_bad_extend_leaves_buffer_unchanged(
    make: Callable[[str, int], Storage],
    kind: str,
    filled: int,
    bad: Callable[[str, int], Any],
    error: type,
    pattern: str,
) -> None:
    rb = ReplayBuffer(make(kind, 4), writer=MaxValueWriter(key_for(kind)))
    if filled:
        rb.extend(episodes(kind, [float(i) for i in range(filled)], 0))
    before = snapshot(rb, kind)
    with pytest.raises(error, match=pattern):
        rb.extend(bad(kind, 3))
    assert_same(before, snapshot(rb, kind))
    if not filled:
        assert rb.storage.layout is None
    rb.extend(episodes(kind, [7.0], 50))  # still usable afterwards
    assert any(i == 50 for i, _ in contents(kind, rb.storage).values())


@pytest.mark.parametrize("kind", KINDS)
def test_bad_add_leaves_buffer_unchanged(make: Callable[[str, int], Storage], kind: str) -> None:
    rb = ReplayBuffer(make(kind, 2), writer=MaxValueWriter(key_for(kind)))
    rb.extend(episodes(kind, [1.0, 2.0], 0))
    before = snapshot(rb, kind)
    with pytest.raises(ValueError, match=r"NaN rank at the item"):
        rb.add(one(kind, math.nan, 9))
    with pytest.raises(ValueError, match=r"one value per item|per-item shape"):
        rb.add(wide_rank(kind, 1)[0])
    assert_same(before, snapshot(rb, kind))


def test_first_write_without_rank_key_names_it() -> None:
    rb = ReplayBuffer(TensorStorage(4), writer=MaxValueWriter(KEY))
    with pytest.raises(ValueError, match=r"rank_key \('next', 'return'\): missing .*'id'"):
        rb.extend(without_rank("tensor", 3))
    assert rb.storage.layout is None and len(rb) == 0
    with pytest.raises(ValueError, match=r"rank_key 'return': .*plain tensor"):
        MaxValueWriter("return").extend(TensorStorage(4), torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"rank_key 'return': missing from an item of type str"):
        MaxValueWriter("return").extend(ListStorage(4), ["a", "b"])


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match=r"rank_key must be a string"):
        MaxValueWriter(("next", 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"capacity must be a positive integer, got 0"):
        MaxValueWriter(KEY, capacity=0)
    storage = TensorStorage(3)
    with pytest.raises(ValueError, match=r"capacity: MaxValueWriter keeps 5 items, .* 3"):
        MaxValueWriter(KEY, capacity=5).extend(storage, episodes("tensor", [1.0], 0))
    assert len(storage) == 0
    with pytest.raises(TypeError, match=r"expected real ranks"):
        MaxValueWriter("r").extend(
            storage, TensorDict({"r": torch.ones(2, dtype=torch.cfloat)}, [2])
        )
    assert repr(MaxValueWriter(KEY)) == "MaxValueWriter(rank_key=('next', 'return'), capacity=None)"


# --- Prepared.take ---------------------------------------------------------------------------
def test_prepared_take_selects_rows() -> None:
    prepared = TensorStorage(5).prepare(episodes("tensor", [1.0, 2.0, 3.0], 0), batched=True)
    sub = prepared.take(torch.tensor([2, 0]))
    assert sub.n == 2 and sub.batched and sub.layout is prepared.layout
    ids = sub.payload[prepared.layout.keys.index(("id",))]  # type: ignore[union-attr]
    assert ids.tolist() == [2, 0]
    objects = ListStorage(5).prepare(["a", "b", "c"], batched=True)
    assert objects.take([1, 2]).payload == ["b", "c"]
    with pytest.raises(IndexError, match=r"index 3 is out of range for a batch of size 3"):
        objects.take([3])
    with pytest.raises(ValueError, match=r"take needs a batch"):
        Prepared([torch.zeros(2)], 1, None, batched=False).take([0])


def test_dropped_add_leaves_priorities_alone() -> None:
    from rbdata import PrioritizedSampler

    sampler = PrioritizedSampler(2, alpha=1.0, beta=0.0, eps=0.0)
    rb = ReplayBuffer(TensorStorage(2), sampler=sampler, writer=MaxValueWriter("r"))
    rb.extend({"r": torch.tensor([5.0, 6.0])})
    rb.update_priority([0, 1], [2.0, 3.0])
    assert rb.add({"r": torch.tensor(1.0)}) == -1  # ranks lower than both: dropped
    assert sampler.priority_values([0, 1]).tolist() == [2.0, 3.0]
