"""The sampler contract, run over every sampler (subclass ``SamplerContract``, define ``make``).

Expectations are independent of the sampler code: a second sampler with the same seed, the
filled range of the storage, the documented exception and message, the state before a call.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from storage_contract import same_state, snapshot, transitions

from rbdata import ReplayBuffer
from rbdata.errors import EmptyBufferError
from rbdata.storages import TensorStorage

__all__ = ["BAD_BATCH_SIZES", "SamplerContract", "draws", "same_draws"]


def draws(sampler: Any, batches: int, batch_size: int) -> list[tuple[torch.Tensor, dict]]:
    """``batches`` draws of ``sampler`` as ``(index, extras)``, copied."""
    out = []
    for _ in range(batches):
        index, extras = sampler.draw(batch_size)
        out.append((index.clone(), {k: v.clone() for k, v in extras.items()}))
    return out


def same_draws(a: list[tuple[torch.Tensor, dict]], b: list[tuple[torch.Tensor, dict]]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x[0], y[0])
        and x[1].keys() == y[1].keys()
        and all(torch.equal(x[1][k], y[1][k]) for k in x[1])
        for x, y in zip(a, b, strict=True)
    )


#: calls that ``check_batch_size`` refuses, whatever the sampler
BAD_BATCH_SIZES = [0, -3, True, 2.5, "4", None]


class SamplerContract:
    """Subclass with ``make(generator, capacity)``: a sampler for a storage of ``capacity``.

    Every sampler is filled through a :class:`~rbdata.ReplayBuffer` over a
    :class:`~rbdata.storages.TensorStorage` with :func:`transitions` (episodes end where
    ``id % 3 == 0``, so ``("next", "done")`` gives the slice sampler episodes of 3 steps).
    """

    #: a batch size every sampler accepts (a multiple of the slice sampler's slice_len)
    batch_size = 4
    #: whether the sampler has a fixed number of slots (it then refuses a larger storage)
    sized = False
    #: whether the last batch of an epoch may be short (the epoch sampler)
    short_last_batch = False

    def make(self, generator: torch.Generator | None, capacity: int = 16) -> Any:
        raise NotImplementedError  # pragma: no cover - overridden

    def buffer(self, seed: int = 0, n: int = 13, capacity: int = 16) -> ReplayBuffer:
        sampler = self.make(torch.Generator().manual_seed(seed), capacity)
        rb = ReplayBuffer(TensorStorage(capacity), sampler=sampler)
        if n:
            rb.extend(transitions(n))
        return rb

    def bad_states(self, state: dict[str, Any]) -> list[tuple[dict[str, Any], type, str]]:
        """States this sampler must refuse, with the error and its message: corrupt generator."""
        garbage = torch.zeros(3, dtype=torch.uint8)
        return [({**state, "generator": garbage}, RuntimeError, "RNG state size")]

    # --- seeded reproducibility --------------------------------------------------------------
    def test_draws_are_valid_indices(self) -> None:
        rb = self.buffer()
        for index, _ in draws(rb.sampler, 8, self.batch_size):
            assert index.dtype == torch.long
            # an epoch of 13 items ends with a batch of 13 % 4 for the epoch sampler
            sizes = (self.batch_size, 1) if self.short_last_batch else (self.batch_size,)
            assert index.dim() == 1 and index.shape[0] in sizes
            assert int(index.min()) >= 0 and int(index.max()) < 13

    def test_same_seed_same_draws(self) -> None:
        a, b = self.buffer(seed=7).sampler, self.buffer(seed=7).sampler
        assert same_draws(draws(a, 6, self.batch_size), draws(b, 6, self.batch_size))

    def test_different_seeds_differ(self) -> None:
        a, b = self.buffer(seed=0).sampler, self.buffer(seed=1).sampler
        assert not same_draws(draws(a, 6, self.batch_size), draws(b, 6, self.batch_size))

    def test_global_seed_rules_the_default_generator(self) -> None:
        with torch.random.fork_rng(devices=[]):  # the global RNG is left as it was
            torch.manual_seed(123)
            a = self.make(None)
            torch.manual_seed(123)
            b = self.make(None)
            assert same_state(a.state_dict(), b.state_dict())
            torch.manual_seed(124)
            assert not same_state(a.state_dict(), self.make(None).state_dict())

    # --- state_dict ------------------------------------------------------------------------
    @pytest.mark.parametrize("drawn", [0, 1, 5])
    def test_state_dict_round_trip_continues_the_draws(self, drawn: int) -> None:
        rb = self.buffer(seed=3)
        draws(rb.sampler, drawn, self.batch_size)  # mid-epoch for the epoch sampler
        state = snapshot(rb.sampler.state_dict())
        expected = draws(rb.sampler, 6, self.batch_size)
        other = self.buffer(seed=99)  # another seed and history: the state rules
        draws(other.sampler, 2, self.batch_size)
        other.sampler.load_state_dict(state)
        assert same_state(other.sampler.state_dict(), state)
        assert same_draws(draws(other.sampler, 6, self.batch_size), expected)

    def test_state_dict_is_a_copy(self) -> None:
        rb = self.buffer(seed=3)
        state = rb.sampler.state_dict()
        kept = snapshot(state)
        draws(rb.sampler, 3, self.batch_size)
        assert same_state(state, kept)  # drawing did not change the returned state

    def test_pickle_keeps_the_draws(self) -> None:
        rb = self.buffer(seed=5)
        draws(rb.sampler, 1, self.batch_size)
        clone = pickle.loads(pickle.dumps(rb.sampler))
        assert same_draws(draws(clone, 4, self.batch_size), draws(rb.sampler, 4, self.batch_size))

    # --- attach ----------------------------------------------------------------------------
    def test_reattaching_to_another_storage_is_refused(self) -> None:
        rb = self.buffer()
        storage = rb.storage
        before = snapshot(rb.sampler.state_dict())
        other = TensorStorage(16)
        other.set(slice(0, 16), transitions(16))  # full: no other check refuses it first
        with pytest.raises(ValueError, match="already reads another data_source"):
            rb.sampler.attach(other)
        with pytest.raises(ValueError, match="already reads another data_source"):
            ReplayBuffer(other, sampler=rb.sampler)
        assert rb.sampler.data_source is storage
        assert same_state(rb.sampler.state_dict(), before)
        rb.sampler.attach(storage)  # the same storage again is no error
        assert rb.sampler.data_source is storage

    def test_storage_larger_than_the_sampler(self) -> None:
        sampler = self.make(torch.Generator().manual_seed(0), 8)
        storage = TensorStorage(16)
        if self.sized:  # a sampler with fewer slots than the storage would index past them
            with pytest.raises(ValueError, match="fewer than the 16 items"):
                ReplayBuffer(storage, sampler=sampler)
            assert sampler.data_source is None
            return
        rb = ReplayBuffer(storage, sampler=sampler)  # sizeless samplers follow len(storage)
        rb.extend(transitions(13))
        index = torch.cat([i for i, _ in draws(sampler, 20, self.batch_size)])
        assert int(index.max()) < 13 and int(index.max()) >= 8

    def test_storage_smaller_than_the_sampler(self) -> None:
        sampler = self.make(torch.Generator().manual_seed(0), 32)
        rb = ReplayBuffer(TensorStorage(8), sampler=sampler)
        rb.extend(transitions(6))
        index = torch.cat([i for i, _ in draws(sampler, 20, self.batch_size)])
        assert int(index.min()) >= 0 and int(index.max()) < 6

    def test_items_already_in_the_storage_are_sampled(self) -> None:
        storage = TensorStorage(16)
        ReplayBuffer(storage).extend(transitions(13))
        rb = ReplayBuffer(storage, sampler=self.make(torch.Generator().manual_seed(0)))
        index = torch.cat([i for i, _ in draws(rb.sampler, 40, self.batch_size)])
        assert int(index.max()) >= 10 and int(index.max()) < 13

    # --- empty buffer ----------------------------------------------------------------------
    def test_empty_buffer_raises(self) -> None:
        rb = self.buffer(n=0)
        before = snapshot(rb.sampler.state_dict())
        with pytest.raises(EmptyBufferError, match="the buffer is empty"):
            rb.sampler.sample(self.batch_size)
        with pytest.raises(EmptyBufferError, match="the buffer is empty"):
            rb.sample(self.batch_size)
        assert same_state(rb.sampler.state_dict(), before)

    def test_unbound_sampler_says_so(self) -> None:
        sampler = self.make(torch.Generator().manual_seed(0))
        with pytest.raises(RuntimeError, match="has no data_source"):
            sampler.sample(self.batch_size)

    # --- bad input -------------------------------------------------------------------------
    @pytest.mark.parametrize("bad", BAD_BATCH_SIZES, ids=repr)
    def test_bad_batch_size_changes_nothing(self, bad: Any) -> None:
        rb = self.buffer(seed=2)
        draws(rb.sampler, 1, self.batch_size)
        before = snapshot(rb.sampler.state_dict())
        with pytest.raises(ValueError, match="batch_size must be a positive integer"):
            rb.sampler.sample(bad)
        assert same_state(rb.sampler.state_dict(), before)

    def test_bad_state_is_refused_and_changes_nothing(self) -> None:
        rb = self.buffer(seed=2)
        draws(rb.sampler, 1, self.batch_size)
        before = snapshot(rb.sampler.state_dict())
        expected = draws(pickle.loads(pickle.dumps(rb.sampler)), 3, self.batch_size)
        cases = self.bad_states(snapshot(before))
        assert cases
        for state, error, pattern in cases:
            with pytest.raises(error, match=pattern):
                rb.sampler.load_state_dict(state)
            assert same_state(rb.sampler.state_dict(), before)
        assert same_draws(draws(rb.sampler, 3, self.batch_size), expected)
