"""The mixture's CPU gather kernel (``rbdata.mixed._rows``) against its torch reference.

The reference is ``index_select`` per source and leaf, then ``torch.cat``
(:func:`gather_reference`); the combined index and source columns are checked against
``cat(indices[s] + offsets[s])`` and ``repeat_interleave(positions, counts)``. Layouts,
dtypes (bool, uint8, float16, float64, int64, complex, ...), per-row shapes (odd byte widths
included), counts (zeros included) and the buffers' alignments are random. Then the
mixture's batches through the kernel against the storages' own rows (the memory moving
included) and the torch path, and the cached neutral extras (never handed out).
"""

from __future__ import annotations

import pytest
import torch
from _mixed_data import rows, storage
from hypothesis import given, settings
from hypothesis import strategies as st

from rbdata import MixedBuffer, ReplayBuffer, TensorStorage
from rbdata._core.layout import Layout, Leaf
from rbdata.mixed._batch import fill_extras, gather_leaves
from rbdata.mixed._rows import RowGather, gather_reference, gather_rows

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
DTYPES += [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]
SHAPES = [(), (1,), (3,), (2, 3), (5,), (4, 2), (0,), (7, 1)]


def _random(capacity: int, shape: tuple[int, ...], dtype: torch.dtype, shift: int) -> torch.Tensor:
    """A contiguous buffer of random bytes, starting ``shift`` bytes into its allocation."""
    item = torch.empty((), dtype=dtype).element_size()
    n = capacity * int(torch.Size(shape).numel())
    raw = torch.randint(0, 256, ((n + 2) * item + 8,), dtype=torch.uint8)
    if dtype == torch.bool:
        raw = raw % 2
    if shift % item:  # a view of another dtype needs an aligned start: copy instead
        shift = 0
    return raw[shift : shift + n * item].view(dtype).view(capacity, *shape)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_kernel_matches_the_reference(data: st.DataObject) -> None:
    n_leaves = data.draw(st.integers(1, 6))
    leaves = [
        (data.draw(st.sampled_from(SHAPES)), data.draw(st.sampled_from(DTYPES)))
        for _ in range(n_leaves)
    ]
    n_sources = data.draw(st.integers(1, 4))
    buffers, indices = [], []
    for _ in range(n_sources):
        capacity = data.draw(st.integers(1, 40))
        bufs = []
        for shape, dtype in leaves:
            shift = data.draw(st.sampled_from([0, 1, 2, 4, 8]))
            bufs.append(_random(capacity, shape, dtype, shift))
        buffers.append(bufs)
        count = data.draw(st.integers(0, 30))
        indices.append(torch.randint(0, capacity, (count,)))
    n = sum(len(i) for i in indices)
    outputs = [torch.zeros((n, *shape), dtype=dtype) for shape, dtype in leaves]
    offsets = data.draw(st.lists(st.integers(0, 10**6), min_size=n_sources, max_size=n_sources))
    positions = data.draw(st.lists(st.integers(0, 9), min_size=n_sources, max_size=n_sources))
    columns = gather_rows(buffers, indices, outputs, offsets, positions)
    for got, expected in zip(outputs, gather_reference(buffers, indices), strict=True):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))  # NaNs too
    assert columns is not None
    index, source = columns
    assert torch.equal(index, torch.cat([i + o for i, o in zip(indices, offsets, strict=True)]))
    counts = torch.tensor([len(i) for i in indices])
    assert torch.equal(source, torch.repeat_interleave(torch.tensor(positions), counts))


def test_an_index_out_of_range_raises_and_copies_nothing() -> None:
    buffers = [[torch.arange(10.0)], [torch.arange(5.0) + 100]]
    out = torch.full((4,), -1.0)
    for bad in (5, -1):
        with pytest.raises(IndexError, match=f"index {bad} is out of range for a source of 5"):
            gather_rows(buffers, [torch.tensor([1, 2]), torch.tensor([0, bad])], [out])
        assert out.tolist() == [-1.0] * 4
    # rows of a source: the shortest of its buffers
    short = [[torch.arange(10.0), torch.arange(3.0)]]
    outs = [torch.empty(1), torch.empty(1)]
    with pytest.raises(IndexError, match="source of 3 rows"):
        gather_rows(short, [torch.tensor([4])], outs)


