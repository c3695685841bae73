"""Storage writes that must be refused whole or detached, clear messages for common mistakes,
and small indexing semantics.

Every refused write is checked to leave the storage exactly as it was (contents, ``len``,
``next_slot``) on each storage that keeps fixed-shape tensors.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rbdata import ReplayBuffer
from rbdata.storages import (
    ArrowStorage,
    ListStorage,
    MemmapStorage,
    Storage,
    TensorStorage,
    WriteTarget,
)

STORAGES: dict[str, Callable[[int], Storage]] = {
    "tensor": TensorStorage,
    "memmap": MemmapStorage,
    "list": ListStorage,
}


@pytest.fixture(params=sorted(STORAGES))
def make(request: pytest.FixtureRequest) -> Callable[[int], Storage]:
    return STORAGES[request.param]


def _batch(n: int, start: int = 0, b_dtype: torch.dtype = torch.int32) -> TensorDict:
    """``n`` items: a float leaf ``'a'`` (3,) and a scalar leaf ``'b'`` of ``b_dtype``."""
    rows = torch.arange(start, start + n)
    return TensorDict({"a": rows[:, None].float().expand(n, 3).clone(), "b": rows.to(b_dtype)}, [n])


def _snapshot(storage: Storage) -> tuple[int, int, dict[str, torch.Tensor]]:
    n = len(storage)
    batch = storage[list(range(n))]
    return n, storage.next_slot, {k: batch[k].clone() for k in ("a", "b")}


def _assert_unchanged(storage: Storage, before: tuple[int, int, dict[str, torch.Tensor]]) -> None:
    n, slot, leaves = _snapshot(storage)
    assert (n, slot) == before[:2]
    for key, value in leaves.items():
        torch.testing.assert_close(value, before[2][key], rtol=0, atol=0)


def _filled(make: Callable[[int], Storage], b_dtype: torch.dtype = torch.int32) -> Storage:
    storage = make(16)
    storage.set(slice(0, 10), _batch(10, b_dtype=b_dtype))
    return storage


# --- requires_grad inputs are detached on write -----------------------------------
def test_extend_with_requires_grad_does_not_attach_the_buffer_to_autograd(
    make: Callable[[int], Storage],
) -> None:
    torch.manual_seed(0)
    net1, net2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
    rb = ReplayBuffer(make(64), batch_size=8)
    hidden_refs = []
    for _ in range(5):
        hidden = net1(torch.randn(6, 4))  # saved by net2's backward: alive while the graph is
        hidden_refs.append(weakref.ref(hidden))
        q = net2(hidden)
        assert q.requires_grad
        rb.extend(TensorDict({"q": q, "obs": torch.randn(6, 4)}, [6]))
        rb.add(TensorDict({"q": net2(hidden[0]), "obs": torch.randn(4)}, []))
        del hidden, q
    gc.collect()
    # the storage keeps no graph: every intermediate of the networks was freed
    assert [r() for r in hidden_refs] == [None] * 5
    storage = rb.storage
    if isinstance(storage, TensorStorage):
        for buf in storage.buffers:
            assert buf.grad_fn is None and not buf.requires_grad
    stored = storage[0]["q"]
    assert stored.grad_fn is None and not stored.requires_grad
    sample = rb.sample()
    assert not sample["q"].requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        sample["q"].sum().backward()
    assert net1.weight.grad is None and net2.weight.grad is None


def test_list_storage_detaches_tensors_inside_objects() -> None:
    w = torch.ones(3, requires_grad=True)
    storage = ListStorage(4)
    storage.set([0, 1], [(w * 2, "x"), {"q": w.sum(), "tag": 1}])
    first, second = storage[0], storage[1]
    assert first[1] == "x" and second["tag"] == 1
    assert not first[0].requires_grad and first[0].grad_fn is None
    assert not second["q"].requires_grad
    assert first[0].tolist() == [2.0, 2.0, 2.0] and second["q"].item() == 3.0


# --- narrowing casts ---------------------------------------------------------------
NARROWING = [
    # leaf dtype, given value, given dtype, error type, words the error must contain
    (torch.int32, 2**40 + 5, torch.int64, ValueError, ["1099511627781", "int32", "int64"]),
    (torch.uint8, 300, torch.int64, ValueError, ["300", "uint8", "int64"]),
    (torch.float32, 1e300, torch.float64, ValueError, ["1e+300", "float32", "float64", "inf"]),
    (torch.uint8, -1, torch.int8, ValueError, ["-1", "uint8", "int8"]),
    (torch.int32, 2.5, torch.float64, TypeError, ["2.5", "int32", "float64"]),
    (torch.float16, 70000, torch.int32, ValueError, ["70000", "float16", "int32", "inf"]),
]


@pytest.mark.parametrize(("leaf", "value", "given", "error", "words"), NARROWING)
@pytest.mark.parametrize("batched", [True, False])
def test_narrowing_cast_is_refused_and_nothing_is_written(
    make: Callable[[int], Storage],
    leaf: torch.dtype,
    value: float,
    given: torch.dtype,
    error: type[Exception],
    words: list[str],
    batched: bool,
) -> None:
    storage = _filled(make, b_dtype=leaf)
    before = _snapshot(storage)
    with pytest.raises(error) as info:
        if batched:  # the bad value is the last row: every row before it is fine
            b = torch.tensor([1, 2, value], dtype=given)
            storage.set(slice(8, 11), TensorDict({"a": torch.full((3, 3), 7.0), "b": b}, [3]))
        else:
            b = torch.tensor(value, dtype=given)
            storage.set(3, TensorDict({"a": torch.full((3,), 7.0), "b": b}, []))
    message = str(info.value)
    for word in ["'b'", *words]:
        assert word in message, (word, message)
    _assert_unchanged(storage, before)


def test_narrowing_cast_is_refused_by_arrow_storage_too() -> None:
    storage = _filled(lambda cap: ArrowStorage(cap, chunk_size=4), b_dtype=torch.uint8)
    before = _snapshot(storage)
    bad = TensorDict({"a": torch.zeros(2, 3), "b": torch.tensor([1, 300])}, [2])
    with pytest.raises(ValueError, match="300"):
        storage.set(slice(10, 12), bad)
    _assert_unchanged(storage, before)


def test_safe_narrowing_stays_allowed(make: Callable[[int], Storage]) -> None:
    storage = _filled(make)
    a = torch.tensor([[0.1, -2.5e38, 3.0e38]] * 2, dtype=torch.float64)  # rounds, stays finite
    b = torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int64)  # int64 -> int32 in range
    storage.set(slice(10, 12), TensorDict({"a": a, "b": b}, [2]))
    got = storage[[10, 11]]
    assert got["a"].dtype == torch.float32 and got["b"].dtype == torch.int32
    torch.testing.assert_close(got["a"], a.float(), rtol=0, atol=0)
    assert got["b"].tolist() == [-(2**31), 2**31 - 1]
    # infinities and NaN that were there already are kept, not refused
    special = torch.tensor([float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
    storage.set(12, {"a": special, "b": torch.tensor(5, dtype=torch.int16)})
    item = storage[12]
    assert item["a"][:2].tolist() == [float("inf"), float("-inf")] and item["a"][2].isnan()
    assert item["b"].item() == 5
    # ... but one step past float32's range (after rounding) is refused
    with pytest.raises(ValueError, match=r"3.5e\+38"):
        storage.set(13, {"a": torch.tensor([0.0, 3.5e38, 0.0], dtype=torch.float64), "b": b[0]})
    assert len(storage) == 13


def test_integers_into_a_float_leaf_stay_allowed_unless_they_overflow(
    make: Callable[[int], Storage],
) -> None:
    storage = make(4)
    storage.set(slice(0, 1), {"x": torch.zeros(1, 2), "h": torch.zeros(1, dtype=torch.float16)})
    ints = torch.tensor([[2**40, -3], [7, 8]], dtype=torch.int64)
    storage.set(slice(1, 3), {"x": ints, "h": torch.tensor([-65504, 2048])})
    got = storage[[1, 2]]
    assert got["x"].tolist() == [[float(2**40), -3.0], [7.0, 8.0]]
    assert got["h"].tolist() == [-65504.0, 2048.0]
    with pytest.raises(ValueError, match=r"'h'.*-70000.*float16"):
        storage.set(3, {"x": torch.zeros(2), "h": torch.tensor(-70000)})
    assert len(storage) == 3


# --- nothing that can fail happens after the first byte is written -----------------
def _sparse_second(n: int) -> TensorDict:
    b = torch.arange(100, 100 + n, dtype=torch.int32).to_sparse()
    return TensorDict({"a": torch.full((n, 3), 9.0), "b": b}, [n])


@pytest.mark.parametrize("kind", ["tensor", "memmap"])
def test_a_sparse_leaf_is_densified_before_the_write(kind: str) -> None:
    storage = _filled(STORAGES[kind])
    prepared = storage.prepare(_sparse_second(2), batched=True)
    assert [t.layout for t in prepared.payload] == [torch.strided, torch.strided]
    storage.set(slice(10, 12), _sparse_second(2))
    got = storage[[10, 11]]
    assert got["b"].tolist() == [100, 101] and got["a"].tolist() == [[9.0] * 3] * 2
    assert len(storage) == 12 and storage.next_slot == 12


def test_list_storage_refuses_sparse_items_and_nothing_is_written() -> None:
    storage = _filled(ListStorage)
    before = _snapshot(storage)
    with pytest.raises(TypeError, match=r"'b'.*sparse"):
        storage.set(slice(10, 12), _sparse_second(2))
    item = {"a": torch.zeros(3), "b": torch.tensor(5, dtype=torch.int32).to_sparse()}
    with pytest.raises(TypeError, match=r"'b'.*sparse"):
        storage.set(3, item)
    _assert_unchanged(storage, before)
    assert len(storage[list(range(10))]) == 10  # every batch still stacks


def test_a_meta_leaf_is_refused_before_anything_is_written(make: Callable[[int], Storage]) -> None:
    storage = _filled(make)
    before = _snapshot(storage)
    bad = TensorDict(
        {"a": torch.full((2, 3), 9.0), "b": torch.empty(2, dtype=torch.int32, device="meta")},
        [2],
    )
    with pytest.raises(TypeError, match=r"'b'.*meta"):
        storage.set(slice(0, 2), bad)
    _assert_unchanged(storage, before)


# --- messages that say what is wrong ------------------------------------------------
def test_a_list_of_items_missing_a_key_names_the_key(make: Callable[[int], Storage]) -> None:
    storage = _filled(make)
    before = _snapshot(storage)
    items = [
        {"a": torch.zeros(3), "b": torch.tensor(1, dtype=torch.int32)},
        {"a": torch.zeros(3)},
    ]
    with pytest.raises(ValueError, match=r"item 1 .*lacks key 'b'"):
        storage.set(slice(10, 12), items)
    _assert_unchanged(storage, before)


def test_extend_with_a_single_item_says_extend_takes_a_batch(
    make: Callable[[int], Storage],
) -> None:
    rb = ReplayBuffer(_filled(make))
    before = _snapshot(rb.storage)
    item = {"a": torch.zeros(3), "b": torch.tensor(1, dtype=torch.int32)}
    with pytest.raises(ValueError, match=r"extend .*takes a batch.*use add") as info:
        rb.extend(item)
    assert "(3,)" in str(info.value)
    _assert_unchanged(rb.storage, before)
    rb.add(item)  # what the message tells to do works
    assert len(rb) == 11


def test_extend_with_a_scalar_item_says_extend_takes_a_batch() -> None:
    rb = ReplayBuffer(TensorStorage(8))
    rb.extend(torch.arange(3.0))  # a batch of 3 scalar items
    with pytest.raises(ValueError, match=r"takes a batch.*use add"):
        rb.extend(torch.tensor(5.0))
    assert len(rb) == 3


@pytest.mark.parametrize("kind", ["tensor", "memmap"])
def test_extend_with_an_empty_list_says_what_to_pass(kind: str) -> None:
    for storage in (STORAGES[kind](8), _filled(STORAGES[kind])):
        rb = ReplayBuffer(storage)
        before = _snapshot(storage) if len(storage) else None
        with pytest.raises(ValueError, match=r"empty list.*non-empty list of items.*batch"):
            rb.extend([])
        if before is not None:
            _assert_unchanged(storage, before)
        else:
            assert len(storage) == 0 and storage.layout is None


def test_list_storage_takes_an_empty_list_as_an_empty_batch() -> None:
    fresh = ReplayBuffer(ListStorage(8))  # nothing written, nothing fixed: ...
    assert fresh.extend([]).tolist() == [] and len(fresh) == 0
    fresh.extend(torch.ones(2, 3))  # ... tensors still get a layout
    assert fresh.storage.layout is not None and fresh.storage[[0, 1]].shape == (2, 3)
    assert fresh.extend([]).tolist() == [] and len(fresh) == 2
    filled = _filled(ListStorage)
    before = _snapshot(filled)
    filled.set([], [])
    _assert_unchanged(filled, before)


# --- negative write indices, 0-d tensor indices, CUDA at construction ------------
def test_set_negative_index_counts_from_len(make: Callable[[int], Storage]) -> None:
    storage = _filled(make)  # 10 items in 16 slots
    item = {"a": torch.full((3,), -1.0), "b": torch.tensor(-1, dtype=torch.int32)}
    storage.set(-1, item)
    assert len(storage) == 10 and storage[9]["b"].item() == -1
    assert storage[8]["b"].item() == 8
    storage.set([-2, -10], _batch(2, start=50))
    assert storage[[8, 0]]["b"].tolist() == [50, 51]
    storage.set(slice(-4, -2), _batch(2, start=60))
    assert storage[[6, 7]]["b"].tolist() == [60, 61]
    storage.set(torch.tensor([-3]), _batch(1, start=70))
    assert storage[7]["b"].item() == 70
    # writes at positions that do not continue the ring leave its cursor after the fill
    assert len(storage) == 10 and storage.next_slot == 10
    before = _snapshot(storage)
    with pytest.raises(IndexError, match="-11"):
        storage.set(-11, item)
    with pytest.raises(IndexError, match="-11"):
        storage.set([0, -11], _batch(2))
    _assert_unchanged(storage, before)
    storage.set(12, item)  # non-negative slots still reach the whole capacity
    assert len(storage) == 13


@pytest.mark.parametrize(
    "index", [torch.tensor(2), torch.tensor(2, dtype=torch.uint8), np.array(2)]
)
def test_a_zero_dim_integer_index_reads_one_item(
    make: Callable[[int], Storage], index: Any
) -> None:
    storage = _filled(make)
    item = storage[index]
    assert item.batch_size == torch.Size([])
    assert item["b"].item() == 2 and item["a"].tolist() == [2.0] * 3
    tensors = make(4)
    tensors.set(slice(0, 3), torch.arange(6.0).view(3, 2))
    assert tensors[index].tolist() == [4.0, 5.0]
    assert tensors[torch.tensor([2])].shape == (1, 2)  # a 1-d index is still a batch


def test_set_at_a_zero_dim_index_writes_one_item(make: Callable[[int], Storage]) -> None:
    storage = _filled(make)
    storage.set(torch.tensor(4), {"a": torch.zeros(3), "b": torch.tensor(40, dtype=torch.int32)})
    assert storage[4]["b"].item() == 40 and len(storage) == 10


def test_tensor_storage_on_cuda_without_cuda_fails_at_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        TensorStorage(8, device="cuda")
    with pytest.raises(ValueError, match="meta"):
        TensorStorage(8, device="meta")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_storage_prepares_on_device_and_detached() -> None:
    storage = TensorStorage(8, device="cuda")
    storage.set(slice(0, 2), {"x": torch.zeros(2, 3)})
    w = torch.ones(3, requires_grad=True)
    prepared = storage.prepare({"x": (w * torch.ones(2, 3)).double()}, batched=True)
    (t,) = prepared.payload
    assert t.device.type == "cuda" and t.dtype == torch.float32 and not t.requires_grad
    storage.commit(WriteTarget.of_runs([slice(2, 4)]), prepared)
    assert storage[[2, 3]]["x"].tolist() == [[1.0] * 3] * 2
    before = storage[[0, 1, 2, 3]]["x"].clone()
    with pytest.raises(ValueError, match="1e\\+300"):
        storage.set(slice(0, 2), {"x": torch.full((2, 3), 1e300, dtype=torch.float64)})
    assert torch.equal(storage[[0, 1, 2, 3]]["x"], before)


# --- one cursor rule, whoever holds the storage (issue 34, item 6) -------------------
@pytest.mark.parametrize(
    "kind", ["list", "tensor", "memmap", "memmap-pickled", "memmap-shared", "arrow"]
)
def test_set_at_positions_leaves_the_ring_cursor_on_every_storage(kind: str) -> None:
    from multiprocessing.reduction import ForkingPickler

    makers: dict[str, Callable[[int], Storage]] = {**STORAGES, "arrow": ArrowStorage}
    storage = makers[kind.split("-")[0]](16)
    rb = ReplayBuffer(storage)
    rb.extend(_batch(6))
    if kind == "memmap-pickled":  # what spawn workers do: both ends become shared
        ForkingPickler.dumps(storage)
        assert storage.shared
    elif kind == "memmap-shared":
        storage.share()  # type: ignore[attr-defined]
    storage.set([1, 11, 7], _batch(3, start=50))  # in place: the ring's oldest slot is 6
    assert storage.next_slot == 6 and len(storage) == 12
    assert rb.extend(_batch(1, start=60)).tolist() == [6]
    assert storage[6]["b"].item() == 60 and storage[[1, 11, 7]]["b"].tolist() == [50, 51, 52]
    storage.set(slice(7, 9), _batch(2, start=70))  # continues the ring at 7: it moves
    assert storage.next_slot == 9
    assert rb.extend(_batch(1, start=80)).tolist() == [9]
    if hasattr(storage, "close"):
        storage.close()
