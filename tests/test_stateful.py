"""torchdata's StatefulDataLoader resumes mid-epoch with the exact remaining batches."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from storage_contract import transitions
from test_slice import episodes
from torchdata.stateful_dataloader import StatefulDataLoader

from rbdata import (
    BatchSampler,
    PrioritizedSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorStorage,
    UniformSampler,
)
from rbdata.samplers import Sampler

N = 60


def _uniform(gen: torch.Generator) -> Sampler:
    return UniformSampler(generator=gen)


def _without(gen: torch.Generator) -> Sampler:
    return SamplerWithoutReplacement(generator=gen)


def _prioritized(gen: torch.Generator) -> Sampler:
    return PrioritizedSampler(N, alpha=0.7, beta=0.5, generator=gen)


def _slices(gen: torch.Generator) -> Sampler:
    return SliceSampler(slice_len=4, generator=gen)


SAMPLERS: dict[str, Callable[[torch.Generator], Sampler]] = {
    "uniform": _uniform,
    "without-replacement": _without,
    "prioritized": _prioritized,
    "slice": _slices,
}


def _buffer(make: Callable[[torch.Generator], Sampler], seed: int) -> ReplayBuffer:
    rb = ReplayBuffer(TensorStorage(N), sampler=make(torch.Generator().manual_seed(seed)))
    data = transitions(N)
    data.update(episodes([7, 13, 9, 11, 20]).select("next"))  # episodes for the slice sampler
    rb.extend(data)
    if isinstance(rb.sampler, PrioritizedSampler):
        rb.update_priority(torch.arange(N), torch.arange(N) % 7 + 0.5)
    return rb


def _loader(rb: ReplayBuffer, mode: str, num_workers: int) -> StatefulDataLoader:
    if mode == "sampler":
        return StatefulDataLoader(
            rb.storage, sampler=rb.sampler, batch_size=8, num_workers=num_workers
        )
    batches = BatchSampler(rb.sampler, batch_size=8, num_batches=12)  # type: ignore[arg-type]
    return StatefulDataLoader(rb.storage, batch_sampler=batches, num_workers=num_workers)


def _ids(batch: object) -> list[int]:
    return batch["id"].tolist()  # type: ignore[index]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mode", ["sampler", "batch_sampler"])
@pytest.mark.parametrize("name", list(SAMPLERS))
def test_resume_mid_epoch(name: str, mode: str, num_workers: int) -> None:
    make = SAMPLERS[name]
    loader = _loader(_buffer(make, seed=1), mode, num_workers)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    expected = [_ids(b) for b in it]
    assert expected  # something was left to resume
    # a fresh buffer with another seed: only the restored state can reproduce the batches
    resumed = _loader(_buffer(make, seed=99), mode, num_workers)
    resumed.load_state_dict(state)
    assert [_ids(b) for b in resumed] == expected
    # and the next epoch goes on identically too
    assert [_ids(b) for b in loader] == [_ids(b) for b in resumed]
