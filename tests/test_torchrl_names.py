"""Issue 25: code ported from torchrl either runs or fails with an error that names our spelling.

``rb[idx]``, ``rb.write_count``, ``rb.update_priority(batch)``, ``sample(return_info=True)``,
``close()`` / ``with``, one storage-first convention for every sampler, torchrl keywords and
attribute names that raise errors naming rbdata's, and messages that never print a tensor.
"""

from __future__ import annotations

import inspect
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rbdata import (
    ArrowStorage,
    ListStorage,
    MaxValueWriter,
    MemmapStorage,
    PrioritizedSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorStorage,
    UniformSampler,
)


def _items(n: int, start: int = 0) -> TensorDict:
    t = torch.arange(start, start + n)
    return TensorDict({"obs": t.float().unsqueeze(1).repeat(1, 3), "t": t}, batch_size=[n])


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return set(a.keys(True, True)) == set(b.keys(True, True)) and all(
        torch.equal(a[k], b[k]) for k in a.keys(True, True)
    )


# --- torchrl keywords: a TypeError that names our spelling ----------------------------------------
def _noop(batch: Any) -> Any:
    return batch


KEYWORDS: list[tuple[str, Callable[[Path], Any], str]] = [
    ("scratch_dir", lambda p: MemmapStorage(8, scratch_dir=str(p)), "use `path=`"),
    ("memmap device", lambda p: MemmapStorage(8, device="cuda"), "TensorStorage(max_size, device"),
    ("tensor storage=", lambda p: TensorStorage(storage=torch.zeros(3)), "TensorStorage(len("),
    ("max_capacity", lambda p: PrioritizedSampler(max_capacity=8, alpha=0.7, beta=1), "capacity="),
    ("max_size", lambda p: PrioritizedSampler(max_size=8, alpha=0.7, beta=0.5), "capacity="),
    ("reduction", lambda p: PrioritizedSampler(8, 0.7, 0.5, reduction="max"), "one priority"),
    ("prefetch", lambda p: ReplayBuffer(TensorStorage(4), prefetch=3), "rbdata.nodes"),
    ("pin_memory", lambda p: ReplayBuffer(TensorStorage(4), pin_memory=True), "rbdata.nodes"),
    ("collate_fn", lambda p: ReplayBuffer(TensorStorage(4), collate_fn=_noop), "transform="),
    ("rb max_size", lambda p: ReplayBuffer(ListStorage(4), max_size=4), "TensorStorage(max_size)"),
    ("rb generator", lambda p: ReplayBuffer(TensorStorage(4), generator=None), "to the sampler"),
    ("cache_values", lambda p: SliceSampler(slice_len=2, cache_values=True), "cache_values"),
    ("ends", lambda p: SliceSampler(slice_len=2, ends=torch.zeros(3)), "end_key="),
    ("shuffle", lambda p: SamplerWithoutReplacement(shuffle=False), "random permutation"),
]


@pytest.mark.parametrize(("what", "make", "hint"), KEYWORDS, ids=[k[0] for k in KEYWORDS])
def test_torchrl_keyword_names_ours(
    what: str, make: Callable[[Path], Any], hint: str, tmp_path: Path
) -> None:
    with pytest.raises(TypeError, match="has no `") as err:
        make(tmp_path)
    assert hint in str(err.value)
    assert not list(tmp_path.iterdir())  # refused before anything was made


def test_torchrl_keywords_that_are_ours_work_and_signatures_stay(tmp_path: Path) -> None:
    assert TensorStorage(max_size=5).capacity == ListStorage(max_size=5).capacity == 5
    storage = MemmapStorage(max_size=5, path=tmp_path / "m")
    assert storage.capacity == 5 and storage.path == tmp_path / "m"
    storage.close()
    # the checks keep the real signatures (for inspect, Sphinx, IDEs)
    assert "path" in inspect.signature(MemmapStorage).parameters
    assert list(inspect.signature(PrioritizedSampler).parameters)[:3] == [
        "capacity",
        "alpha",
        "beta",
    ]
    assert "priority_key" in inspect.signature(ReplayBuffer).parameters
    with pytest.raises(TypeError, match="unexpected keyword argument 'nonsense'"):
        TensorStorage(4, nonsense=1)  # type: ignore[call-arg]


