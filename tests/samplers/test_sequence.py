"""SequenceSampler against a per-record reference that walks the held steps one at a time.

The reference knows only what the test wrote: the absolute time of each step (stored as
``"t"``), its end flag, the capacity. It walks from an anchor one record at a time, stopping at
the ring's oldest or newest held step and (``"pad"``/``"stop"``) at an episode end.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from sampler_contract import SamplerContract, draws, same_draws
from tensordict import TensorDict
from torch.utils.data import DataLoader
from torchdata.nodes import Loader

from rbdata import BatchSampler, ReplayBuffer, SequenceSampler, TensorStorage
from rbdata.nodes import BufferSource
from rbdata.samplers import _sequences

BOUNDARIES = ("pad", "stop", "cross")
SHAPES = [(0, 1, 0, 1), (2, 3, 1, 1), (3, 2, 2, 2), (1, 4, 0, 3), (4, 1, 3, 1)]


# --- the per-record reference -----------------------------------------------------------------
class Ring:
    """What was written: episodes of random lengths into a ring of ``capacity`` slots."""

    def __init__(self, capacity: int, steps: int, seed: int, chunk: int = 7) -> None:
        rng = np.random.default_rng(seed)
        done = np.zeros(steps, bool)
        t = 0
        while t < steps:  # episode lengths 1..13
            t += int(rng.integers(1, 14))
            if t <= steps:
                done[t - 1] = True
        self.capacity, self.steps, self.done = capacity, steps, done
        self.episode = np.cumsum(np.concatenate([[0], done[:-1]]))
        self.chunk = chunk

    def extend(self, rb: ReplayBuffer) -> None:
        for start in range(0, self.steps, self.chunk):
            stop = min(start + self.chunk, self.steps)
            t = torch.arange(start, stop)
            done = torch.from_numpy(self.done[start:stop]).unsqueeze(1)
            ep = torch.from_numpy(self.episode[start:stop])
            rb.extend(TensorDict({"t": t, "ep": ep, "next": {"done": done}}, [stop - start]))

    @property
    def oldest(self) -> int:
        return max(0, self.steps - self.capacity)

    def step_ok(self, t: int, to: int, boundary: str) -> bool:
        """Whether one step from record ``t`` to its neighbour ``to`` stays allowed."""
        if to < self.oldest or to >= self.steps:
            return False
        return boundary == "cross" or not self.done[min(t, to)]

    def window(
        self, a: int, shape: tuple[int, int, int, int], boundary: str
    ) -> tuple[list[int], list[bool], list[bool]]:
        """Times, validity and learning flags of anchor ``a``'s window, record by record."""
        burn_in, length, bootstrap, dilation = shape
        out: dict[int, tuple[int | None, bool]] = {0: (a, True)}
        for direction, ks in ((-1, range(-1, -burn_in - 1, -1)), (1, range(1, length + bootstrap))):
            t, ok = a, True
            for k in ks:
                for _ in range(dilation):
                    if ok and self.step_ok(t, t + direction, boundary):
                        t += direction
                    else:
                        ok = False
                out[k] = (t if ok else None, ok)
        ks = list(range(-burn_in, length + bootstrap))
        valid = [out[k][1] for k in ks]
        first = next(out[k][0] for k in ks if out[k][1])
        last = [out[k][0] for k in ks if out[k][1]][-1]
        times, seen = [], False
        for k in ks:
            time, ok = out[k]
            seen |= ok
            times.append(time if ok else (last if seen else first))
        learn = [v and 0 <= k < length for v, k in zip(valid, ks, strict=True)]
        return times, valid, learn  # type: ignore[return-value]

    def anchors(self, shape: tuple[int, int, int, int], boundary: str) -> list[int]:
        held = range(self.oldest, self.steps)
        if boundary != "stop":
            return list(held)
        length = shape[1]
        return [
            a for a in held if all(self.window(a, shape, boundary)[2][shape[0] : shape[0] + length])
        ]