def test_buffers_the_kernel_cannot_read_are_refused() -> None:
    out = [torch.empty(2, 3)]
    idx = [torch.tensor([0, 1])]
    for buf in (
        torch.zeros(3, 4)[:, :3],
        torch.zeros(4, 3, dtype=torch.float64),
        torch.zeros(4, 2),
    ):
        with pytest.raises(ValueError, match="buffers\\[0\\]"):
            gather_rows([[buf]], idx, out)
    with pytest.raises(ValueError, match="outputs"):
        gather_rows([[torch.zeros(4, 3)]], idx, [torch.empty(3, 3)])


def test_row_gather_checks_buffers_by_identity() -> None:
    layout = Layout("tensordict", [Leaf(("a",), (3,), torch.float32)])
    gather = RowGather()
    buf = torch.zeros(10, 3)
    assert gather.rows(0, [buf], layout) == 10
    assert gather.rows(0, [buf], layout) == 10  # the same tensor: checked already
    assert gather.rows(0, [torch.zeros(10, 4)[:, :3]], layout) == -1  # a new one: checked
    assert gather.rows(0, [torch.zeros(6, 3, dtype=torch.float64)], layout) == -1
    assert gather.rows(0, [torch.zeros(6, 3)], layout) == 6
    other = Layout("tensordict", [Leaf(("a",), (3,), torch.float64)])
    assert gather.rows(0, [torch.zeros(6, 3)], other) == -1  # a new layout: checked anew


def _mixture() -> tuple[MixedBuffer, ReplayBuffer]:
    online = ReplayBuffer(TensorStorage(64))
    online.extend(rows(20, 5000))
    mixed = MixedBuffer(
        {"a": storage(30, 0), "b": online, "c": storage(9, 9000, 12)},
        {"a": 1.0, "b": 2.0, "c": 0.5},
        generator=torch.Generator().manual_seed(0),
    )
    return mixed, online


def _check(mixed: MixedBuffer, batch: object) -> None:
    """Every row equals its source's own row at the batch's index."""
    position, local = mixed.locate(batch["index"])  # type: ignore[index]
    for pos, source in enumerate(mixed.sources.values()):
        store = source.storage if isinstance(source, ReplayBuffer) else source
        mine = position == pos
        if bool(mine.any()):
            expected = store[local[mine]]
            for key in ("id", "obs"):
                assert torch.equal(batch[key][mine], expected[key])  # type: ignore[index]


def test_samples_follow_the_memory_when_it_moves() -> None:
    mixed, online = _mixture()
    _check(mixed, mixed.sample(40))
    before = [b.data_ptr() for b in online.storage.buffers]
    for buf in online.storage.buffers:  # memory moves under the checked tensors
        buf.share_memory_()
    assert [b.data_ptr() for b in online.storage.buffers] != before
    online.extend(rows(30, 7000))  # written where the memory is now
    for _ in range(3):
        _check(mixed, mixed.sample(40))


def test_the_kernel_and_the_torch_paths_give_the_same_batch() -> None:
    mixed, _ = _mixture()
    parts, _, _, _ = mixed.sampler.draw_parts(50)
    layout = mixed.sampler.layout
    assert layout is not None
    device = torch.device("cpu")
    fast, columns = gather_leaves(parts, layout, 50, device, RowGather(), True)
    slow, none = gather_leaves(parts, layout, 50, device, None, True)
    assert columns is not None and none is None
    for a, b in zip(fast, slow, strict=True):
        assert torch.equal(a, b)
    batch = mixed.dataset.__getitems__(columns[0].tolist())
    assert torch.equal(batch["source"], columns[1])
    for a, key in zip(fast, layout.keys, strict=True):
        assert torch.equal(batch[key], a)


def test_neutral_extras_are_never_shared_between_batches() -> None:
    weight = torch.tensor([0.5, 0.25])
    for extras, counts in (([{}], [3]), ([{}, {"weight": weight}], [3, 2])):
        first = fill_extras(extras, counts, weight=True)["weight"]
        first.fill_(7.0)  # a user's in-place change to one batch
        second = fill_extras(extras, counts, weight=True)["weight"]
        assert second.tolist() == [1.0] * 3 + weight.tolist()[: len(second) - 3]
    mask = fill_extras([{"mask": torch.tensor([False])}, {}], [1, 2])["mask"]
    assert mask.tolist() == [False, True, True]
    slices = fill_extras([{}, {"slice": torch.tensor([4, 5])}], [2, 2])["slice"]
    assert slices.tolist() == [-1, -1, 4, 5]