def test_torchrl_attribute_names_ours() -> None:
    rb = ReplayBuffer(TensorStorage(4))
    with pytest.raises(AttributeError, match=r"update_tensordict_priority.*update_priority\(batch"):
        rb.update_tensordict_priority  # noqa: B018
    with pytest.raises(AttributeError, match=r"'_storage': use rb.storage"):
        rb._storage  # noqa: B018
    with pytest.raises(AttributeError, match=r"has no attribute 'nonsense'$"):
        rb.nonsense  # noqa: B018
    assert not hasattr(rb, "nonsense") and getattr(rb, "dump", 7) == 7
    rb.extend(_items(3))
    copy = pickle.loads(pickle.dumps(rb))  # the hook leaves pickling alone
    assert len(copy) == 3 and _same(copy[[0, 2]], rb[[0, 2]])


# --- never a tensor's values in a message ---------------------------------------------------------
DATA = torch.arange(1000.0) + 987654.0  # any of its values in a message would show "98765"
AS_CAPACITY: list[Callable[[], Any]] = [
    lambda: TensorStorage(DATA),
    lambda: MemmapStorage(DATA),
    lambda: ListStorage(DATA),
    lambda: TensorStorage(DATA.numpy()),
    lambda: TensorStorage(TensorDict({"x": DATA}, [1000])),
    lambda: PrioritizedSampler(DATA, 0.7, 0.5),
    lambda: PrioritizedSampler(8, DATA, 0.5),
    lambda: UniformSampler(num_samples=DATA),
    lambda: SliceSampler(slice_len=DATA),
    lambda: ReplayBuffer(TensorStorage(4), batch_size=DATA),
    lambda: ArrowStorage(8, chunk_size=DATA),
]


@pytest.mark.parametrize("make", AS_CAPACITY)
def test_messages_never_show_a_tensors_values(make: Callable[[], Any]) -> None:
    with pytest.raises((TypeError, ValueError)) as err:
        make()
    text = str(err.value)
    assert "98765" not in text and len(text) < 400, text


def test_tensor_storage_of_a_tensor_says_what_to_write() -> None:
    with pytest.raises(TypeError) as err:
        TensorStorage(DATA)
    text = str(err.value)
    assert "shape (1000,)" in text and "TensorStorage(len(data))" in text and "extend" in text


# --- rb[index] and rb.write_count -----------------------------------------------------------------
@pytest.mark.parametrize("make", [TensorStorage, ListStorage], ids=["tensor", "list"])
def test_getitem_gathers_like_the_storage(make: Callable[[int], Any]) -> None:
    rb = ReplayBuffer(make(8))
    rb.extend(_items(6))
    rb.extend(_items(5, start=6))  # wraps: slots hold t = 8, 9, 10, 3, 4, ...
    for index in [torch.tensor([0, 7, 2]), [1, 1, 5], np.array([3, 4]), slice(2, 6), 5, -1]:
        assert _same(rb[index], rb.storage[index])
    assert int(rb[0]["t"]) == 8 and rb[torch.tensor([0])]["t"].tolist() == [8]
    assert "index" not in rb[[0, 1]].keys()  # sample's entry, not storage indexing's
    with pytest.raises(IndexError):
        rb[8]
    doubled = ReplayBuffer(make(8), transform=lambda b: b["t"] * 2)
    doubled.extend(_items(4))
    assert doubled[[3, 1]].tolist() == [6, 2]