def _buffer(
    ring: Ring, shape: tuple[int, int, int, int], boundary: str, seed: int = 0, **kwargs: Any
) -> tuple[ReplayBuffer, SequenceSampler]:
    burn_in, length, bootstrap, dilation = shape
    sampler = SequenceSampler(
        length=length,
        burn_in=burn_in,
        bootstrap=bootstrap,
        dilation=dilation,
        boundary=boundary,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )
    rb = ReplayBuffer(TensorStorage(ring.capacity), sampler=sampler)
    ring.extend(rb)
    return rb, sampler


def _times_of(rb: ReplayBuffer, index: torch.Tensor) -> list[int]:
    return rb.storage.__getitems__(index)["t"].tolist()


# --- windows against the reference -------------------------------------------------------------
@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("capacity", "steps"), [(40, 23), (40, 40), (32, 83)])
@pytest.mark.parametrize("traj", [False, True])
def test_windows_match_the_reference(
    boundary: str, shape: tuple[int, int, int, int], capacity: int, steps: int, traj: bool
) -> None:
    ring = Ring(capacity, steps, seed=capacity + steps + sum(shape))
    extra = {"traj_key": "ep"} if traj else {}
    rb, sampler = _buffer(ring, shape, boundary, **extra)
    want_anchors = ring.anchors(shape, boundary)
    assert _times_of(rb, sampler.anchors()) == want_anchors
    width = sampler.window
    every = sampler.anchors().tolist()
    for chunk in (every[i : i + 8] for i in range(0, len(every), 8)):
        index, valid, learn = sampler.windows(torch.tensor(chunk))
        times = _times_of(rb, index)
        for i, slot in enumerate(chunk):
            a = _times_of(rb, torch.tensor([slot]))[0]
            ref = ring.window(a, shape, boundary)
            row = slice(i * width, (i + 1) * width)
            assert times[row] == ref[0], (a, boundary)
            assert valid[row].tolist() == ref[1]
            assert learn[row].tolist() == ref[2]


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("prioritized", [None, (0.8, 0.5)])
def test_drawn_windows_match_the_reference(boundary: str, prioritized: Any) -> None:
    shape = (3, 4, 2, 2)
    ring = Ring(48, 131, seed=5)
    rb, sampler = _buffer(ring, shape, boundary, prioritized=prioritized)
    batch = rb.sample(16 * sampler.window).reshape(16, -1)
    valid_anchors = set(ring.anchors(shape, boundary))
    for row in batch.unbind(0):
        a = int(row["t"][shape[0]])
        assert a in valid_anchors
        times, valid, learn = ring.window(a, shape, boundary)
        assert row["t"].tolist() == times
        assert row["validity_mask"].tolist() == valid
        assert row["learning_mask"].tolist() == learn
        assert (row["index"] == row["index"][shape[0]]).any()
    assert batch["slice"][:, 0].tolist() == list(range(16))
    assert ("weight" in batch.keys()) == (prioritized is not None)


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_numba_kernel_matches_the_torch_reference(boundary: str) -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        capacity = int(rng.integers(5, 60))
        time = int(rng.integers(1, 3 * capacity))
        oldest = max(0, time - capacity)
        ends = np.unique(rng.integers(oldest, time, size=int(rng.integers(0, 8))))
        anchors = rng.integers(oldest, time, size=6)
        shape = tuple(
            int(v)
            for v in (
                rng.integers(0, 4),
                rng.integers(1, 5),
                rng.integers(0, 3),
                rng.integers(1, 4),
            )
        )
        base = int(rng.integers(0, capacity))
        got = _sequences.windows(ends, time, capacity, base, anchors, shape, boundary)  # type: ignore[arg-type]
        want = _sequences.windows_reference(
            torch.from_numpy(ends),
            time,
            capacity,
            base,
            torch.from_numpy(anchors),
            shape,
            boundary,  # type: ignore[arg-type]
        )
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)


