"""The sampler contract over every sampler, plus the checks every sampler's options share."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from sampler_contract import SamplerContract
from tensordict import TensorDict

from rbdata import (
    PrioritizedSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorStorage,
    UniformSampler,
)


class TestUniformSampler(SamplerContract):
    def make(self, generator: torch.Generator | None, capacity: int = 16) -> Any:
        return UniformSampler(generator=generator)


class TestUniformSamplerWithoutReplacement(SamplerContract):
    def make(self, generator: torch.Generator | None, capacity: int = 16) -> Any:
        return UniformSampler(replacement=False, generator=generator)

    def test_batch_larger_than_the_buffer_changes_nothing(self) -> None:
        rb = self.buffer(n=3)
        before = rb.sampler.state_dict()["generator"].clone()
        with pytest.raises(ValueError, match="batch_size 4 is larger than the 3 items"):
            rb.sampler.sample(4)
        assert torch.equal(rb.sampler.state_dict()["generator"], before)


class TestSamplerWithoutReplacement(SamplerContract):
    short_last_batch = True  # by design: the epoch's last batch holds what is left

    def make(self, generator: torch.Generator | None, capacity: int = 16) -> Any:
        return SamplerWithoutReplacement(generator=generator)

    def bad_states(self, state: dict[str, Any]) -> list[tuple[dict[str, Any], type, str]]:
        perm = state["perm"]
        assert perm is not None  # one batch was drawn: an epoch is under way
        twice = perm.clone()
        twice[1] = twice[0]
        return [
            *super().bad_states(state),
            ({**state, "perm": twice}, ValueError, "not a permutation"),
            ({**state, "pos": perm.numel() + 1}, ValueError, "pos is out of range"),
            ({**state, "perm": perm.float()}, ValueError, "1-D LongTensor"),
            ({**state, "perm": torch.arange(40)}, ValueError, "1-D LongTensor"),  # > len(storage)
        ]

    def test_an_epoch_is_a_permutation(self) -> None:
        # by design: successive draws are slices of one permutation, not independent draws
        rb = self.buffer(seed=4, n=12)
        index = torch.cat([rb.sampler.sample(4) for _ in range(3)])
        assert sorted(index.tolist()) == list(range(12))

    def test_drop_last_batch_larger_than_the_buffer_changes_nothing(self) -> None:
        sampler = SamplerWithoutReplacement(drop_last=True, generator=torch.Generator())
        rb = ReplayBuffer(TensorStorage(8), sampler=sampler)
        rb.extend(TensorDict({"x": torch.arange(3)}, [3]))
        before = sampler.state_dict()
        with pytest.raises(ValueError, match="drop_last=True leaves no batch"):
            sampler.sample(4)
        after = sampler.state_dict()
        assert after["perm"] is None and after["pos"] == before["pos"]
        assert torch.equal(after["generator"], before["generator"])


class TestPrioritizedSampler(SamplerContract):
    sized = True  # a tree of fixed size: a storage larger than it is refused

    def make(self, generator: torch.Generator | None, capacity: int = 16) -> Any:
        return PrioritizedSampler(capacity, 0.7, 0.5, generator=generator)

    def bad_states(self, state: dict[str, Any]) -> list[tuple[dict[str, Any], type, str]]:
        return [
            *super().bad_states(state),
            ({**state, "capacity": 32}, ValueError, "the state is for 32 slots"),
        ]

    def test_draws_follow_updated_priorities(self) -> None:
        # by design: an update changes the draws (the other samplers have no priorities)
        rb = self.buffer(seed=0)
        rb.update_priority(torch.arange(13), 0.0)
        rb.update_priority([5, 9], [1.0, 1.0])
        index = torch.cat([i for i, _ in [rb.sampler.draw(4) for _ in range(20)]])
        assert set(index.tolist()) == {5, 9}


class TestSliceSampler(SamplerContract):
    def make(self, generator: torch.Generator | None, capacity: int = 16) -> Any:
        return SliceSampler(slice_len=2, generator=generator)

    def bad_states(self, state: dict[str, Any]) -> list[tuple[dict[str, Any], type, str]]:
        ends = state["ends"]
        assert ends.numel() >= 2
        return [
            *super().bad_states(state),
            ({**state, "ends": ends.flip(0)}, ValueError, "not increasing"),
            ({**state, "ends": ends + 100}, ValueError, "outside the steps"),
            ({**state, "base": -1}, ValueError, "negative base slot"),
        ]

    def test_slices_are_consecutive_steps_of_one_episode(self) -> None:
        # episodes end where id % 3 == 0 (transitions): [0], [1, 2, 3], [4, 5, 6], ...
        rb = self.buffer(seed=0)
        for index, extras in [rb.sampler.draw(4) for _ in range(10)]:
            pairs = index.view(2, 2)
            assert bool((pairs[:, 1] - pairs[:, 0] == 1).all())
            assert bool(((pairs - 1).div(3, rounding_mode="floor").diff() == 0).all())
            assert extras["slice"].tolist() == [0, 0, 1, 1]

    @pytest.mark.parametrize("bad", [3, 5])
    def test_batch_not_a_multiple_of_slice_len_changes_nothing(self, bad: int) -> None:
        rb = self.buffer(seed=0)
        before = rb.sampler.state_dict()["generator"].clone()
        with pytest.raises(ValueError, match=f"batch_size {bad} is not a multiple of slice_len 2"):
            rb.sampler.sample(bad)
        assert torch.equal(rb.sampler.state_dict()["generator"], before)


def transitions(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"obs": torch.arange(start, start + n).float().unsqueeze(1)}, [n])


# --- integer-like batch sizes, bool options, checked writer ----------------------
def test_integer_like_batch_sizes_are_accepted() -> None:
    rb = ReplayBuffer(TensorStorage(16), batch_size=np.int64(3))  # type: ignore[arg-type]
    rb.extend(transitions(10))
    assert rb.sample(np.int64(4))["obs"].shape == (4, 1)  # type: ignore[arg-type]
    assert rb.sample()["obs"].shape == (3, 1)
    uniform = UniformSampler(range(10))
    assert uniform.sample(np.int32(5)).shape == (5,)  # type: ignore[arg-type]
    prioritized = PrioritizedSampler(16, 1.0, 0.4, data_source=range(10))
    prioritized.update_priority(torch.arange(10), 1.0)
    assert prioritized.sample(np.int64(4)).shape == (4,)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        rb.sample(np.float64(4.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        uniform.sample(True)


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: UniformSampler(replacement="no"), "replacement"),
        (lambda: UniformSampler(replacement=0), "replacement"),
        (lambda: SamplerWithoutReplacement(drop_last="yes"), "drop_last"),
        (lambda: SliceSampler(slice_len=2, strict_length="no"), "strict_length"),
        (lambda: PrioritizedSampler(8, 1.0, 0.4, stratified="no"), "stratified"),
    ],
)
def test_bool_options_must_be_bools(build: Any, name: str) -> None:
    with pytest.raises(TypeError, match=f"{name} must be a bool, got"):
        build()
