"""The per-step ``add`` path (``Storage.add_fast``) against the general write path.

The reference is the general path itself: ``storage.commit(WriteTarget.one(slot), prepared)``,
what a writer falls back to (``storage.set`` writes the same bytes, but at positions of its own
choosing: its cursor rule differs), validates and converts through ``Layout.split`` and never
takes the fast path. For every item — leaves of the exact
dtype, of other dtypes, Python numbers in and out of range, NaN, tensors with autograd,
missing and extra keys — a buffer written through ``add`` must hold the same bytes, length
and next slot as the reference, or raise the same error and stay unchanged.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rbdata import ReplayBuffer
from rbdata._core.layout import nest
from rbdata.samplers import PrioritizedSampler
from rbdata.storages import MemmapStorage, Storage, TensorStorage, WriteTarget
from rbdata.storages._unpack import ItemUnpacker

CAP = 6

# one leaf of each kind of per-step value: (key path, shape, torch dtype)
LEAVES: list[tuple[tuple[str, ...], tuple[int, ...], torch.dtype]] = [
    (("observation",), (3,), torch.float32),
    (("action",), (), torch.int64),
    (("next", "reward"), (), torch.float32),
    (("next", "done"), (), torch.bool),
    (("next", "observation"), (3,), torch.float32),
    (("ret",), (), torch.float64),
    (("small",), (), torch.int8),
    (("pixels",), (2,), torch.uint8),
    (("half",), (), torch.float16),
    (("image",), (3, 4), torch.uint8),  # more than a few elements: a tensor is read by numpy()
]
# every leaf small and at most 1-D: a MemmapStorage packs such an item (``_packed.py``)
SMALL_LEAVES = LEAVES[:-1]
LAYOUTS = {"mixed": LEAVES, "small": SMALL_LEAVES}


def first_item(leaves: list[Any] = LEAVES) -> dict[str, Any]:
    """Fixes the layout: every leaf a tensor of its dtype."""
    return nest((key, torch.zeros(shape, dtype=dtype)) for key, shape, dtype in leaves)


def storages(tmp_path: Path) -> list[tuple[str, Any]]:
    return [
        ("tensor", lambda i: TensorStorage(CAP)),
        ("memmap", lambda i: MemmapStorage(CAP, path=tmp_path / f"m{i}")),
    ]


def snapshot(storage: Storage) -> tuple[int, int, list[torch.Tensor]]:
    bufs = [b.clone() for b in storage.buffers]  # type: ignore[attr-defined]
    return len(storage), storage.next_slot, bufs


def same(a: tuple[int, int, list[torch.Tensor]], b: tuple[int, int, list[torch.Tensor]]) -> bool:
    return (
        a[:2] == b[:2]
        and len(a[2]) == len(b[2])
        and all(x.dtype == y.dtype and _equal(x, y) for x, y in zip(a[2], b[2], strict=True))
    )


def _equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Equal values, a NaN equal to a NaN (a NaN item is stored as it is by both paths)."""
    if torch.equal(x, y):
        return True
    return x.is_floating_point() and bool(((x == y) | (x.isnan() & y.isnan())).all())


def outcome(write: Any) -> type[BaseException] | None:
    try:
        write()
    except (ValueError, TypeError, RuntimeError) as err:
        return type(err)
    return None


# --- values ---------------------------------------------------------------------------------
def values_for(shape: tuple[int, ...], dtype: torch.dtype, exact: bool) -> st.SearchStrategy[Any]:
    """Values for one leaf: any kind, or (``exact``) only kinds the fast path may take."""
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    numbers = st.one_of(
        st.booleans(),
        st.integers(-(2**65), 2**65),
        st.sampled_from([0, 1, -1, 127, 128, 255, 256, 2**24, 2**24 + 1, 2**53 + 1, 2**63 - 1]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.5, 1e300, -1e300, 65504.0, 70000.0, 3.5e38]),
    )

    def array(kind: str, value: float) -> Any:
        if kind == "np-exact":
            return np.full(shape, value).astype(np_dtype)
        if kind == "np-f64":
            return np.full(shape, value, dtype=np.float64)
        if kind == "np-scalar":
            return np_dtype.type(value) if not shape else np.full(shape, value).astype(np_dtype)
        if kind == "torch-exact":
            return torch.full(shape, value).to(dtype)
        if kind == "torch-grad":
            return torch.full(shape, value, dtype=torch.float32, requires_grad=True)
        if kind == "torch-strided":  # a view that is not contiguous
            return torch.full((*shape, 2), value).to(dtype)[..., 0]
        if kind == "torch-neg":  # the negative bit set (floating leaves; others exact)
            t = torch.full(shape, -value).to(dtype)
            return t._neg_view() if dtype.is_floating_point else t
        if kind == "torch-sparse":
            return torch.full(shape, value).to(dtype).to_sparse()
        if kind == "np-wrong-shape":
            return np.zeros((*shape, 2), dtype=np_dtype)
        return np.full(shape, value).astype(np.int32)  # "np-int32"

    good = ["np-exact", "torch-exact", "np-scalar", "torch-strided", "torch-neg"]
    bad = ["np-f64", "torch-grad", "np-wrong-shape", "np-int32", "torch-sparse"]
    kinds = st.sampled_from(good if exact else good + bad)
    small = st.integers(0, 100).map(float)
    arrays = st.builds(array, kinds, small)
    if shape:
        return arrays
    if exact:  # plus the one Python number every leaf takes as it is
        return st.one_of(arrays, st.booleans())
    return st.one_of(arrays, numbers)


