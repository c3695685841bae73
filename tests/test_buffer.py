"""ReplayBuffer: composition, sampling, iteration, the issue's verbatim example."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from storage_contract import assert_rows_are, transitions
from torch.utils.data import DataLoader

from rbdata import (
    ListStorage,
    MemmapStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorStorage,
    UniformSampler,
)
from rbdata.errors import EmptyBufferError


def test_verbatim_example() -> None:
    import torch
    from tensordict import TensorDict
    from torch.utils.data import DataLoader

    from rbdata import ReplayBuffer
    from rbdata.storages import MemmapStorage

    rb = ReplayBuffer(storage=MemmapStorage(1_000_000), batch_size=256)
    rb.extend(TensorDict({"observation": torch.randn(1024, 17), "action": torch.randn(1024, 6),
                          ("next", "reward"): torch.randn(1024, 1)}, batch_size=[1024]))  # fmt: skip  # noqa: E501
    batch = rb.sample()  # TensorDict, batch_size [256], with "index"
    loader = DataLoader(rb.storage, batch_size=256, shuffle=True, num_workers=2)
    for batch in loader:  # default collate_fn; one gather per batch
        assert batch.batch_size == (256,)

    batch = rb.sample()
    assert isinstance(batch, TensorDict) and batch.batch_size == (256,)
    stored = rb.storage[batch["index"]]
    torch.testing.assert_close(batch["observation"], stored["observation"])
    rb.storage.close()


@pytest.mark.parametrize("make", [TensorStorage, MemmapStorage, ListStorage])
def test_add_extend_sample_index_points_at_the_item(make: type) -> None:
    rb = ReplayBuffer(make(20), batch_size=32)
    assert rb.add(transitions(1)[0]) == 0
    assert rb.extend(transitions(5, 1)).tolist() == [1, 2, 3, 4, 5]
    assert len(rb) == 6
    batch = rb.sample()
    assert batch.batch_size == (32,)
    assert batch["id"].tolist() == batch["index"].tolist()  # slot i holds id i here
    assert_rows_are(batch, batch["index"].tolist())


def test_default_parts_and_repr() -> None:
    rb = ReplayBuffer(TensorStorage(4))
    assert isinstance(rb.sampler, UniformSampler) and rb.sampler.data_source is rb.storage
    assert "TensorStorage" in repr(rb) and "RoundRobinWriter" in repr(rb)


def test_extend_wraps_and_returns_slots() -> None:
    rb = ReplayBuffer(TensorStorage(5))
    rb.extend(transitions(3))
    assert rb.extend(transitions(4, 3)).tolist() == [3, 4, 0, 1]
    assert [int(rb.storage[i]["id"]) for i in range(5)] == [5, 6, 2, 3, 4]


def test_uniform_sampling_is_uniform() -> None:
    n, draws = 10, 100_000
    rb = ReplayBuffer(
        TensorStorage(n), sampler=UniformSampler(generator=torch.Generator().manual_seed(3))
    )
    rb.extend(transitions(n))
    counts = torch.bincount(rb.sample(draws)["index"], minlength=n).double()
    expected = draws / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 27.88  # 99.9% quantile of chi-square with 9 degrees of freedom


def test_plain_tensor_buffer_sample_has_no_index() -> None:
    rb = ReplayBuffer(TensorStorage(10), batch_size=4)
    rb.extend(torch.arange(10.0).view(10, 1))
    batch = rb.sample()
    assert isinstance(batch, torch.Tensor) and batch.shape == (4, 1)


def test_iteration_with_replacement_is_endless() -> None:
    rb = ReplayBuffer(TensorStorage(8), batch_size=3)
    rb.extend(transitions(8))
    batches = list(itertools.islice(rb, 50))
    assert len(batches) == 50 and all(b.batch_size == (3,) for b in batches)


@pytest.mark.parametrize(("drop_last", "sizes"), [(False, [4, 4, 2]), (True, [4, 4])])
def test_iteration_without_replacement_is_one_epoch(drop_last: bool, sizes: list[int]) -> None:
    sampler = SamplerWithoutReplacement(drop_last=drop_last)
    rb = ReplayBuffer(TensorStorage(10), sampler=sampler, batch_size=4)
    rb.extend(transitions(10))
    for _ in range(2):  # two epochs, each a fresh permutation
        batches = list(rb)
        assert [b.batch_size[0] for b in batches] == sizes
        ids = torch.cat([b["id"] for b in batches]).tolist()
        assert len(set(ids)) == len(ids)
        if not drop_last:
            assert sorted(ids) == list(range(10))


def test_transform_is_applied() -> None:
    rb = ReplayBuffer(TensorStorage(10), transform=lambda td: td.exclude("id"), batch_size=2)
    rb.extend(transitions(10))
    assert "id" not in rb.sample().keys()


def test_empty_resets_everything() -> None:
    rb = ReplayBuffer(TensorStorage(10), sampler=SamplerWithoutReplacement(), batch_size=2)
    rb.extend(transitions(7))
    rb.sample()
    rb.empty()
    assert len(rb) == 0
    with pytest.raises(EmptyBufferError, match="empty"):
        rb.sample()
    assert rb.extend(transitions(3, 100)).tolist() == [0, 1, 2]
    assert sorted(torch.cat([b["id"] for b in rb]).tolist()) == [100, 101, 102]


def test_batch_size_errors() -> None:
    rb = ReplayBuffer(TensorStorage(10))
    rb.extend(transitions(3))
    with pytest.raises(ValueError, match="batch_size: pass sample"):
        rb.sample()
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        rb.sample(0)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got -2"):
        ReplayBuffer(TensorStorage(10), batch_size=-2)
    with pytest.raises(TypeError, match="storage must be an rbdata Storage"):
        ReplayBuffer([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"sampler must have a sample\(batch_size\)"):
        foreign = torch.utils.data.RandomSampler(range(4))
        ReplayBuffer(TensorStorage(4), sampler=foreign)  # type: ignore[arg-type]


def test_foreign_sampler_indices_are_checked() -> None:
    class Bad:
        data_source = None

        def sample(self, batch_size: int) -> torch.Tensor:
            return torch.tensor([0, 99])

    rb = ReplayBuffer(TensorStorage(10), sampler=Bad(), batch_size=2)  # type: ignore[arg-type]
    rb.extend(transitions(3))
    with pytest.raises(IndexError, match=r"index 99 .* length 3"):
        rb.sample()


def test_seeded_generators_reproduce() -> None:
    def draws(seed: int) -> list[int]:
        sampler = UniformSampler(generator=torch.Generator().manual_seed(seed))
        rb = ReplayBuffer(TensorStorage(100), sampler=sampler, batch_size=16)
        rb.extend(transitions(100))
        return torch.cat([rb.sample()["index"] for _ in range(3)]).tolist()

    assert draws(1) == draws(1) and draws(1) != draws(2)
    torch.manual_seed(5)  # without a generator, torch's global seed rules
    first = UniformSampler(range(100)).sample(8).tolist()
    torch.manual_seed(5)
    assert UniformSampler(range(100)).sample(8).tolist() == first


def test_sampler_state_dict_resumes_exactly() -> None:
    sampler = SamplerWithoutReplacement(range(50), generator=torch.Generator().manual_seed(0))
    sampler.sample(7)
    state = sampler.state_dict()
    expected = [sampler.sample(7).tolist() for _ in range(12)]  # crosses an epoch boundary
    other = SamplerWithoutReplacement(range(50))
    other.load_state_dict(state)
    assert [other.sample(7).tolist() for _ in range(12)] == expected


def test_samplers_plug_into_dataloader() -> None:
    storage = TensorStorage(30)
    storage.set(slice(0, 30), transitions(30))
    sampler = UniformSampler(storage, num_samples=40, generator=torch.Generator().manual_seed(0))
    batches = list(DataLoader(storage, sampler=sampler, batch_size=8))
    assert [b.batch_size[0] for b in batches] == [8] * 5
    epoch = DataLoader(storage, sampler=SamplerWithoutReplacement(storage), batch_size=8)
    assert sorted(i for b in epoch for i in b["id"].tolist()) == list(range(30))
    no_repl = UniformSampler(storage, replacement=False)
    assert sorted(no_repl.sample(30).tolist()) == list(range(30))
    with pytest.raises(ValueError, match="batch_size 31 is larger than the 30 items"):
        no_repl.sample(31)


def test_replay_buffer_checks_writer_and_transform() -> None:
    sampler = UniformSampler()
    with pytest.raises(TypeError, match=r"writer must be an rbdata Writer .* got object"):
        ReplayBuffer(TensorStorage(4), sampler, writer=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="transform must be callable, got int"):
        ReplayBuffer(TensorStorage(4), sampler, transform=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        ReplayBuffer(TensorStorage(4), sampler, batch_size=0)
    assert sampler.data_source is None  # refused before the sampler was bound
    assert UniformSampler(replacement=np.bool_(False)).replacement is False


def test_an_out_of_range_index_raises_index_error() -> None:
    rb = ReplayBuffer(TensorStorage(20))
    rb.extend({"obs": torch.arange(10.0)})
    for index in (len(rb), torch.tensor([10**6]), -len(rb) - 1, 10**6, [0, 10**6]):
        with pytest.raises(IndexError, match="out of range"):
            rb[index]