# --- anchor frequencies -------------------------------------------------------------------------
def _chi2_ok(counts: np.ndarray, expected: np.ndarray) -> bool:
    """A chi-square statistic within ~6 standard deviations of its mean (never flaky)."""
    stat = float(((counts - expected) ** 2 / expected).sum())
    df = len(counts) - 1
    return stat < df + 6 * math.sqrt(2 * df) + 10


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_uniform_anchor_frequencies(boundary: str) -> None:
    shape = (2, 5, 1, 1)
    ring = Ring(40, 97, seed=11)
    rb, sampler = _buffer(ring, shape, boundary)
    anchors = ring.anchors(shape, boundary)
    draws_ = 400 * len(anchors)
    index, _ = sampler.draw(draws_ * sampler.window)
    drawn = _times_of(rb, index.view(draws_, -1)[:, shape[0]])
    counts = np.array([drawn.count(a) for a in anchors], float)
    assert counts.sum() == draws_  # no anchor outside the valid ones
    assert _chi2_ok(counts, np.full(len(anchors), draws_ / len(anchors)))


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_prioritized_anchor_frequencies_and_weights(boundary: str) -> None:
    shape, alpha, beta = (1, 4, 1, 1), 0.7, 0.4
    ring = Ring(40, 93, seed=13)
    rb, sampler = _buffer(ring, shape, boundary, prioritized=(alpha, beta))
    p = torch.rand(len(rb), generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 0.1
    rb.update_priority(torch.arange(len(rb)), p)
    t_of_slot = rb.storage.__getitems__(torch.arange(len(rb)))["t"].tolist()
    prio = {t: float(p[s]) for s, t in enumerate(t_of_slot)}
    anchors = ring.anchors(shape, boundary)
    v = np.array([(prio[a] + 1e-8) ** alpha for a in anchors])
    draws_ = 400 * len(anchors)
    index, extras = sampler.draw(draws_ * sampler.window)
    drawn = _times_of(rb, index.view(draws_, -1)[:, shape[0]])
    counts = np.array([drawn.count(a) for a in anchors], float)
    assert counts.sum() == draws_
    assert _chi2_ok(counts, draws_ * v / v.sum())
    weight = extras["weight"].view(draws_, -1)
    assert bool((weight == weight[:, :1]).all())  # one weight per window
    want = torch.tensor([((prio[a] + 1e-8) ** alpha / v.min()) ** -beta for a in drawn])
    torch.testing.assert_close(weight[:, 0].double(), want, rtol=1e-4, atol=1e-6)


def test_priorities_are_per_item_and_new_items_get_the_max() -> None:
    ring = Ring(30, 20, seed=2)
    rb, sampler = _buffer(ring, (2, 3, 1, 1), "stop", prioritized=(1.0, 0.5))
    rb.update_priority([4, 5, 4], [2.0, 7.0, 3.0])  # of duplicates, the last wins
    assert sampler.priorities([4, 5, 6]).tolist() == [3.0, 7.0, 1.0]
    rb.update_priority(torch.tensor([0, 1]), 0.5)  # one priority for all
    assert sampler.priorities([0, 1]).tolist() == [0.5, 0.5]
    rb.extend(
        TensorDict(
            {
                "t": torch.arange(20, 23),
                "ep": torch.zeros(3, dtype=torch.long),
                "next": {"done": torch.zeros(3, 1, dtype=torch.bool)},
            },
            [3],
        )
    )
    assert sampler.priorities([20, 21, 22]).tolist() == [7.0, 7.0, 7.0]
    for index, priority, error in [
        ([99], [1.0], ValueError),
        ([1], [float("nan")], ValueError),
        ([1], [-1.0], ValueError),
        ([1, 2], [1.0, 2.0, 3.0], ValueError),
        (torch.tensor([1.0]), [1.0], TypeError),
    ]:
        before = sampler.priorities()
        with pytest.raises(error):
            rb.update_priority(index, priority)
        assert torch.equal(sampler.priorities(), before)
    uniform_rb, _ = _buffer(ring, (0, 2, 0, 1), "pad")
    with pytest.raises(TypeError, match="prioritized="):
        uniform_rb.update_priority([0], [1.0])


# --- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"length": 0}, "length"),
        ({"length": 2.0}, "length"),
        ({"length": 2, "burn_in": -1}, "burn_in"),
        ({"length": 2, "bootstrap": -1}, "bootstrap"),
        ({"length": 2, "dilation": 0}, "dilation"),
        ({"length": 2, "boundary": "wrap"}, "boundary"),
        ({"length": 2, "prioritized": 0.5}, "prioritized"),
        ({"length": 2, "prioritized": (0.5, -1)}, "prioritized"),
        ({}, "length"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        SequenceSampler(**kwargs)


def test_bad_calls_are_refused() -> None:
    with pytest.raises(TypeError, match="length=4"):
        SequenceSampler(4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="boundary="):
        SequenceSampler(length=4, episode_boundary="pad")  # type: ignore[call-arg]
    ring = Ring(30, 20, seed=1)
    rb, sampler = _buffer(ring, (1, 2, 0, 1), "stop")
    with pytest.raises(ValueError, match="multiple of the window"):
        rb.sample(4)
    not_anchor = sorted(set(range(20)) - set(sampler.anchors().tolist()))[0]
    with pytest.raises(ValueError, match="not a valid anchor"):
        sampler.windows([not_anchor])
    with pytest.raises(ValueError, match="not a valid anchor"):
        sampler.windows([25])  # an unwritten slot
    with pytest.raises(TypeError, match="anchor"):
        sampler.windows(torch.tensor([1.0]))
    long_rb, _ = _buffer(ring, (0, 12, 0, 1), "stop")
    with pytest.raises(ValueError, match="no episode in the buffer has the 12 steps"):
        long_rb.sample(12)


# --- contract, resume, pipelines ----------------------------------------------------------------
class TestSequenceSampler(SamplerContract):
    def make(self, generator: torch.Generator | None, capacity: int = 16) -> Any:
        return SequenceSampler(length=1, burn_in=1, bootstrap=2, generator=generator)


class TestPrioritizedSequenceSampler(SamplerContract):
    def make(self, generator: torch.Generator | None, capacity: int = 16) -> Any:
        return SequenceSampler(
            length=2, boundary="stop", prioritized=(0.6, 0.4), generator=generator
        )


@pytest.mark.parametrize("prioritized", [None, (0.6, 0.4)])
def test_resume_draws_as_uninterrupted(prioritized: Any) -> None:
    ring = Ring(32, 71, seed=4)
    rb, sampler = _buffer(ring, (2, 3, 1, 2), "pad", seed=9, prioritized=prioritized)
    if prioritized:
        rb.update_priority(torch.arange(len(rb)), torch.arange(len(rb)) % 5 + 1.0)
    width = sampler.window
    draws(sampler, 3, 4 * width)
    state = sampler.state_dict()
    rest = draws(sampler, 5, 4 * width)
    _, twin = _buffer(ring, (2, 3, 1, 2), "pad", seed=123, prioritized=prioritized)
    twin.load_state_dict(state)
    assert same_draws(draws(twin, 5, 4 * width), rest)
    if prioritized:
        assert torch.equal(twin.priorities(), sampler.priorities())


def test_dataloader_batches_carry_the_masks() -> None:
    ring = Ring(64, 50, seed=6)
    rb, sampler = _buffer(ring, (2, 3, 1, 1), "stop", seed=1)
    _, twin = _buffer(ring, (2, 3, 1, 1), "stop", seed=1)
    loader = DataLoader(
        rb.storage,
        batch_sampler=BatchSampler(sampler, 3 * sampler.window, 4),
        collate_fn=lambda b: b,
    )
    got = list(loader)
    want = draws(twin, 4, 3 * twin.window)
    assert len(got) == 4
    for batch, (index, extras) in zip(got, want, strict=True):
        assert torch.equal(batch["index"], index)
        assert torch.equal(batch["validity_mask"], extras["validity_mask"])
        assert torch.equal(batch["learning_mask"], extras["learning_mask"])
        assert torch.equal(batch["t"], rb.storage.__getitems__(index)["t"])


@pytest.mark.usefixtures("collect_pipelines")
@pytest.mark.parametrize("prioritized", [None, (0.6, 0.4)])
def test_nodes_batches_are_the_buffers_samples(prioritized: Any) -> None:
    ring = Ring(64, 90, seed=8)
    rb, sampler = _buffer(ring, (1, 2, 1, 1), "cross", seed=2, prioritized=prioritized)
    twin_rb, _ = _buffer(ring, (1, 2, 1, 1), "cross", seed=2, prioritized=prioritized)
    size = 5 * sampler.window
    got = list(Loader(BufferSource(rb, batch_size=size, num_batches=3)))
    for batch in got:
        want = twin_rb.sample(size)
        assert sorted(batch.keys(True, True), key=str) == sorted(want.keys(True, True), key=str)
        for key in want.keys(True, True):
            assert torch.equal(batch[key], want[key])
        assert not bool((batch["learning_mask"] & ~batch["validity_mask"]).any())


@pytest.mark.parametrize("prioritized", [None, (0.6, 0.4)])
def test_checkpoint_round_trip_continues_the_draws(tmp_path: Any, prioritized: Any) -> None:
    ring = Ring(32, 57, seed=12)
    rb, sampler = _buffer(ring, (2, 2, 1, 1), "stop", seed=4, prioritized=prioritized)
    if prioritized:
        rb.update_priority(torch.arange(len(rb)), torch.arange(len(rb)) % 3 + 0.5)
    rb.sample(2 * sampler.window)
    rb.dumps(tmp_path / "ckpt")
    again = ReplayBuffer.loads(tmp_path / "ckpt")
    assert isinstance(again.sampler, SequenceSampler)
    assert again.sampler.config() == sampler.config()
    for _ in range(3):
        want, got = rb.sample(4 * sampler.window), again.sample(4 * sampler.window)
        for key in want.keys(True, True):
            assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("prioritized", [None, (0.6, 0.4)])
def test_empty_forgets_the_episodes_and_priorities(prioritized: Any) -> None:
    ring = Ring(40, 33, seed=3)
    rb, sampler = _buffer(ring, (1, 3, 1, 1), "stop", prioritized=prioritized)
    if prioritized:
        rb.update_priority(torch.arange(len(rb)), 5.0)
    rb.empty()
    fresh = Ring(40, 21, seed=17)
    fresh.extend(rb)
    assert _times_of(rb, sampler.anchors()) == fresh.anchors((1, 3, 1, 1), "stop")
    batch = rb.sample(8 * sampler.window).reshape(8, -1)
    for row in batch.unbind(0):
        times, valid, _ = fresh.window(int(row["t"][1]), (1, 3, 1, 1), "stop")
        assert row["t"].tolist() == times and row["validity_mask"].tolist() == valid
    if prioritized:
        assert sampler.priorities(torch.arange(21)).tolist() == [1.0] * 21


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("prioritized", [None, (0.6, 0.4)])
def test_cuda_storage_draws_as_a_cpu_one(prioritized: Any) -> None:
    ring = Ring(32, 45, seed=21)
    rbs = []
    for device in ("cpu", "cuda"):
        sampler = SequenceSampler(
            length=3,
            burn_in=2,
            bootstrap=1,
            prioritized=prioritized,
            generator=torch.Generator().manual_seed(5),
        )
        rb = ReplayBuffer(TensorStorage(32, device=device), sampler=sampler)
        ring.extend(rb)
        rbs.append(rb)
    for _ in range(3):
        want, got = (rb.sample(4 * 6) for rb in rbs)
        assert got["t"].device.type == "cuda"
        for key in ("t", "index", "validity_mask", "learning_mask"):
            assert torch.equal(got[key].cpu(), want[key]), key