def items(leaves: list[Any], exact: bool) -> st.SearchStrategy[dict[tuple[str, ...], Any]]:
    return st.fixed_dictionaries(
        {key: values_for(shape, dtype, exact) for key, shape, dtype in leaves}
    )


# half the items mix every kind of value (mostly refused by the fast path), half hold only
# values the fast path may take (taken unless a Python number needs the general path)
ITEMS = {
    name: st.one_of(items(leaves, exact=False), items(leaves, exact=True))
    for name, leaves in LAYOUTS.items()
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    slot=st.integers(0, CAP - 1),
    extra=st.sampled_from([False, False, False, True]),
)
def test_add_fast_stores_what_the_general_path_stores(
    tmp_path_factory: pytest.TempPathFactory,
    layout: str,
    data: st.DataObject,
    slot: int,
    extra: bool,
) -> None:
    leaves = LAYOUTS[layout]
    tmp = tmp_path_factory.mktemp("fast")
    flat = dict(data.draw(ITEMS[layout]))
    # half the items: a key missing
    drop = data.draw(st.sampled_from([None] * len(leaves) + list(range(len(leaves)))))
    if drop is not None:
        flat.pop(leaves[drop][0])
    if extra:
        flat[("next", "info")] = np.zeros(1, dtype=np.float32)
    item = nest(flat.items())
    for kind, make in storages(tmp):
        fast, ref = make(0), make(1)
        for s in (fast, ref):
            for i in range(CAP - 1):  # slots 0..4 live: a write at 5 grows, below overwrites
                s.set(i, first_item(leaves))
        if kind == "memmap":  # the small layout's items are packed (one struct, one kernel)
            assert (fast._writes.row is not None) == (layout == "small")
        before = snapshot(fast)
        with np.errstate(all="raise"):  # a numpy cast warning would be a behaviour difference
            took = fast.add_fast(slot, item)
        got = None if took else outcome(lambda fast=fast: write_at(fast, slot, item))
        want = outcome(lambda ref=ref: write_at(ref, slot, item))
        assert got == want, (item, got, want)
        assert same(snapshot(fast), snapshot(ref))
        if want is not None:
            assert same(snapshot(fast), before)  # a refused item changes nothing
        for s in (fast, ref):
            s.close() if isinstance(s, MemmapStorage) else None


def write_at(storage: Storage, slot: int, item: Any) -> None:
    """The general path of a writer's one-item write at ``slot``."""
    storage.commit(WriteTarget.one(slot), storage.prepare(item, batched=False))


def cartpole_item(k: int) -> dict[str, Any]:
    obs = np.full(4, k, dtype=np.float32)
    return {
        "observation": obs,
        "action": np.int64(k % 2),
        "next": {"reward": 1.0, "done": k % 7 == 0, "observation": obs + 1},
    }


@pytest.mark.parametrize("kind", ["tensor", "memmap"])
@pytest.mark.parametrize("form", ["dict", "tensordict"])
def test_per_step_items_take_the_fast_path_and_ring_like_the_general_path(
    tmp_path: Path, kind: str, form: str
) -> None:
    make = dict(storages(tmp_path))[kind]
    rb, ref = ReplayBuffer(make(0)), ReplayBuffer(make(1))
    taken = 0
    for k in range(1, 3 * CAP + 2):  # fills, then overwrites around the ring twice
        item: Any = cartpole_item(k)
        if form == "tensordict":
            item = TensorDict(
                {
                    "observation": torch.from_numpy(item["observation"]),
                    "action": torch.tensor(k % 2),
                    "next": {
                        "reward": torch.tensor(1.0),
                        "done": torch.tensor(k % 7 == 0),
                        "observation": torch.from_numpy(item["next"]["observation"]),
                    },
                },
                [],
            )
        if rb.storage._layout is not None:
            taken += rb.storage._unpack(item) is not None
        assert rb.add(item) == ref.writer.add(ref.storage, item) == (k - 1) % CAP
        write_at(ref.storage, (k - 1) % CAP, item)  # the general path, again at the same slot
        assert same(snapshot(rb.storage), snapshot(ref.storage))
    assert taken == 3 * CAP  # every item after the first (which fixes the layout)
    assert rb.writer.cursor == ref.writer.cursor == (3 * CAP + 1) % CAP
    if kind == "memmap":
        assert rb.storage._writes.row is not None  # packed: one struct call, one kernel
        path = rb.storage.path
        rb.storage.close()
        reopened = MemmapStorage.open(path)
        assert same(snapshot(reopened), snapshot(ref.storage))
        reopened.close()
        ref.storage.close()