def test_write_count_counts_every_item_written() -> None:
    gen = torch.Generator().manual_seed(0)
    rb = ReplayBuffer(TensorStorage(16))
    expected = 0
    for _ in range(40):
        if torch.rand((), generator=gen) < 0.3:
            rb.add({"obs": torch.zeros(3), "t": torch.tensor(0)})
            expected += 1
        else:
            n = int(torch.randint(0, 9, (), generator=gen))
            rb.extend(_items(n))
            expected += n
        assert rb.write_count == expected
    assert expected > rb.storage.capacity  # overwritten items are counted
    rb.empty()
    assert rb.write_count == 0
    # a buffer over a filled storage starts at its items; dropped items are not written
    assert ReplayBuffer(TensorStorage(4)).write_count == 0
    top = ReplayBuffer(TensorStorage(2), writer=MaxValueWriter("t"))
    top.extend(_items(2, start=5))
    assert top.add({"obs": torch.zeros(3), "t": torch.tensor(0)}) == -1
    assert top.write_count == 2


# --- sample(return_info=True) and update_priority(batch) ------------------------------------------
def _prioritized(items: Any, seed: int = 0) -> ReplayBuffer:
    gen = torch.Generator().manual_seed(seed)
    rb = ReplayBuffer(TensorStorage(16), PrioritizedSampler(16, 1.0, 0.5, eps=0.0, generator=gen))
    rb.extend(items)
    return rb


def test_return_info_gives_index_and_weight_for_plain_tensors() -> None:
    rb = _prioritized(torch.arange(10.0) * 10)
    batch, info = rb.sample(32, return_info=True)
    assert isinstance(batch, torch.Tensor) and sorted(info) == ["index", "weight"]
    assert torch.equal(batch, rb.storage[info["index"]]) and info["weight"].shape == (32,)
    rb.update_priority(torch.arange(10), torch.zeros(10))
    rb.update_priority([7], [1.0])
    batch, info = rb.sample(16, return_info=True)
    assert set(info["index"].tolist()) == {7} and set(batch.tolist()) == {70.0}
    # a plain batch alone has no index: the error says how to get one
    with pytest.raises(TypeError, match=r"return_info=True"):
        rb.update_priority(batch)


def test_return_info_leaves_the_default_output_unchanged() -> None:
    plain, info = _prioritized(_items(10)).sample(8, return_info=True)
    default = _prioritized(_items(10)).sample(8)
    assert _same(plain, default)
    assert torch.equal(info["index"], default["index"])
    assert torch.equal(info["weight"], default["weight"])
    uniform = ReplayBuffer(TensorStorage(8), UniformSampler(generator=torch.Generator()))
    uniform.extend(torch.arange(4))
    batch, info = uniform.sample(3, return_info=True)
    assert sorted(info) == ["index"] and torch.equal(batch, info["index"])


@pytest.mark.parametrize("key", ["td_error", ("loss", "td")])
def test_update_priority_takes_a_batch(key: str | tuple[str, ...]) -> None:
    rb = _prioritized(_items(10))
    rb.priority_key = key
    batch = rb.sample(200)  # every one of the 10 items (all but surely)
    assert set(batch["t"].tolist()) == set(range(10))
    # torchrl's usage: the loss writes per-item errors (with grad) into the sampled batch
    errors = (batch["t"] == 4).float().requires_grad_()
    batch[key] = errors.unsqueeze(-1) * 2.0
    rb.update_priority(batch)
    assert set(rb.sample(16)["t"].tolist()) == {4}
    as_dict = {"index": torch.arange(10), "td_error": (torch.arange(10) == 6).double()}
    plain = ReplayBuffer(
        TensorStorage(16), PrioritizedSampler(16, 1.0, 0.5, eps=0.0), priority_key="td_error"
    )
    plain.extend(_items(10))
    plain.update_priority(as_dict)
    assert set(plain.sample(8)["t"].tolist()) == {6}


def test_update_priority_of_a_batch_without_the_entries_says_which() -> None:
    rb = _prioritized(_items(10))
    batch = rb.sample(4)
    before = rb.sampler.total()
    with pytest.raises(ValueError, match=r"no 'td_error' entry.*priority_key"):
        rb.update_priority(batch)
    with pytest.raises(ValueError, match=r"no 'index' entry"):
        rb.update_priority(TensorDict({"td_error": torch.ones(4)}, [4]))
    assert rb.sampler.total() == before


