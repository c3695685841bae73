"""``NStepReturn`` against a per-item brute force and against SB3's ``NStepReplayBuffer``."""

from __future__ import annotations

import pickle
import random
import threading

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rbdata import ArrowStorage, ListStorage, MemmapStorage, ReplayBuffer, TensorStorage
from rbdata.errors import MissingKeyError
from rbdata.storages.frames import FrameStackStorage
from rbdata.transforms import NStepReturn
from rbdata.transforms.nstep import nstep_windows

STACK, SIDE = 2, 4


def frame(t: int) -> torch.Tensor:
    """The frame of time ``t`` (``t`` written in its first two pixels, the rest varied)."""
    f = torch.full((SIDE, SIDE), (7 * t) % 256, dtype=torch.uint8)
    f[0, 0], f[0, 1] = t % 256, t // 256
    return f


class Steps:
    """Every step ever written, per field, and which slot holds which step (brute force)."""

    def __init__(self, capacity: int, frames: bool = False, cut_without_done: bool = False):
        self.capacity, self.frames, self.cut_without_done = capacity, frames, cut_without_done
        self.reward: list[float] = []
        self.terminated: list[bool] = []
        self.truncated: list[bool] = []
        self.slot_time: dict[int, int] = {}

    @property
    def done(self) -> list[bool]:
        """Gymnasium's done: terminated or truncated (but see ``cut_without_done``)."""
        if self.cut_without_done:  # truncations that do not set done (they still end windows)
            return list(self.terminated)
        return [a or b for a, b in zip(self.terminated, self.truncated, strict=True)]

    def obs(self, t: int) -> torch.Tensor:
        if self.frames:
            return torch.stack([frame(max(t - STACK + 1 + j, 0) + 1000) for j in range(STACK)])
        return torch.tensor([float(t), -float(t)])

    def write(self, rng: random.Random, count: int, p_end: float = 0.2) -> TensorDict:
        start = len(self.reward)
        for t in range(start, start + count):
            self.reward.append(round(rng.uniform(-2, 2), 3))
            self.terminated.append(rng.random() < p_end)
            self.truncated.append(rng.random() < p_end / 2)
            self.slot_time[t % self.capacity] = t
        times = range(start, start + count)
        done = self.done
        col = lambda values: torch.tensor([values[t] for t in times]).reshape(count, 1)  # noqa: E731
        return TensorDict(
            {
                "observation": torch.stack([self.obs(t) for t in times]),
                "action": torch.tensor([float(t) for t in times]),
                "next": {
                    "observation": torch.stack([self.obs(t + 1) for t in times]),
                    "reward": col(self.reward).float(),
                    "done": col(done),
                    "terminated": col(self.terminated),
                    "truncated": col(self.truncated),
                },
            },
            batch_size=[count],
        )

    def expected(self, slot: int, n: int, gamma: float, truncations: bool = True) -> dict:
        """The n-step transition of the step at ``slot``, one step at a time."""
        t = self.slot_time[slot]
        newest, done = len(self.reward) - 1, self.done
        total, k = 0.0, 0
        for i in range(n):
            if t + i > newest:
                break
            total += gamma**i * self.reward[t + i]
            k += 1
            if done[t + i] or (truncations and self.truncated[t + i]):
                break
        last = t + k - 1
        return {
            "reward": total,
            "steps": k,
            "done": done[last],
            "terminated": self.terminated[last],
            "truncated": self.truncated[last],
            "next_obs": self.obs(last + 1),
            "obs": self.obs(t),
        }