def test_plain_tensor_items_take_the_fast_path() -> None:
    rb = ReplayBuffer(TensorStorage(4))
    rb.add(np.zeros(3, dtype=np.float32))
    assert rb.storage._unpack(np.ones(3, dtype=np.float32)) is not None
    for k in range(1, 6):
        rb.add(np.full(3, k, dtype=np.float32) if k % 2 else torch.full((3,), float(k)))
    assert rb.storage[[0, 1, 2, 3]][:, 0].tolist() == [4.0, 5.0, 2.0, 3.0]


def test_a_refused_check_writes_nothing_on_the_fast_path() -> None:
    sampler = PrioritizedSampler(4, alpha=1.0, beta=1.0, dtype=torch.float32)
    rb = ReplayBuffer(TensorStorage(4), sampler)
    rb.add(cartpole_item(1))
    before = snapshot(rb.storage)
    # a default priority whose total would overflow float32: check_write refuses the item
    sampler.update_priority(0, 3e38)
    with pytest.raises(ValueError, match="overflow"):
        rb.add(cartpole_item(2))
    assert same(snapshot(rb.storage), before) and rb.writer.cursor == 1
    assert sampler.priority_values(torch.arange(1)).tolist() == pytest.approx([3e38])


def test_closed_and_layoutless_storages_take_the_general_path(tmp_path: Path) -> None:
    storage = MemmapStorage(4, path=tmp_path / "m")
    assert not storage.add_fast(0, cartpole_item(1))  # no layout yet
    rb = ReplayBuffer(storage)
    rb.add(cartpole_item(1))
    storage.close()
    with pytest.raises(ValueError, match="closed"):
        rb.add(cartpole_item(2))


def test_unpacker_refuses_layouts_without_a_numpy_twin() -> None:
    from rbdata._core.layout import Layout

    layout = Layout.from_data({"a": torch.zeros(2, dtype=torch.bfloat16)}, batched=False)
    assert ItemUnpacker.for_layout(layout) is None
    empty = Layout.from_data({"a": torch.zeros(0)}, batched=False)
    assert ItemUnpacker.for_layout(empty) is None


def test_float_bounds_follow_the_general_path() -> None:
    # what as_tensor + the leaf cast give, computed independently of the storage
    for value in (0.1, 1 / 3, 3.4e38, -3.4e38, 2.0**-149):
        storage = TensorStorage(2)
        storage.set(0, {"r": torch.zeros(())})
        assert storage.add_fast(1, {"r": value})
        assert storage.buffers[0][1].item() == np.float32(value).item()
    # a finite float that float32 cannot hold: the general path (as_tensor rounds it to inf)
    storage = TensorStorage(2)
    storage.set(0, {"r": torch.zeros(())})
    assert not storage.add_fast(1, {"r": 1e300})
    storage.set(1, {"r": 1e300})
    assert math.isinf(storage.buffers[0][1].item())


# --- small batches (Storage.extend_fast) ---------------------------------------------------
BATCH_KINDS = ["np-exact"] * 4 + ["torch-exact"] * 2 + ["np-f64", "np-one-item", "np-wrong-shape"]