# --- one convention: every sampler takes the storage first ----------------------------------------
def _episodes() -> TensorDict:
    done = torch.zeros(20, 1, dtype=torch.bool)
    done[9] = done[19] = True
    return TensorDict({"t": torch.arange(20), ("next", "done"): done}, [20])


def test_every_sampler_takes_its_storage_first() -> None:
    storage = TensorStorage(32)
    storage.set(slice(0, 20), _episodes())
    samplers = [
        UniformSampler(storage),
        SamplerWithoutReplacement(storage),
        SliceSampler(storage, slice_len=4),
        PrioritizedSampler(storage, 0.7, 0.5),
    ]
    for sampler in samplers:
        assert sampler.data_source is storage
    for sampler in samplers[:3]:  # on their own (the prioritized one below, in a buffer)
        index = sampler.sample(8)
        assert int(index.min()) >= 0 and int(index.max()) < 20
    assert samplers[3].capacity == storage.capacity
    assert ReplayBuffer(storage, samplers[3]).sample(8)["t"].max() < 20
    # the slice sampler indexed the episodes already in the storage
    steps = storage[samplers[2].sample(8)]["t"].view(2, 4)
    assert bool((steps.diff() == 1).all()) and bool(((steps // 10).diff() == 0).all())
    # old keyword calls still work; a buffer binds a sampler made without a storage
    old = SliceSampler(slice_len=4, data_source=storage)
    assert old.data_source is storage and old.slice_len == 4
    rb = ReplayBuffer(storage, SliceSampler(slice_len=4))
    assert rb.sample(8).shape == (8,)
    with pytest.raises(ValueError, match="not data_source"):
        PrioritizedSampler(storage, 0.7, 0.5, data_source=TensorStorage(32))


def test_slice_sampler_with_a_number_first_says_to_use_keywords() -> None:
    with pytest.raises(TypeError, match=r"first argument is the storage.*slice_len=8"):
        SliceSampler(8)


# --- close() and `with` ---------------------------------------------------------------------------
def _on_disk(kind: str, path: Path) -> Any:
    if kind == "memmap":
        return MemmapStorage(8, path=path)
    pytest.importorskip("pyarrow")
    return ArrowStorage(8, path=path)


@pytest.mark.parametrize("kind", ["memmap", "arrow"])
def test_with_closes_the_storage_and_the_buffer(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "rb"
    with ReplayBuffer(_on_disk(kind, path), batch_size=2) as rb:
        rb.extend(_items(5))
        storage = rb.storage
    assert rb.closed
    with pytest.raises(ValueError, match="storage is closed"):
        len(storage)
    reopened = type(storage).open(path)
    assert len(reopened) == 5 and reopened[4]["t"].item() == 4
    reopened.close()
    uses: list[Callable[[], Any]] = [
        lambda: rb.sample(),
        lambda: rb.extend(_items(1)),
        lambda: rb.add(_items(1)[0]),
        lambda: len(rb),
        lambda: rb[0],
        lambda: next(iter(rb)),
        lambda: rb.dumps(tmp_path / "ckpt"),
        lambda: rb.__enter__(),
    ]
    for use in uses:
        with pytest.raises(ValueError, match=r"the buffer is closed \(ReplayBuffer.close"):
            use()
    rb.close()  # idempotent
    assert rb.closed and "closed" in repr(rb)


def test_close_on_an_error_and_on_memory_storages(tmp_path: Path) -> None:
    rb = ReplayBuffer(MemmapStorage(8, path=tmp_path / "rb"))
    with pytest.raises(RuntimeError, match="boom"), rb:
        rb.extend(_items(3))
        raise RuntimeError("boom")
    assert rb.closed and len(MemmapStorage.open(tmp_path / "rb")) == 3
    memory = ReplayBuffer(TensorStorage(8))  # no close() of its own: the buffer still closes
    memory.extend(_items(2))
    assert not memory.closed
    memory.close()
    with pytest.raises(ValueError, match="the buffer is closed"):
        memory.sample(1)