def fill(rb: ReplayBuffer, model: Steps, seed: int, count: int, p_end: float = 0.2) -> None:
    """Write ``count`` random steps in chunks of at most half the capacity."""
    rng = random.Random(seed)
    while count > 0:
        chunk = min(count, rng.randint(1, model.capacity // 2))
        rb.extend(model.write(rng, chunk, p_end))
        count -= chunk


def make_storage(kind: str, capacity: int, tmp_path):
    if kind == "tensor":
        return TensorStorage(capacity)
    if kind == "memmap":
        return MemmapStorage(capacity, tmp_path / "memmap")
    if kind == "list":
        return ListStorage(capacity)
    if kind == "arrow":
        return ArrowStorage(capacity, tmp_path / "arrow", chunk_size=8)
    return FrameStackStorage(capacity, stack=STACK)


def check_batch(batch: TensorDict, model: Steps, index: torch.Tensor, n: int, gamma: float):
    for i, slot in enumerate(index.tolist()):
        want = model.expected(slot, n, gamma)
        got_reward = float(batch["next", "reward"][i, 0])
        assert got_reward == pytest.approx(want["reward"], rel=1e-5, abs=1e-5), (slot, want)
        assert int(batch["next", "steps"][i, 0]) == want["steps"]
        assert batch["next", "steps"].dtype == torch.int64
        for key in ("done", "terminated", "truncated"):
            assert bool(batch["next", key][i, 0]) == want[key], (key, slot)
        assert torch.equal(batch["next", "observation"][i], want["next_obs"])
        assert torch.equal(batch["observation"][i], want["obs"])  # the first step's, kept
        assert float(batch["action"][i]) == model.slot_time[slot]


KINDS = ["tensor", "memmap", "list", "arrow", "frames"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 3, 5])
def test_against_brute_force_on_every_storage_through_the_ring(kind: str, n: int, tmp_path):
    capacity, gamma = 23, 0.9
    storage = make_storage(kind, capacity, tmp_path)
    model = Steps(capacity, frames=kind == "frames")
    rb = ReplayBuffer(storage, transform=NStepReturn(storage, n, gamma))
    rng = random.Random(n)
    for _round in range(10):  # writes of every size through the ring, running episodes
        rb.extend(model.write(rng, rng.randint(1, 17)))
        batch = rb.sample(40)
        check_batch(batch, model, batch["index"], n, gamma)
        every = torch.arange(len(storage))  # every step, the ring's seam and newest included
        check_batch(rb.transform(storage[every].set("index", every)), model, every, n, gamma)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_n1_leaves_every_value_as_sampled_and_n_windows_hold(n: int) -> None:
    capacity = 30
    storage = TensorStorage(capacity)
    model = Steps(capacity)
    rb = ReplayBuffer(storage)
    fill(rb, model, 0, 45)
    index = torch.arange(capacity)
    plain = storage[index].set("index", index)
    batch = NStepReturn(storage, n, 0.5)(plain.clone())
    if n == 1:
        assert batch["next", "steps"].tolist() == [[1]] * capacity
        for key in plain.keys(True, True):
            assert torch.equal(batch[key], plain[key]), key
    else:
        k = batch["next", "steps"].squeeze(1)
        assert int(k.max()) <= n and int(k.min()) >= 1
        assert bool((k > 1).any())


def test_truncations_without_done_end_windows_and_can_be_ignored() -> None:
    capacity, n, gamma = 40, 4, 0.8
    storage = TensorStorage(capacity)
    model = Steps(capacity, cut_without_done=True)
    fill(ReplayBuffer(storage), model, 5, 55, p_end=0.3)
    index = torch.arange(capacity)
    batch = NStepReturn(storage, n, gamma)(storage[index].set("index", index))
    check_batch(batch, model, index, n, gamma)
    ignored = NStepReturn(storage, n, gamma, truncated_key=None)
    batch = ignored(storage[index].set("index", index))
    for i, slot in enumerate(index.tolist()):
        want = model.expected(slot, n, gamma, truncations=False)
        assert int(batch["next", "steps"][i, 0]) == want["steps"]
        assert float(batch["next", "reward"][i, 0]) == pytest.approx(want["reward"], abs=1e-5)


@pytest.mark.parametrize("in_place", [False, True])
def test_the_cpu_path_equals_the_general_path(in_place: bool, monkeypatch) -> None:
    capacity, n = 57, 5
    storage = TensorStorage(capacity)
    model = Steps(capacity)
    rb = ReplayBuffer(storage)
    rng = random.Random(2)
    fast = NStepReturn(storage, n, 0.97)
    general = NStepReturn(storage, n, 0.97)
    monkeypatch.setattr(general._cpu, "apply", lambda *args: None)  # the general path only
    for _round in range(8):
        rb.extend(model.write(rng, rng.randint(1, 40)))
        index = torch.randint(len(storage), (64,))
        plain = storage[index].set("index", index)
        kept = plain.clone()
        probe = plain.clone()  # the CPU path takes this batch (it returns None where it does not)
        assert fast._cpu.apply(probe, fast.ends, False)
        got = fast.on_sampled(plain) if in_place else fast(plain)
        if not in_place:
            assert (got is plain) and torch.equal(plain["index"], kept["index"])
        want = general(kept.clone())
        assert set(got.keys(True, True)) == set(want.keys(True, True))
        for key in want.keys(True, True):
            assert torch.equal(got[key], want[key]), key


def test_nstep_windows_against_a_loop() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        time = int(rng.integers(1, 60))
        ends = np.sort(rng.choice(time, size=int(rng.integers(0, time + 1)), replace=False))
        cuts = np.sort(rng.choice(time, size=int(rng.integers(0, min(5, time) + 1)), replace=False))
        n = int(rng.integers(1, 7))
        t = rng.integers(0, time, size=30)
        last, k = nstep_windows(t, n, time, ends, cuts)
        stops = set(ends.tolist()) | set(cuts.tolist()) | {time - 1}
        for i, ti in enumerate(t.tolist()):
            u = ti
            while u not in stops and u - ti < n - 1:
                u += 1
            assert (last[i], k[i]) == (u, u - ti + 1)


def sb3_buffer(capacity: int, n: int, gamma: float, timeouts: bool):
    from gymnasium import spaces
    from stable_baselines3.common.buffers import NStepReplayBuffer

    box = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    return NStepReplayBuffer(
        capacity, box, spaces.Box(-1, 1, (1,), np.float32), device="cpu", n_envs=1,
        handle_timeout_termination=timeouts, n_steps=n, gamma=gamma,
    )  # fmt: skip


@pytest.mark.parametrize("timeouts", [True, False])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_against_sb3_nstep_replay_buffer(n: int, timeouts: bool) -> None:
    """The same steps in SB3's buffer and ours: the same returns, flags and next observations
    at the same slots (SB3's ``dones`` are ``done * (1 - timeout)`` of the window's last step,
    its ``discounts`` ``gamma ** k``)."""
    pytest.importorskip("stable_baselines3")
    capacity, gamma = 37, 0.95
    sb3 = sb3_buffer(capacity, n, gamma, timeouts)
    storage = TensorStorage(capacity)
    ours = NStepReturn(storage, n, gamma, truncated_key=("next", "truncated") if timeouts else None)
    rb = ReplayBuffer(storage, transform=ours)
    model = Steps(capacity)
    rng = random.Random(n + 10 * timeouts)
    for _round in range(6):
        td = model.write(rng, rng.randint(5, 30))
        rb.extend(td)
        for i in range(td.batch_size[0]):
            obs = td["observation"][i].numpy()[None]
            nxt = td["next", "observation"][i].numpy()[None]
            done, cut = bool(td["next", "done"][i, 0]), bool(td["next", "truncated"][i, 0])
            sb3.add(obs, nxt, np.zeros((1, 1), np.float32), td["next", "reward"][i].numpy(),
                    np.array([done]), [{"TimeLimit.truncated": cut}])  # fmt: skip
        slots = np.arange(len(storage))
        want = sb3._get_samples(slots)
        index = torch.from_numpy(slots)
        got = ours(storage[index].set("index", index))
        steps = got["next", "steps"].double()
        torch.testing.assert_close(got["next", "reward"], want.rewards, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gamma**steps, want.discounts.double(), rtol=1e-6, atol=0)
        torch.testing.assert_close(got["next", "observation"], want.next_observations)
        torch.testing.assert_close(got["observation"], want.observations)
        flag = got["next", "done"]
        if timeouts:
            flag = flag & ~got["next", "truncated"]
        assert torch.equal(flag.float(), want.dones)


def test_through_a_buffer_iterator_threads_and_pickle(tmp_path) -> None:
    capacity, n, gamma = 50, 3, 0.9
    storage = TensorStorage(capacity)
    model = Steps(capacity)
    transform = NStepReturn(storage, n, gamma)
    rb = ReplayBuffer(storage, transform=transform, batch_size=16)
    fill(rb, model, 1, 70)
    batch = next(iter(rb))
    check_batch(batch, model, batch["index"], n, gamma)
    copy = pickle.loads(pickle.dumps(transform))  # the storage travels with it
    index = torch.arange(capacity)
    want = transform(storage[index].set("index", index))
    got = copy(copy.storage[index].set("index", index))
    for key in want.keys(True, True):
        assert torch.equal(got[key], want[key]), key
    assert transform.state_dict() == {}
    transform.load_state_dict({})  # the episodes are read again from the storage
    batch = rb.sample(30)
    check_batch(batch, model, batch["index"], n, gamma)
    errors: list[BaseException] = []

    def sample() -> None:
        try:
            for _ in range(50):
                b = rb.sample(32)
                check_batch(b, model, b["index"], n, gamma)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=sample) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


