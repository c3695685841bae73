"""SliceSamplerWithoutReplacement: epochs against a brute-force enumeration of slice starts."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from _slice_model import brute_spans, episodes, fill
from hypothesis import given, settings
from hypothesis import strategies as st
from sampler_contract import SamplerContract
from torchdata.stateful_dataloader import StatefulDataLoader

from rbdata import BatchSampler, ReplayBuffer, SliceSamplerWithoutReplacement, TensorStorage


class TestSliceSamplerWithoutReplacement(SamplerContract):
    def make(self, generator: torch.Generator | None, capacity: int = 16) -> Any:
        return SliceSamplerWithoutReplacement(slice_len=2, generator=generator)

    def bad_states(self, state: dict[str, Any]) -> list[tuple[dict[str, Any], type, str]]:
        epoch = state["epoch"]
        assert epoch is not None and epoch.numel() >= 2  # one batch was drawn
        twice = epoch.clone()
        twice[1] = twice[0]
        return [
            *super().bad_states(state),
            ({**state, "epoch": twice}, ValueError, "repeats a start"),
            ({**state, "epoch": epoch.float()}, ValueError, "1-D LongTensor"),
            ({**state, "epoch": epoch + 1000}, ValueError, "outside the steps"),
            ({**state, "pos": epoch.numel() + 1}, ValueError, "outside the epoch"),
            ({**state, "epoch_len": 0}, ValueError, "epoch_len must be a positive"),
            ({**state, "ends": state["ends"].flip(0)}, ValueError, "not increasing"),
        ]

    def test_an_epoch_is_every_start_once(self) -> None:
        # by design: the draws of an epoch are a permutation of the valid starts
        rb = self.buffer(seed=4)
        first = torch.cat([rb.sampler.draw(4)[0].view(2, 2)[:, 0] for _ in range(4)])
        assert sorted(first.tolist()) == [1, 2, 4, 5, 7, 8, 10, 11]  # episodes of 3 steps


def one_epoch(rb: ReplayBuffer, length: int) -> list[tuple[int, int]]:
    """(start time, real steps) of every slice of one epoch of ``rb``, checked for shape."""
    out = []
    for batch in rb:
        t = batch["t"].reshape(-1, length)
        episode = batch["episode"].reshape(-1, length)
        mask = batch.get("mask", torch.ones(t.shape, dtype=torch.bool)).reshape(-1, length)
        real = mask.sum(1)
        for row in range(t.shape[0]):
            n = int(real[row])
            assert bool(mask[row, :n].all()) and not bool(mask[row, n:].any())
            assert t[row, :n].tolist() == list(range(int(t[row, 0]), int(t[row, 0]) + n))
            assert bool((t[row, n:] == t[row, n - 1]).all())  # padding repeats the last step
            assert bool((episode[row] == episode[row, 0]).all())
            out.append((int(t[row, 0]), n))
    return out


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(4, 40),
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=12),
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=8),
    length=st.integers(1, 5),
    num_slices=st.integers(1, 4),
    strict=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_each_valid_start_exactly_once_per_epoch(
    capacity: int,
    lengths: list[int],
    sizes: list[int],
    length: int,
    num_slices: int,
    strict: bool,
    seed: int,
) -> None:
    # ring wrap (sizes add up past the capacity), episode ends, a running last episode
    sampler = SliceSamplerWithoutReplacement(
        slice_len=length, strict_length=strict, generator=torch.Generator().manual_seed(seed)
    )
    rb = ReplayBuffer(TensorStorage(capacity), sampler=sampler, batch_size=num_slices * length)
    episode_of = fill(rb, lengths, sizes)
    expected = brute_spans(episode_of, capacity, length, strict)
    if not expected:
        with pytest.raises(ValueError, match=f"no episode in the buffer has {length} steps"):
            rb.sample()
        return
    for _ in range(2):  # two epochs, each every start once
        got = one_epoch(rb, length)
        assert Counter(s for s, _ in got) == Counter(expected.keys())
        assert dict(got) == expected
    batches = BatchSampler(sampler, num_slices * length)
    assert len(batches) == -(-len(expected) // num_slices)


def test_mid_epoch_resume_equals_an_uninterrupted_run() -> None:
    storage = TensorStorage(50)
    sampler = SliceSamplerWithoutReplacement(
        slice_len=3, generator=torch.Generator().manual_seed(1)
    )
    rb = ReplayBuffer(storage, sampler=sampler)
    steps = episodes([9, 4, 12, 2, 8, 10, 7])  # 52 steps: the ring wraps
    rb.extend(steps[:30])
    rb.extend(steps[30:])
    sampler.begin_epoch()
    [sampler.draw(6) for _ in range(3)]
    state = sampler.state_dict()
    rest = []
    while not sampler.epoch_over(6):
        rest.append(sampler.draw(6))
    again = SliceSamplerWithoutReplacement(slice_len=3, generator=torch.Generator().manual_seed(9))
    ReplayBuffer(storage, sampler=again)  # attached: indexes the same steps
    again.load_state_dict(state)
    resumed = []
    while not again.epoch_over(6):
        resumed.append(again.draw(6))
    assert len(resumed) == len(rest) > 0
    for (a, ea), (b, eb) in zip(rest, resumed, strict=True):
        assert torch.equal(a, b) and torch.equal(ea["slice"], eb["slice"])


def test_stateful_dataloader_resumes_mid_epoch() -> None:
    storage = TensorStorage(64)
    ReplayBuffer(storage).extend(episodes([10, 3, 15, 8, 20]))

    def loader(seed: int) -> StatefulDataLoader:
        gen = torch.Generator().manual_seed(seed)
        sampler = SliceSamplerWithoutReplacement(storage, num_slices=2, generator=gen)
        ReplayBuffer(storage, sampler=sampler)  # indexes the episodes already there
        return StatefulDataLoader(storage, batch_sampler=BatchSampler(sampler, 8))

    first = loader(0)
    it = iter(first)
    [next(it) for _ in range(4)]
    state = first.state_dict()
    rest = [b["t"] for b in it]
    again = loader(5)
    again.load_state_dict(state)
    resumed = [b["t"] for b in again]
    assert len(rest) == len(resumed) > 0
    assert all(torch.equal(a, b) for a, b in zip(rest, resumed, strict=True))


def test_overwritten_starts_are_skipped_and_new_ones_wait() -> None:
    sampler = SliceSamplerWithoutReplacement(slice_len=2, generator=torch.Generator())
    rb = ReplayBuffer(TensorStorage(20), sampler=sampler, batch_size=4)
    rb.extend(episodes([5, 5, 5, 5]))  # full: 16 starts
    sampler.begin_epoch()
    seen = [sampler.draw(4)[0] for _ in range(2)]
    rb.extend(episodes([5], start_time=20, first_episode=4))  # overwrites times 0..4
    while not sampler.epoch_over(4):
        index, _ = sampler.draw(4)
        seen.append(index)
    data = rb.storage[torch.cat(seen)]
    t = data["t"].view(-1, 2)
    assert bool((t[:, 1] - t[:, 0] == 1).all())
    assert bool((data["episode"].view(-1, 2).diff(dim=1) == 0).all())
    starts = t[:, 0].tolist()
    assert len(starts) == len(set(starts))
    late = set(starts[4:])  # overwritten starts skipped, new ones join the next epoch
    assert late.isdisjoint(range(0, 5)) and late.isdisjoint(range(20, 25))


def test_num_slices_drop_last_and_errors() -> None:
    sampler = SliceSamplerWithoutReplacement(
        num_slices=2, drop_last=True, generator=torch.Generator()
    )
    rb = ReplayBuffer(TensorStorage(30), sampler=sampler, batch_size=6)
    rb.extend(episodes([4, 4, 4]))  # slices of 3: two starts per episode, six in all
    assert [b["t"].shape[0] for b in rb] == [6, 6, 6]
    assert [len(b) for b in BatchSampler(sampler, 8)] == [8]  # length 4: 3 starts, drop 1
    assert len(BatchSampler(sampler, 8)) == 1
    with pytest.raises(ValueError, match="no episode in the buffer has 5 steps"):
        sampler.sample(10)
    with pytest.raises(ValueError, match="batch_size 7 is not a multiple of num_slices 2"):
        sampler.sample(7)
    with pytest.raises(TypeError, match="drop_last must be a bool"):
        SliceSamplerWithoutReplacement(slice_len=2, drop_last="no")  # type: ignore[arg-type]


def test_checkpoint_round_trip_continues_the_epoch(tmp_path: Any) -> None:
    gen = torch.Generator().manual_seed(3)
    sampler = SliceSamplerWithoutReplacement(slice_len=2, generator=gen)
    rb = ReplayBuffer(TensorStorage(40), sampler=sampler, batch_size=4)
    rb.extend(episodes([6, 3, 9, 5]))
    sampler.begin_epoch()
    sampler.draw(4)
    rb.dumps(tmp_path / "ckpt")
    expected = [sampler.draw(4)[0] for _ in range(3)]
    loaded = ReplayBuffer.loads(tmp_path / "ckpt")
    assert isinstance(loaded.sampler, SliceSamplerWithoutReplacement)
    got = [loaded.sampler.draw(4)[0] for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_pipeline_state_is_the_epoch_not_the_episode_index() -> None:
    """A nodes pipeline saves the draw state (generator, epoch); its restore keeps the data.

    After a restore, the writes made since the save are still indexed (later writes are
    accepted in time order, and slices never cross their episode ends), and the resumed epoch
    is the saved one.
    """
    from rbdata.nodes import BufferSource

    sampler = SliceSamplerWithoutReplacement(slice_len=2, generator=torch.Generator())
    rb = ReplayBuffer(TensorStorage(200), sampler=sampler)
    rb.extend(episodes([6, 5, 7]))
    source = BufferSource(rb, batch_size=4)
    source.reset()
    [source.next() for _ in range(2)]
    state = source.get_state()
    assert set(state["sampler_state"]) == {"generator", "epoch", "pos", "epoch_len", "fresh"}
    rest = [b["t"] for b in _drain(source)]
    ends_before = sampler.state_dict()["ends"].clone()
    rb.extend(episodes([4, 5], start_time=18, first_episode=3))  # written after the save
    ends_after = sampler.state_dict()["ends"].clone()
    assert ends_after.numel() == ends_before.numel() + 2
    source.reset(state)
    assert torch.equal(sampler.state_dict()["ends"], ends_after)  # not rolled back
    resumed = [b["t"] for b in _drain(source)]
    assert len(resumed) == len(rest) > 0  # the saved epoch: the starts known at the save
    assert all(torch.equal(a, b) for a, b in zip(rest, resumed, strict=True))
    rb.extend(episodes([3], start_time=27, first_episode=5))  # still accepted in time order
    source.reset()  # the next epoch holds every start, the new episodes' included
    starts = torch.cat([b["t"].view(-1, 2)[:, 0] for b in _drain(source)]).tolist()
    episode_of = rb.storage[torch.arange(len(rb))]["episode"].tolist()  # t == slot here
    assert sorted(starts) == sorted(brute_spans(episode_of, 200, 2, True))  # each start once


def _drain(source: Any) -> list[Any]:
    out = []
    try:
        while True:
            out.append(source.next())
    except StopIteration:
        return out
