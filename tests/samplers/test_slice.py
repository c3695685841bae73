"""SliceSampler against a brute-force model of episodes in a ring."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rbdata import MaxValueWriter, ReplayBuffer, SliceSampler, TensorStorage
from rbdata.storages import ArrowStorage, MemmapStorage


def episodes(lengths: list[int], start_time: int = 0, first_episode: int = 0) -> TensorDict:
    """Steps of consecutive episodes: absolute time ``t``, ``episode`` id and done flags."""
    eps = torch.cat([torch.full((n,), first_episode + i) for i, n in enumerate(lengths)])
    done = torch.zeros(len(eps), 1, dtype=torch.bool)
    ends = torch.cumsum(torch.tensor(lengths), 0) - 1
    done[ends] = True
    t = torch.arange(start_time, start_time + len(eps))
    return TensorDict({"t": t, "episode": eps, ("next", "done"): done}, batch_size=[len(eps)])


def valid_starts(steps: TensorDict, capacity: int, length: int) -> set[int]:
    """Brute force: times s whose next ``length`` steps are retained and in one episode."""
    total = steps.batch_size[0]
    oldest = max(0, total - capacity)
    ep = steps["episode"]
    return {
        s for s in range(oldest, total - length + 1) if bool((ep[s : s + length] == ep[s]).all())
    }


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(5, 60),
    chunks=st.lists(st.lists(st.integers(1, 15), min_size=1, max_size=4), min_size=1, max_size=6),
    length=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_slices_stay_inside_episodes_over_wraparound(
    capacity: int, chunks: list[list[int]], length: int, seed: int
) -> None:
    sampler = SliceSampler(slice_len=length, generator=torch.Generator().manual_seed(seed))
    rb = ReplayBuffer(TensorStorage(capacity), sampler=sampler)
    written: list[TensorDict] = []
    time, episode = 0, 0
    for lengths in chunks:
        batch = episodes(lengths, time, episode)
        for start in range(0, batch.batch_size[0], capacity):  # extends of at most capacity
            rb.extend(batch[start : start + capacity])
        written.append(batch)
        time += batch.batch_size[0]
        episode += len(lengths)
    everything = torch.cat(written)
    expected = valid_starts(everything, capacity, length)
    if not expected:
        with pytest.raises(ValueError, match=f"no episode in the buffer has {length} steps"):
            rb.sample(length * 4)
        return
    batch = rb.sample(length * 64).reshape(64, length)
    t = batch["t"]
    assert bool((t.diff(dim=1) == 1).all())  # contiguous, in time order
    assert {int(s) for s in t[:, 0]} <= expected  # legal starts only
    assert bool((batch["episode"] == batch["episode"][:, :1]).all())
    assert batch["slice"].tolist() == [[i] * length for i in range(64)]


def test_every_valid_start_is_equally_likely() -> None:
    capacity, length = 40, 3
    # seeded: a chi-square bound at its 99.9% quantile fails one unseeded run in a thousand
    sampler = SliceSampler(slice_len=length, generator=torch.Generator().manual_seed(0))
    rb = ReplayBuffer(TensorStorage(capacity), sampler=sampler)
    steps = episodes([7, 2, 12, 9, 5, 11])  # 46 steps: wraps, oldest episode cut
    rb.extend(steps[:30])
    rb.extend(steps[30:])
    expected = sorted(valid_starts(steps, capacity, length))
    draws = 60_000
    starts = rb.sample(draws * length).reshape(draws, length)["t"][:, 0]
    counts = torch.bincount(starts - min(expected), minlength=len(expected) + 1)
    observed = {min(expected) + i: int(c) for i, c in enumerate(counts) if c}
    assert sorted(observed) == expected
    mean = draws / len(expected)
    chi2 = sum((c - mean) ** 2 / mean for c in observed.values())
    # retained t 6..45: pieces of 1, 2, 12, 9, 5, 11 steps -> 0 + 0 + 10 + 7 + 3 + 9 starts
    assert len(expected) == 29
    assert chi2 < 56.89  # 99.9% quantile, 28 degrees of freedom


def test_traj_key_gives_the_same_slices_as_done_flags() -> None:
    steps = episodes([6, 3, 8, 4])
    a = ReplayBuffer(
        TensorStorage(30),
        sampler=SliceSampler(slice_len=3, generator=torch.Generator().manual_seed(1)),
    )
    b = ReplayBuffer(
        TensorStorage(30),
        sampler=SliceSampler(
            slice_len=3, traj_key="episode", generator=torch.Generator().manual_seed(1)
        ),
    )
    for rb in (a, b):
        rb.extend(steps[:8])  # the episode of steps 6-8 straddles two extends
        for i in range(8, 21):
            rb.add(steps[i])
    assert torch.equal(a.sample(300)["t"], b.sample(300)["t"])


def test_non_strict_pads_short_episodes_with_a_mask() -> None:
    sampler = SliceSampler(slice_len=4, strict_length=False)
    rb = ReplayBuffer(TensorStorage(50), sampler=sampler)
    rb.extend(episodes([2, 6, 1]))
    batch = rb.sample(4 * 500).reshape(500, 4)
    mask, t = batch["mask"], batch["t"]
    short = t[:, 0] == 0  # the 2-step episode: steps 0, 1 then padding repeating step 1
    assert bool(short.any())
    assert t[short].tolist()[0] == [0, 1, 1, 1]
    assert mask[short].tolist()[0] == [True, True, False, False]
    single = t[:, 0] == 8
    assert mask[single].tolist()[0] == [True, False, False, False]
    full = ~short & ~single
    assert bool(mask[full].all()) and bool((t[full].diff(dim=1) == 1).all())
    assert set(t[full][:, 0].tolist()) == {2, 3, 4}


def test_num_slices_and_errors() -> None:
    rb = ReplayBuffer(TensorStorage(50), sampler=SliceSampler(num_slices=4))
    rb.extend(episodes([10, 10]))
    assert rb.sample(12).reshape(4, 3)["t"].diff(dim=1).eq(1).all()
    with pytest.raises(ValueError, match="batch_size 10 is not a multiple of num_slices 4"):
        rb.sample(10)
    with pytest.raises(ValueError, match="give exactly one of slice_len and num_slices"):
        SliceSampler(slice_len=2, num_slices=3)
    with pytest.raises(ValueError, match="slice_len must be a positive integer"):
        SliceSampler(slice_len=0)
    missing = ReplayBuffer(TensorStorage(10), sampler=SliceSampler(slice_len=2))
    with pytest.raises(ValueError, match=r"has no key \('next', 'done'\)"):
        missing.extend({"obs": torch.zeros(3, 2)})
    direct = SliceSampler(slice_len=2, data_source=TensorStorage(10))
    direct.on_write(torch.tensor([0, 1]), episodes([2]))
    with pytest.raises(ValueError, match="does not continue the time order"):
        direct.on_write(torch.tensor([5]), episodes([1]))


def test_index_of_a_reopened_storage(tmp_path: object) -> None:
    path = f"{tmp_path}/rb"
    rb = ReplayBuffer(MemmapStorage(20, path=path))
    steps = episodes([9, 8, 7])  # 24 steps into 20 slots: wraps
    rb.extend(steps[:12])
    rb.extend(steps[12:])
    rb.storage.close()  # type: ignore[attr-defined]
    again = ReplayBuffer(MemmapStorage.open(path), sampler=SliceSampler(slice_len=5))
    batch = again.sample(5 * 200).reshape(200, 5)
    assert {int(s) for s in batch["t"][:, 0]} <= valid_starts(steps, 20, 5)
    assert bool((batch["episode"] == batch["episode"][:, :1]).all())
    again.storage.close()  # type: ignore[attr-defined]


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    capacity=st.integers(5, 40),
    length=st.integers(1, 5),
    strict=st.booleans(),
    base=st.integers(0, 39),
    seed=st.integers(0, 2**16),
)
def test_kernel_draw_matches_the_reference(
    lengths: list[int], capacity: int, length: int, strict: bool, base: int, seed: int
) -> None:
    from rbdata.samplers import _slices

    time = sum(lengths)
    ends = torch.cumsum(torch.tensor(lengths), 0) - 1
    ends = ends[ends >= max(0, time - capacity)]
    cumsum, shift, stops = _slices.segments(ends.numpy(), time, capacity, length, strict)
    reference = _slices.segments_reference(ends, time, capacity, length, strict)
    for got, want in zip((cumsum, shift, stops), reference, strict=True):
        assert torch.equal(got, want)
    total = int(cumsum[-1])
    if total == 0:
        return
    r = torch.randint(total, (16,), generator=torch.Generator().manual_seed(seed))
    args = (cumsum, shift, stops, r, length, base % capacity, capacity, strict)
    fast, ref = _slices.draw(*args), _slices.draw_reference(*args)
    assert torch.equal(fast[0], ref[0])
    assert (fast[1] is None) == (ref[1] is None)
    if ref[1] is not None:
        assert torch.equal(fast[1], ref[1])  # type: ignore[arg-type]


def _index_state(sampler: SliceSampler) -> tuple[object, ...]:
    return (sampler._base, sampler._time, sampler._ends.tolist(), sampler._last_traj)


@pytest.mark.parametrize("traj", [False, True])
@pytest.mark.parametrize("form", ["python", "numpy", "tensor", "tensordict"])
def test_per_step_adds_index_episodes_like_one_extend(traj: bool, form: str) -> None:
    # the per-step path reads one flag directly; the reference indexes the same steps in
    # one extend (the general path), over a wrap-around of the ring
    cap, steps = 16, 40
    done = [t % 7 == 6 or t % 11 == 10 for t in range(steps)]
    episode = [sum(done[:t]) for t in range(steps)]  # id of each step's episode
    kwargs = {"traj_key": "episode"} if traj else {}

    def step(t: int) -> object:
        flag: object = episode[t] if traj else done[t]
        if form == "numpy":
            flag = np.int64(flag) if traj else np.bool_(flag)
        elif form in ("tensor", "tensordict"):
            flag = torch.tensor(flag)
        item = {"obs": np.full(2, t, np.float32), "next": {"done": done[t]}}
        if traj:
            item["episode"] = flag
        else:
            item["next"]["done"] = flag
        if form == "tensordict":
            return TensorDict(
                {k: torch.as_tensor(v) if not isinstance(v, dict) else v for k, v in item.items()},
                [],
            )
        return item

    rb = ReplayBuffer(TensorStorage(cap), sampler=SliceSampler(slice_len=2, **kwargs))
    for t in range(steps):
        rb.add(step(t))
    ref = ReplayBuffer(TensorStorage(cap), sampler=SliceSampler(slice_len=2, **kwargs))
    for t in range(0, steps, 8):  # the same steps in batches: the general path
        ref.extend(
            {
                "obs": np.repeat(np.arange(t, t + 8, dtype=np.float32)[:, None], 2, axis=1),
                "next": {"done": np.array(done[t : t + 8])},
                **({"episode": np.array(episode[t : t + 8])} if traj else {}),
            }
        )
    assert _index_state(rb.sampler) == _index_state(ref.sampler)


def test_a_per_step_flag_that_is_not_one_value_is_refused_like_a_batch() -> None:
    rb = ReplayBuffer(TensorStorage(8), sampler=SliceSampler(slice_len=2))
    rb.add({"obs": np.zeros(2, np.float32), "next": {"done": np.zeros(1, bool)}})
    before = _index_state(rb.sampler)
    with pytest.raises(ValueError, match="shape"):
        rb.add({"obs": np.zeros(2, np.float32), "next": {"done": np.zeros(2, bool)}})
    assert _index_state(rb.sampler) == before and len(rb) == 1


def test_a_list_of_items_with_ragged_or_string_fields(tmp_path: Path) -> None:
    """Found by the model-based test: the sampler stacked every key of a list of items to
    read the done flags, which fails on ragged or string fields the storage itself takes."""
    rb = ReplayBuffer(
        ArrowStorage(8, path=tmp_path / "a", ragged=["tok"]), sampler=SliceSampler(slice_len=2)
    )
    done = [False, True, False, False, True]
    rb.extend(
        [
            {"tok": torch.arange(k + 1), "note": f"step {k}", "next": {"done": torch.tensor([d])}}
            for k, d in enumerate(done)
        ]
    )
    assert len(rb) == 5
    assert [rb.storage[k]["note"] for k in range(5)] == [f"step {k}" for k in range(5)]
    starts = set()
    for _ in range(20):  # both episodes ([0, 1] and [2, 3, 4]) hold a slice of 2
        batch = rb.sample(4)
        idx = batch["index"].view(-1, 2)
        assert bool((idx[:, 1] == idx[:, 0] + 1).all())
        starts.update(idx[:, 0].tolist())
    assert starts == {0, 2, 3}  # brute force: the starts whose slice stays in one episode
    rb.storage.close()


def transitions(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"obs": torch.arange(start, start + n).float().unsqueeze(1)}, [n])


# --- a sampler that refuses a write refuses it before the write ---------------------
def _episodes(returns: list[float], start: int = 0) -> TensorDict:
    n = len(returns)
    return TensorDict(
        {
            "obs": torch.arange(start, start + n).float().unsqueeze(1),
            "ret": torch.tensor(returns, dtype=torch.float64),
            "next": {"done": torch.ones(n, 1, dtype=torch.bool)},
        },
        [n],
    )


@pytest.mark.parametrize("method", ["extend", "add"])
def test_slice_sampler_refusal_leaves_storage_writer_and_sampler_unchanged(method: str) -> None:
    rb = ReplayBuffer(TensorStorage(8), SliceSampler(slice_len=1), MaxValueWriter("ret"))
    rb.extend(_episodes([1, 2, 3, 4, 5, 6, 7, 0]))  # the lowest rank is in slot 7
    data = rb.storage[:].clone()
    writer_state = rb.writer.state_dict()
    sampler_state = rb.sampler.state_dict()
    new = _episodes([10.0], start=100)  # replaces slot 7; the time order expects slot 0
    with pytest.raises(ValueError, match="a write at slot 7 does not continue the time order"):
        if method == "extend":
            rb.extend(new)
        else:
            rb.add(new[0])
    assert len(rb) == 8
    stored = rb.storage[:]
    assert torch.equal(stored["obs"], data["obs"])  # slot 7 still holds obs 7
    assert torch.equal(stored["ret"], data["ret"])
    after = rb.writer.state_dict()
    assert torch.equal(after["ranks"], writer_state["ranks"])
    assert torch.equal(after["stamps"], writer_state["stamps"])
    assert (after["count"], after["next_stamp"]) == (
        writer_state["count"],
        writer_state["next_stamp"],
    )
    got = rb.sampler.state_dict()
    assert (got["time"], got["base"]) == (sampler_state["time"], sampler_state["base"])
    assert torch.equal(got["ends"], sampler_state["ends"])


def test_slice_sampler_missing_episode_key_writes_nothing() -> None:
    rb = ReplayBuffer(TensorStorage(8), SliceSampler(slice_len=2))
    with pytest.raises(ValueError, match=r"no key \('next', 'done'\)"):
        rb.extend(transitions(4))
    assert len(rb) == 0
    assert rb.writer.state_dict() == {"cursor": None}
    assert rb.sampler.state_dict()["time"] == 0


def test_first_write_refused_leaves_max_value_writer_unread() -> None:
    storage = TensorStorage(8)
    rb = ReplayBuffer(storage, SliceSampler(slice_len=1), MaxValueWriter("ret"))
    bad = TensorDict({"ret": torch.tensor([1.0, 2.0])}, [2])  # no ("next", "done")
    with pytest.raises(ValueError, match="no key"):
        rb.extend(bad)
    assert len(storage) == 0
    assert rb.writer.state_dict()["ranks"] is None  # still "not read yet"