def test_helpful_errors() -> None:
    storage = TensorStorage(10)
    with pytest.raises(ValueError, match="n must be at least 1"):
        NStepReturn(storage, 0, 0.9)
    with pytest.raises(TypeError, match="n must be an int"):
        NStepReturn(storage, 2.0, 0.9)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma must be in"):
        NStepReturn(storage, 3, 1.5)
    with pytest.raises(TypeError, match="gamma must be a number"):
        NStepReturn(storage, 3, "0.9")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reward_key"):
        NStepReturn(storage, 3, 0.9, reward_key=3)  # type: ignore[arg-type]
    transform = NStepReturn(storage, 3, 0.9)
    with pytest.raises(TypeError, match="TensorDict"):
        transform(torch.zeros(3))
    td = TensorDict({"next": {"reward": torch.zeros(2, 1), "done": torch.zeros(2, 1)}}, [2])
    with pytest.raises(MissingKeyError, match="'index'"):
        transform(td)
    td["index"] = torch.arange(2)
    with pytest.raises(ValueError, match="empty"):
        transform(td.clone())
    ReplayBuffer(storage).extend(Steps(10).write(random.Random(0), 5))
    with pytest.raises(MissingKeyError, match="done_key"):
        NStepReturn(storage, 3, 0.9, done_key=("next", "over"))(storage[torch.arange(2)].set(
            "index", torch.arange(2)))  # fmt: skip
    bad = storage[torch.arange(2)].set("index", torch.tensor([0, 99]))
    with pytest.raises(IndexError):
        transform(bad)


