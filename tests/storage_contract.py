"""The storage contract, run over every storage (subclass ``StorageContract``, define ``make``).

Every expectation is independent of the code under test: a brute-force ring model, a
per-item loop over the reference data, or a known value.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

from rbdata import ReplayBuffer
from rbdata.errors import EmptyBufferError
from rbdata.storages import Storage

__all__ = ["StorageContract", "ring_model", "same_state", "snapshot", "transitions"]


def transitions(n: int, start: int = 0) -> TensorDict:
    """``n`` transitions whose every field encodes its id (``start`` .. ``start + n - 1``)."""
    ids = torch.arange(start, start + n)
    f = ids.to(torch.float32)
    return TensorDict(
        {
            "id": ids,
            "observation": torch.stack([f, f + 0.25, f + 0.5], dim=1),
            "action": torch.stack([ids, -ids], dim=1),
            ("next", "reward"): (f * 2).unsqueeze(1),
            ("next", "done"): (ids % 3 == 0).unsqueeze(1),
        },
        batch_size=[n],
    )


def ring_model(capacity: int, sizes: list[int]) -> tuple[list[int | None], int]:
    """Brute-force ring buffer: the id in each slot after extends of ``sizes``, and the cursor."""
    slots: list[int | None] = [None] * capacity
    cursor, next_id = 0, 0
    for size in sizes:
        for _ in range(size):
            slots[cursor] = next_id
            next_id += 1
            cursor = (cursor + 1) % capacity
    return slots, cursor


def assert_rows_are(batch: Any, ids: list[int]) -> None:
    """Every field of ``batch`` equals the transitions with these ids, in order."""
    expected = (
        transitions(0).empty() if not ids else torch.stack([transitions(1, i)[0] for i in ids])
    )
    for key in expected.keys(include_nested=True, leaves_only=True):
        torch.testing.assert_close(batch[key], expected[key], msg=lambda m, k=key: f"{k}: {m}")


class StorageContract:
    """Subclass with a ``make(capacity) -> Storage`` method; ``vectorised`` says one gather."""

    vectorised = True
    #: the function a batch read calls: once per leaf (``index_select``) or once per batch
    gather_function: tuple[Any, str] = (torch, "index_select")
    gather_per_leaf = True

    def make(self, capacity: int) -> Storage:  # pragma: no cover - overridden
        raise NotImplementedError

    @pytest.fixture
    def storage(self) -> Any:
        s = self.make(10)
        yield s
        close = getattr(s, "close", None)
        if close is not None:
            close()

    def filled(self, storage: Storage, sizes: list[int]) -> ReplayBuffer:
        rb = ReplayBuffer(storage)
        start = 0
        for size in sizes:
            rb.extend(transitions(size, start))
            start += size
        return rb

    # --- dataset surface -------------------------------------------------------------------
    def test_is_map_style_dataset(self, storage: Storage) -> None:
        assert isinstance(storage, torch.utils.data.Dataset)
        assert storage.capacity == 10
        assert storage.device == torch.device("cpu")
        assert len(storage) == 0

    def test_len_and_items_after_ring_writes(self, storage: Storage) -> None:
        sizes = [4, 3, 6, 2, 9]
        rb = self.filled(storage, sizes)
        slots, cursor = ring_model(10, sizes)
        assert len(storage) == 10
        assert rb.writer.state_dict()["cursor"] == cursor
        for i, expected in enumerate(slots):
            assert int(storage[i]["id"]) == expected
        assert int(storage[-1]["id"]) == slots[-1]
        assert int(storage[-10]["id"]) == slots[0]

    def test_partial_fill_length(self, storage: Storage) -> None:
        self.filled(storage, [3, 4])
        assert len(storage) == 7
        with pytest.raises(IndexError, match=r"index 7 .* length 7"):
            storage[7]

    @pytest.mark.parametrize("bad", [5, -6, 100])
    def test_int_out_of_range(self, storage: Storage, bad: int) -> None:
        self.filled(storage, [5])
        with pytest.raises(IndexError, match=rf"index {bad} .* length 5"):
            storage[bad]

    def test_batch_out_of_range_names_index(self, storage: Storage) -> None:
        self.filled(storage, [5])
        with pytest.raises(IndexError, match=r"index 9 .* length 5"):
            storage.__getitems__([0, 9, 1])
        with pytest.raises(IndexError, match=r"index -6 .* length 5"):
            storage[torch.tensor([-6])]

    @pytest.mark.parametrize(
        "convert",
        [list, torch.tensor, np.array, lambda x: torch.tensor(x, dtype=torch.int32)],
        ids=["list", "tensor", "ndarray", "int32"],
    )
    def test_getitems_equals_per_item_loop(self, storage: Storage, convert: Callable) -> None:
        sizes = [7, 6]
        self.filled(storage, sizes)
        slots, _ = ring_model(10, sizes)
        positions = [3, 0, 9, 3, -1, 5]
        batch = storage.__getitems__(convert(positions))
        ids = [slots[p] for p in positions]
        assert batch.batch_size == (len(positions),)
        assert_rows_are(batch, ids)  # type: ignore[arg-type]
        assert_rows_are(storage[convert(positions)], ids)  # type: ignore[arg-type]
        loop = torch.stack([storage[p] for p in positions])
        for key in loop.keys(True, True):
            torch.testing.assert_close(batch[key], loop[key])

    def test_slice_and_empty_index(self, storage: Storage) -> None:
        self.filled(storage, [6])
        assert_rows_are(storage[1:5:2], [1, 3])
        assert storage.__getitems__([]).batch_size == (0,)

    def test_one_vectorised_gather(self, storage: Storage, monkeypatch: Any) -> None:
        if not self.vectorised:
            pytest.skip("list storage gathers item by item by nature")
        self.filled(storage, [8])
        calls: list[int] = []
        owner, name = self.gather_function
        real = getattr(owner, name)

        def counting(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counting)
        monkeypatch.setattr(type(storage), "_get", lambda *a: pytest.fail("per-item read"))
        storage.__getitems__(list(range(8)))
        n_leaves = len(storage.layout.leaves)  # type: ignore[union-attr]
        per_batch = n_leaves if self.gather_per_leaf else 1
        assert len(calls) == per_batch
        calls.clear()
        for _ in DataLoader(storage, batch_size=4, shuffle=True):
            pass
        assert len(calls) == 2 * per_batch

    # --- item kinds ------------------------------------------------------------------------
    def test_plain_tensor_items(self, storage: Storage) -> None:
        data = torch.arange(24.0).view(6, 2, 2)
        storage.set(slice(0, 6), data)
        torch.testing.assert_close(storage[[5, 1]], data[[5, 1]])
        torch.testing.assert_close(storage[2], data[2])
        storage.set(7, torch.full((2, 2), 7.0))
        assert len(storage) == 8
        torch.testing.assert_close(storage[7], torch.full((2, 2), 7.0))

    def test_nested_dict_of_numpy_items(self, storage: Storage) -> None:
        obs = np.arange(8, dtype=np.float32).reshape(4, 2)
        storage.set([0, 1, 2, 3], {"obs": obs, "next": {"obs": obs + 1, "done": obs[:, :1] > 3}})
        batch = storage[[2, 0]]
        assert isinstance(batch, TensorDict)
        np.testing.assert_array_equal(batch["next", "obs"].numpy(), obs[[2, 0]] + 1)
        assert batch["next", "done"].dtype == torch.bool
        item = storage[3]
        assert item.batch_size == ()
        np.testing.assert_array_equal(item["obs"].numpy(), obs[3])

    def test_set_with_index_tensor_and_cast(self, storage: Storage) -> None:
        self.filled(storage, [10])
        new = transitions(2, 100)
        new["observation"] = new["observation"].double()  # float64 -> float32 is allowed
        storage.set(torch.tensor([8, 2]), new)
        assert [int(storage[i]["id"]) for i in (8, 2)] == [100, 101]
        assert storage[8]["observation"].dtype == torch.float32
        torch.testing.assert_close(storage[2]["observation"], torch.tensor([101, 101.25, 101.5]))

    # --- DataLoader ------------------------------------------------------------------------
    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_dataloader_epoch(self, storage: Storage, num_workers: int) -> None:
        self.filled(storage, [10])
        loader = DataLoader(storage, batch_size=4, shuffle=True, num_workers=num_workers)
        seen = []
        for batch in loader:
            assert type(batch) is TensorDict  # a plain TensorDict, whatever collate did
            assert batch.batch_size[0] in (4, 2)
            assert_rows_are(batch, batch["id"].tolist())
            seen += batch["id"].tolist()
        assert sorted(seen) == list(range(10))

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_dataloader_over_plain_tensor_items(self, storage: Storage, num_workers: int) -> None:
        data = torch.arange(30.0).view(10, 3)
        storage.set(slice(0, 10), data)
        loader = DataLoader(storage, batch_size=4, shuffle=True, num_workers=num_workers)
        rows = torch.cat(list(loader))
        assert rows.shape == (10, 3)
        torch.testing.assert_close(rows[rows[:, 0].argsort()], data)

    # --- pickling --------------------------------------------------------------------------
    def test_pickle_roundtrip(self, storage: Storage) -> None:
        self.filled(storage, [7])
        clone = pickle.loads(pickle.dumps(storage))
        assert len(clone) == 7 and clone.capacity == 10
        assert_rows_are(clone[list(range(7))], list(range(7)))
        clone.set(7, transitions(1, 70)[0])  # the clone's one-row and batch paths agree
        assert_rows_are(clone[[7, 0]], [70, 0])
        assert_rows_are(clone[7].unsqueeze(0), [70])

    # --- bad input -------------------------------------------------------------------------
    def _snapshot(self, rb: ReplayBuffer) -> tuple[int, dict[str, Any], Any]:
        n = len(rb.storage)
        contents = rb.storage[list(range(n))].to_dict() if n else {}
        return n, contents, rb.writer.state_dict()

    @pytest.mark.parametrize("full", [False, True], ids=["partial", "full-ring"])
    @pytest.mark.parametrize(
        ("mutate", "error", "pattern"),
        [
            (lambda td: td.exclude("action"), ValueError, r"missing key 'action'"),
            (lambda td: td.set("extra", torch.zeros(3)), ValueError, r"unknown key 'extra'"),
            (
                lambda td: td.set("observation", torch.zeros(3, 4)),
                ValueError,
                r"'observation': expected per-item shape \(3,\), got \(4,\)",
            ),
            (
                lambda td: td.set("action", td["action"].float()),
                TypeError,
                r"'action': expected dtype torch.int64 .* got torch.float32",
            ),
            (
                lambda td: td.set(("next", "done"), td["next", "done"].float()),
                TypeError,
                r"\('next', 'done'\): expected dtype torch.bool .* got torch.float32",
            ),
            (lambda td: transitions(11, 50), ValueError, r"batch of 11 items .* capacity 10"),
        ],
        ids=["missing", "unknown", "shape", "float-into-int", "float-into-bool", "too-many"],
    )
    def test_bad_extend_leaves_buffer_unchanged(
        self, storage: Storage, full: bool, mutate: Callable, error: type, pattern: str
    ) -> None:
        rb = self.filled(storage, [6, 7] if full else [4])
        before = self._snapshot(rb)
        with pytest.raises(error, match=pattern):
            rb.extend(mutate(transitions(3, 50)))
        after = self._snapshot(rb)
        assert after[0] == before[0] and after[2] == before[2]
        for key, value in before[1].items():
            torch.testing.assert_close(after[1][key], value)

    def test_bad_add_leaves_buffer_unchanged(self, storage: Storage) -> None:
        rb = self.filled(storage, [10])
        before = self._snapshot(rb)
        item = transitions(1, 77)[0]
        with pytest.raises(ValueError, match=r"'observation': expected per-item shape"):
            rb.add(item.set("observation", torch.zeros(5)))
        with pytest.raises(TypeError, match=r"'id': expected dtype torch.int64"):
            rb.add(transitions(1, 77)[0].set("id", torch.tensor(1.5)))
        after = self._snapshot(rb)
        assert after[0] == before[0] and after[2] == before[2]
        torch.testing.assert_close(after[1]["id"], before[1]["id"])

    def test_sample_empty_raises(self, storage: Storage) -> None:
        rb = ReplayBuffer(storage, batch_size=2)
        with pytest.raises(EmptyBufferError, match="empty"):
            rb.sample()
        with pytest.raises(EmptyBufferError, match="empty"):
            next(iter(rb))


# --- state dicts (sampler and writer contracts) ------------------------------------------------
def same_state(a: Any, b: Any) -> bool:
    """Deep equality of two ``state_dict`` s (tensors, arrays, dicts, lists, scalars)."""
    if isinstance(a, dict) or isinstance(b, dict):
        if not (isinstance(a, dict) and isinstance(b, dict)) or a.keys() != b.keys():
            return False
        return all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if not (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))):
            return False
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (torch.Tensor, np.ndarray)) or isinstance(b, (torch.Tensor, np.ndarray)):
        if not (
            isinstance(a, (torch.Tensor, np.ndarray)) and isinstance(b, (torch.Tensor, np.ndarray))
        ):
            return False
        ta, tb = torch.as_tensor(a), torch.as_tensor(b)
        return ta.dtype == tb.dtype and ta.shape == tb.shape and torch.equal(ta, tb)
    return type(a) is type(b) and a == b


def snapshot(state: Any) -> Any:
    """A deep copy of a ``state_dict`` (tensors cloned), immune to later in-place changes."""
    if isinstance(state, dict):
        return {k: snapshot(v) for k, v in state.items()}
    if isinstance(state, list):
        return [snapshot(v) for v in state]
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, np.ndarray):
        return state.copy()
    return state