def batch_leaf(kind: str, n: int, value: int, shape: tuple[int, ...], dtype: torch.dtype) -> Any:
    """A batch leaf of ``n`` items of one kind (mostly kinds the fast path takes)."""
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    if kind == "np-exact":
        return np.full((n, *shape), value).astype(np_dtype)
    if kind == "torch-exact":
        return torch.full((n, *shape), value).to(dtype)
    if kind == "np-f64":
        return np.full((n, *shape), value, dtype=np.float64)
    if kind == "np-one-item":  # no batch dimension
        return np.full(shape, value).astype(np_dtype)
    return np.full((n, *shape, 2), value).astype(np_dtype)  # "np-wrong-shape"


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kinds=st.one_of(  # half: only kinds the fast path takes; half: any kind
        st.lists(st.sampled_from(BATCH_KINDS[:6]), min_size=len(LEAVES), max_size=len(LEAVES)),
        st.lists(st.sampled_from(BATCH_KINDS), min_size=len(LEAVES), max_size=len(LEAVES)),
    ),
    value=st.integers(0, 100),
    n=st.integers(0, CAP + 1),
    start=st.integers(0, CAP - 1),
    full=st.booleans(),
    mismatch=st.sampled_from([False, False, False, True]),
    as_td=st.booleans(),
)
def test_extend_fast_stores_what_the_general_path_stores(
    tmp_path_factory: pytest.TempPathFactory,
    kinds: list[str],
    value: int,
    n: int,
    start: int,
    full: bool,
    mismatch: bool,
    as_td: bool,
) -> None:
    tmp = tmp_path_factory.mktemp("fastx")
    flat = {
        key: batch_leaf(kind, n + 1 if mismatch and i == 3 else n, value, shape, dtype)
        for i, (kind, (key, shape, dtype)) in enumerate(zip(kinds, LEAVES, strict=True))
    }
    batch: Any = nest(flat.items())
    if as_td:
        try:
            batch = TensorDict(batch, [n])
        except (RuntimeError, ValueError, TypeError):
            return  # not a TensorDict of batch size n: nothing to compare
    for _, make in storages(tmp):
        fast, ref = ReplayBuffer(make(0)), ReplayBuffer(make(1))
        for rb in (fast, ref):  # cursor at start; the ring full (overwrites) or not
            for _ in range(start + (CAP if full else 0)):
                rb.add(first_item())
        ref.storage._unpacker = None  # the general path, same writer and storage class
        before = snapshot(fast.storage)
        got_index: list[Any] = []
        got = outcome(lambda fast=fast, out=got_index: out.append(fast.extend(batch)))
        want_index: list[Any] = []
        want = outcome(lambda ref=ref, out=want_index: out.append(ref.extend(batch)))
        assert got == want, (got, want)
        assert same(snapshot(fast.storage), snapshot(ref.storage))
        assert fast.writer.cursor == ref.writer.cursor
        if want is None:
            assert torch.equal(got_index[0], want_index[0])
        else:
            assert same(snapshot(fast.storage), before)
        for rb in (fast, ref):
            if isinstance(rb.storage, MemmapStorage):
                rb.storage.close()


def test_small_batches_take_the_fast_path_and_wrap_like_the_general_path(
    tmp_path: Path,
) -> None:
    for _, make in storages(tmp_path):
        rb, ref = ReplayBuffer(make(0)), ReplayBuffer(make(1))
        for r in (rb, ref):
            r.add(cartpole_item(0))
        ref.storage._unpacker = None
        taken = 0
        for k in range(1, 12):
            n = 1 + k % 4
            batch = {
                "observation": np.full((n, 4), k, np.float32),
                "action": np.full(n, k % 2, np.int64),
                "next": {
                    "reward": np.ones(n, np.float32),
                    "done": np.arange(n) % 2 == 0,
                    "observation": np.full((n, 4), -k, np.float32),
                },
            }
            taken += rb.storage._unpacker.unpack_batch(batch) is not None
            assert torch.equal(rb.extend(batch), ref.extend(batch))
            assert same(snapshot(rb.storage), snapshot(ref.storage))
        assert taken == 11
        for r in (rb, ref):
            if isinstance(r.storage, MemmapStorage):
                r.storage.close()


def test_any_key_string_is_data_never_code() -> None:
    """The readers are generated per layout: keys are bound as values, never put in source."""
    keys = ["it's", 'say "hi"', "line\nbreak", "__import__('os').getpid()", "back\\", "ünï", ""]
    first = {k: torch.zeros(()) for k in keys} | {"sub": {k: torch.zeros(2) for k in keys}}
    storage = TensorStorage(3)
    storage.set(0, first)
    item = {k: np.float32(i) for i, k in enumerate(keys)}
    item["sub"] = {k: np.full(2, -i, np.float32) for i, k in enumerate(keys)}
    assert storage.add_fast(1, item)
    batch = {k: np.full(1, i, np.float32) for i, k in enumerate(keys)}
    batch["sub"] = {k: np.full((1, 2), -i, np.float32) for i, k in enumerate(keys)}
    assert storage.extend_fast(2, batch) is not None
    got = storage[torch.tensor([1, 2])]
    for i, k in enumerate(keys):
        assert got[k].tolist() == [i, i]
        assert got["sub", k].tolist() == [[-i, -i]] * 2