@pytest.mark.parametrize("kind", ["tensor", "frames"])
def test_dataloader_batches_with_their_index(kind: str, tmp_path) -> None:
    """``DataLoader(storage, batch_sampler=BatchSampler(...))`` batches carry ``"index"``:
    the transform turns them as it turns ``rb.sample`` batches."""
    from torch.utils.data import DataLoader

    from rbdata import BatchSampler, UniformSampler

    capacity, n, gamma = 40, 3, 0.9
    storage = make_storage(kind, capacity, tmp_path)
    model = Steps(capacity, frames=kind == "frames")
    fill(ReplayBuffer(storage), model, 4, 60)
    transform = NStepReturn(storage, n, gamma)
    loader = DataLoader(storage, batch_sampler=BatchSampler(UniformSampler(storage), 16, 5))
    seen = 0
    for batch in loader:
        check_batch(transform(batch), model, batch["index"], n, gamma)
        seen += 1
    assert seen == 5


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_storage_takes_the_general_path_against_brute_force() -> None:
    capacity, n, gamma = 29, 4, 0.9
    storage = TensorStorage(capacity, device="cuda")
    model = Steps(capacity)
    rb = ReplayBuffer(storage, transform=NStepReturn(storage, n, gamma))
    fill(rb, model, 6, 50)
    batch = rb.sample(64)
    assert batch["next", "reward"].is_cuda and batch["next", "steps"].is_cuda
    check_batch(batch.cpu(), model, batch["index"].cpu(), n, gamma)


@pytest.mark.parametrize("kind", ["tensor", "memmap", "frames"])
def test_the_storage_is_never_written(kind: str, tmp_path) -> None:
    """``on_sampled`` writes the sampled batch in place: never the storage's own memory."""
    capacity = 31
    storage = make_storage(kind, capacity, tmp_path)
    rb = ReplayBuffer(storage, transform=NStepReturn(storage, 4, 0.5))
    fill(rb, Steps(capacity, frames=kind == "frames"), 8, 45)
    every = torch.arange(capacity)
    before = storage[every].clone()
    for _ in range(20):
        rb.sample(64)
    after = storage[every]
    for key in before.keys(True, True):
        assert torch.equal(after[key], before[key]), key
