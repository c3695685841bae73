"""``rbdata.compat.sb3`` against Stable-Baselines3's own ``ReplayBuffer`` (the reference)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

gym_spaces = pytest.importorskip("gymnasium.spaces")
sb3_buffers = pytest.importorskip("stable_baselines3.common.buffers")

from rbdata import MemmapStorage, TensorStorage  # noqa: E402
from rbdata.compat.sb3 import (  # noqa: E402
    PrioritizedReplayBuffer,
    ReplayBuffer,
    ReplayBufferSamples,
)
from rbdata.errors import EmptyBufferError  # noqa: E402

SPACES = {
    "box": (
        gym_spaces.Box(-5, 5, (3, 2), dtype=np.float32),
        gym_spaces.Box(-1, 1, (2,), dtype=np.float64),  # stored as float32, as SB3
    ),
    "discrete": (gym_spaces.Discrete(7), gym_spaces.Discrete(3)),
    "multi": (gym_spaces.MultiBinary(4), gym_spaces.MultiDiscrete([3, 4])),
}
FIELDS = ReplayBufferSamples._fields[:5]


def _step(rng: np.random.Generator, obs_space: Any, act_space: Any, n: int, timeouts: bool):
    """One random SB3-style step of ``n`` envs (obs, next_obs, action, reward, done, infos)."""
    obs_space.seed(int(rng.integers(1 << 30)))
    act_space.seed(int(rng.integers(1 << 30)))
    obs = np.stack([obs_space.sample() for _ in range(n)])
    nxt = np.stack([obs_space.sample() for _ in range(n)])
    action = np.stack([act_space.sample() for _ in range(n)])
    reward = rng.standard_normal(n).astype(np.float32)
    done = rng.random(n) < 0.3
    cut = done & (rng.random(n) < 0.5) if timeouts else np.zeros(n, bool)
    infos = [{"TimeLimit.truncated": bool(c)} if c or i % 2 else {} for i, c in enumerate(cut)]
    return obs, nxt, action, reward, done, infos


def _both(kind: str, n: int, timeouts: bool, optimize: bool, slots: int = 6, **kw: Any):
    obs_space, act_space = SPACES[kind]
    args = (slots * n, obs_space, act_space, "cpu", n, optimize, timeouts)
    return sb3_buffers.ReplayBuffer(*args), ReplayBuffer(*args, **kw)


def _draw_as_sb3(sb3: Any, batch: int) -> np.ndarray:
    """SB3's ``batch_inds`` for the current state (its ``sample`` formula)."""
    if sb3.optimize_memory_usage and sb3.full:
        return (np.random.randint(1, sb3.buffer_size, size=batch) + sb3.pos) % sb3.buffer_size
    return np.random.randint(0, sb3.buffer_size if sb3.full else sb3.pos, size=batch)


def _add_same(
    buffers: tuple[Any, ...],
    rng: np.random.Generator,
    kind: str,
    n: int,
    timeouts: bool,
    steps: int,
) -> None:
    """Add the same ``steps`` random steps to each of ``buffers``."""
    for _ in range(steps):
        step = _step(rng, *SPACES[kind], n, timeouts)
        for buffer in buffers:
            buffer.add(*step)


def _assert_same(theirs: Any, ours: Any) -> None:
    for name in FIELDS:
        a, b = getattr(theirs, name), getattr(ours, name)
        assert b.dtype == a.dtype and b.shape == a.shape, (name, a.dtype, b.dtype, a.shape)
        assert torch.equal(a, b), name


def _compare(sb3: Any, ours: Any, seed: int, env: Any = None, batch: int = 64) -> None:
    assert (ours.pos, ours.full, ours.size()) == (sb3.pos, sb3.full, sb3.size())
    np.random.seed(seed)
    theirs = sb3.sample(batch, env=env)
    np.random.seed(seed)
    slots = _draw_as_sb3(sb3, batch)
    envs = np.random.randint(0, sb3.n_envs, size=batch)
    _assert_same(theirs, ours._get_samples(slots, env=env, env_indices=envs))


@pytest.mark.parametrize("kind", list(SPACES))
@pytest.mark.parametrize("n_envs", [1, 4])
@pytest.mark.parametrize(
    "timeouts,optimize",
    [(False, False), (True, False), (False, True)],
    ids=["plain", "timeouts", "optimize"],
)
def test_same_samples_as_sb3(kind: str, n_envs: int, timeouts: bool, optimize: bool) -> None:
    sb3, ours = _both(kind, n_envs, timeouts, optimize)
    rng = np.random.default_rng(0)
    for t in range(17):  # 6 slots: full after 6 steps, then wraps twice
        step = _step(rng, *SPACES[kind], n_envs, timeouts)
        sb3.add(*step)
        ours.add(*step)
        if t in (0, 4, 5, 6, 11, 16):
            _compare(sb3, ours, seed=t)
    assert len(ours.storage) == ours.buffer_size * n_envs


def test_timeouts_are_not_terminals() -> None:
    sb3, ours = _both("box", 1, True, False)
    obs, nxt, act, rew, _, _ = _step(np.random.default_rng(1), *SPACES["box"], 1, False)
    for infos in ([{"TimeLimit.truncated": True}], [{}]):
        sb3.add(obs, nxt, act, rew, np.array([True]), infos)
        ours.add(obs, nxt, act, rew, np.array([True]), infos)
    batch = ours._get_samples(np.array([0, 1]), env_indices=np.array([0, 0]))
    assert batch.dones.flatten().tolist() == [0.0, 1.0]
    _compare(sb3, ours, seed=3)


class _Normalizer:
    """A stand-in for ``VecNormalize`` (deterministic, numpy in and out)."""

    def normalize_obs(self, obs: np.ndarray) -> np.ndarray:
        return ((obs - 0.5) / 3.0).astype(np.float32)

    def normalize_reward(self, reward: np.ndarray) -> np.ndarray:
        return reward * 0.1


def test_env_normalization_as_sb3() -> None:
    sb3, ours = _both("box", 4, False, False)
    rng = np.random.default_rng(2)
    _add_same((sb3, ours), rng, "box", 4, False, 4)
    _compare(sb3, ours, seed=5, env=_Normalizer())
    assert ours.sample(8, env=_Normalizer()).rewards.dtype == torch.float32


@pytest.mark.parametrize("optimize", [False, True])
@pytest.mark.parametrize("n_envs", [1, 3])
def test_draws_cover_exactly_the_valid_transitions(optimize: bool, n_envs: int) -> None:
    _, ours = _both("box", n_envs, False, optimize, slots=5)
    rng = np.random.default_rng(3)
    for steps in (3, 5):  # not full (pos 3), then full with pos 3
        for _ in range(steps):
            ours.add(*_step(rng, *SPACES["box"], n_envs, False))
        flat = ours._draw(4000)
        slots = set((flat // n_envs).tolist())
        if not ours.full:
            expected = set(range(ours.pos))
        else:
            expected = set(range(5)) - ({ours.pos} if optimize else set())
        assert slots == expected
        assert set((flat % n_envs).tolist()) == set(range(n_envs))


def test_reset_then_refill_matches_sb3() -> None:
    sb3, ours = _both("discrete", 4, True, False)
    rng = np.random.default_rng(4)
    _add_same((sb3, ours), rng, "discrete", 4, True, 8)
    sb3.reset()
    ours.reset()
    assert (ours.pos, ours.full, ours.size(), len(ours.storage)) == (0, False, 0, 0)
    with pytest.raises(EmptyBufferError):
        ours.sample(4)
    _add_same((sb3, ours), rng, "discrete", 4, True, 2)
    _compare(sb3, ours, seed=6)


def test_extend_adds_step_by_step_as_sb3() -> None:
    sb3, ours = _both("box", 2, True, False)
    rng = np.random.default_rng(5)
    steps = [_step(rng, *SPACES["box"], 2, True) for _ in range(9)]
    columns = list(zip(*steps, strict=True))
    sb3.extend(*columns)
    ours.extend(*columns)
    _compare(sb3, ours, seed=7)


# --- bad input ------------------------------------------------------------------------------
def _snapshot(rb: ReplayBuffer) -> tuple[Any, ...]:
    return (rb.pos, rb.full, len(rb.storage), [b.clone() for b in rb.storage.buffers])


@pytest.mark.parametrize(
    "position,bad,name",
    [
        (0, np.zeros((2, 3, 3)), "obs"),
        (1, np.zeros((5,)), "next_obs"),
        (2, np.zeros((2, 5)), "action"),
        (3, np.zeros(3), "reward"),
        (4, "yes", "done"),
        (5, [{}], "infos"),
        (5, {"TimeLimit.truncated": np.zeros(2, bool)}, "infos"),
    ],
)
def test_bad_add_names_the_argument_and_changes_nothing(position: int, bad: Any, name: str) -> None:
    _, ours = _both("box", 2, True, False)
    rng = np.random.default_rng(6)
    ours.add(*_step(rng, *SPACES["box"], 2, True))
    before = _snapshot(ours)
    args = list(_step(rng, *SPACES["box"], 2, True))
    args[position] = bad
    with pytest.raises(ValueError, match=f"^{name}:"):
        ours.add(*args)
    after = _snapshot(ours)
    assert before[:3] == after[:3]
    assert all(torch.equal(a, b) for a, b in zip(before[3], after[3], strict=True))


def test_bad_constructor_arguments() -> None:
    box, disc = SPACES["box"][0], SPACES["discrete"][1]
    with pytest.raises(ValueError, match="simultaneously"):
        ReplayBuffer(10, box, disc, "cpu", 1, True, True)
    with pytest.raises(ValueError, match=r"^n_envs:"):
        ReplayBuffer(10, box, disc, "cpu", 0)
    with pytest.raises(ValueError, match=r"^buffer_size:"):
        ReplayBuffer(-3, box, disc)
    with pytest.raises(TypeError, match=r"^storage:"):
        ReplayBuffer(10, box, disc, storage="list")
    with pytest.raises(ValueError, match=r"^storage: expected capacity 8"):
        ReplayBuffer(10, box, disc, n_envs=4, storage=TensorStorage(10))
    with pytest.raises(NotImplementedError, match=r"^observation_space: Dict"):
        ReplayBuffer(10, gym_spaces.Dict({"a": box}), disc)
    with pytest.raises(TypeError, match=r"^action_space:"):
        ReplayBuffer(10, box, object())
    with pytest.raises(NotImplementedError, match="optimize_memory_usage"):
        PrioritizedReplayBuffer(10, box, disc, "cpu", 1, True, False)
    other = TensorStorage(10)
    other.set(slice(0, 2), {"x": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match=r"^storage: expected layout"):
        ReplayBuffer(10, box, disc, storage=other)


def test_no_stable_baselines3_or_gymnasium_import_at_runtime() -> None:
    code = (
        "import sys, rbdata.compat.sb3; "
        "assert 'stable_baselines3' not in sys.modules and 'gymnasium' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- what SB3 lacks: checkpoints, memmap, priorities -----------------------------------------
@pytest.mark.parametrize("optimize,steps", [(False, 4), (False, 9), (True, 4), (True, 9)])
def test_dumps_loads_resume_exactly(tmp_path: Path, optimize: bool, steps: int) -> None:
    sb3, ours = _both("box", 2, False, optimize)
    rng = np.random.default_rng(7)
    _add_same((sb3, ours), rng, "box", 2, False, steps)
    ours.dumps(tmp_path / "ckpt")
    box, act = SPACES["box"]
    back = ReplayBuffer.loads(
        tmp_path / "ckpt",
        box,
        act,
        "cpu",
        2,
        optimize_memory_usage=optimize,
        handle_timeout_termination=False,
    )
    assert (back.buffer_size, back.pos, back.full) == (ours.buffer_size, ours.pos, ours.full)
    _assert_same(ours.sample(32), back.sample(32))  # the generator state was saved too
    _compare(sb3, back, seed=8)
    _add_same((sb3, back), rng, "box", 2, False, 1)  # and it keeps going like SB3
    _compare(sb3, back, seed=9)
    into = _both("box", 2, False, optimize)[1]
    into.load(tmp_path / "ckpt")
    assert (into.pos, into.full) == (ours.pos, ours.full)
    again = ReplayBuffer.loads(
        tmp_path / "ckpt",
        box,
        act,
        "cpu",
        2,
        optimize_memory_usage=optimize,
        handle_timeout_termination=False,
    )
    _assert_same(again.sample(16), into.sample(16))


def test_memmap_storage_matches_and_reopens(tmp_path: Path) -> None:
    sb3, ours = _both("discrete", 4, True, False, storage="memmap", path=tmp_path / "rb")
    rng = np.random.default_rng(8)
    _add_same((sb3, ours), rng, "discrete", 4, True, 9)
    _compare(sb3, ours, seed=10)
    ours.close()
    obs_space, act_space = SPACES["discrete"]
    reopened = ReplayBuffer(
        24, obs_space, act_space, "cpu", 4, storage=MemmapStorage.open(tmp_path / "rb")
    )
    _compare(sb3, reopened, seed=11)
    reopened.close()


def test_storage_is_a_dataset_of_transitions() -> None:
    _, ours = _both("box", 4, True, False)
    rng = np.random.default_rng(9)
    steps = [_step(rng, *SPACES["box"], 4, True) for _ in range(3)]
    for step in steps:
        ours.add(*step)
    item = ours.storage[2 * 4 + 1]  # slot 2, env 1
    assert torch.equal(item["observation"], torch.as_tensor(steps[2][0][1]))
    assert float(item["next", "reward"]) == float(steps[2][3][1])
    assert ours.replay_buffer.sample(5)["observation"].shape == (5, 3, 2)


def _per(n_envs: int = 2, **kw: Any) -> PrioritizedReplayBuffer:
    box, act = SPACES["box"]
    return PrioritizedReplayBuffer(10 * n_envs, box, act, "cpu", n_envs, **kw)


def test_prioritized_weights_and_indices_against_brute_force() -> None:
    alpha, beta, eps = 0.7, 0.5, 1e-6
    rb = _per(alpha=alpha, beta=beta, eps=eps, generator=torch.Generator().manual_seed(0))
    rng = np.random.default_rng(10)
    for _ in range(5):
        rb.add(*_step(rng, *SPACES["box"], 2, True))
    prio = rng.random(10) * 3
    prio[[1, 6]] = 0.0  # almost never drawn
    rb.update_priorities(torch.arange(10), torch.as_tensor(prio).view(-1, 1))
    batch = rb.sample(20_000)
    assert batch.weights.shape == (20_000, 1) and batch.indices.shape == (20_000,)
    value = (prio + eps) ** alpha
    expected_w = (value / value.min()) ** -beta
    idx = batch.indices.numpy()
    np.testing.assert_allclose(batch.weights.numpy()[:, 0], expected_w[idx], rtol=1e-5)
    freq = np.bincount(idx, minlength=10) / idx.size
    np.testing.assert_allclose(freq, value / value.sum(), atol=0.015)
    buf = rb.storage.buffers[0]  # the rows really are the transitions at those indices
    assert torch.equal(batch.observations[:50], buf[batch.indices[:50]])


def test_prioritized_bad_update_changes_nothing_and_beta_anneals() -> None:
    rb = _per(n_envs=1)
    rng = np.random.default_rng(11)
    for _ in range(3):
        rb.add(*_step(rng, *SPACES["box"], 1, True))
    rb.update_priorities([0, 1, 2], [1.0, 2.0, 3.0])
    before = rb._sampler.priority_values().clone()
    with pytest.raises(ValueError):
        rb.update_priorities([0, 1], [float("nan"), 1.0])
    with pytest.raises(ValueError, match="index"):
        rb.update_priorities([0, 7], [1.0, 1.0])
    assert torch.equal(before, rb._sampler.priority_values())
    rb.beta = 1.0
    assert rb.beta == 1.0 and rb._sampler.beta == 1.0
    with pytest.raises(ValueError, match=r"^beta:"):
        rb.beta = -1
    assert rb.sample(4).observations.shape == (4, 3, 2)


def test_prioritized_checkpoint_keeps_priorities(tmp_path: Path) -> None:
    rb = _per(generator=torch.Generator().manual_seed(1))
    rng = np.random.default_rng(12)
    for _ in range(12):  # wraps
        rb.add(*_step(rng, *SPACES["box"], 2, True))
    rb.update_priorities(np.arange(20), rng.random(20))
    rb.dumps(tmp_path / "per")
    box, act = SPACES["box"]
    back = PrioritizedReplayBuffer.loads(tmp_path / "per", box, act, "cpu", 2)
    assert (back.pos, back.full) == (rb.pos, rb.full)
    a, b = rb.sample(64), back.sample(64)
    _assert_same(a, b)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.weights, b.weights)


# --- the fast path (per-step row writes) against the reference path (commit) -----------------
@pytest.mark.parametrize("n_envs", [1, 4])
@pytest.mark.parametrize(
    "timeouts,optimize", [(True, False), (False, True)], ids=["timeouts", "optimize"]
)
def test_fast_writes_leave_the_storage_as_commits_do(
    tmp_path: Path, n_envs: int, timeouts: bool, optimize: bool
) -> None:
    """TensorStorage and MemmapStorage on the fast path, a MemmapStorage through ``commit``."""
    _, tensor = _both("discrete", n_envs, timeouts, optimize)
    _, memmap = _both("discrete", n_envs, timeouts, optimize, storage="memmap", path=tmp_path / "m")
    _, ref = _both("discrete", n_envs, timeouts, optimize, storage="memmap", path=tmp_path / "r")
    ref._writer.attach(ref._storage, fast=False)
    assert tensor._writer._fast and memmap._writer._fast and not ref._writer._fast
    rng = np.random.default_rng(13)
    for t in range(15):
        step = _step(rng, *SPACES["discrete"], n_envs, timeouts)
        for buf in (tensor, memmap, ref):
            buf.add(*step)
        if t in (0, 3, 5, 6, 9, 14):
            want = ref.storage
            for got in (tensor.storage, memmap.storage):
                assert (len(got), got.next_slot) == (len(want), want.next_slot)
                assert all(
                    torch.equal(x, y) for x, y in zip(got.buffers, want.buffers, strict=True)
                )
    for buf in (memmap, ref):
        buf.close()
    want = tensor.storage
    reopened = MemmapStorage.open(tmp_path / "m")  # what the journal and header left on disk
    assert (len(reopened), reopened.next_slot) == (len(want), want.next_slot)
    assert all(torch.equal(x, y) for x, y in zip(reopened.buffers, want.buffers, strict=True))
    reopened.close()


def test_prioritized_matches_an_rbdata_buffer_fed_step_by_step() -> None:
    from rbdata import PrioritizedSampler
    from rbdata import ReplayBuffer as RbdataBuffer

    n, slots = 2, 6
    box, act = SPACES["box"]
    ours = PrioritizedReplayBuffer(slots * n, box, act, "cpu", n, alpha=0.8, beta=0.3, eps=0.01)
    ref = RbdataBuffer(TensorStorage(slots * n), PrioritizedSampler(slots * n, 0.8, 0.3, 0.01))
    rng = np.random.default_rng(14)
    for t in range(20):  # wraps three times; priorities updated between adds
        obs, nxt, action, reward, done, infos = _step(rng, box, act, n, True)
        ours.add(obs, nxt, action, reward, done, infos)
        cut = np.array([i.get("TimeLimit.truncated", False) for i in infos], np.float32)
        ref.extend(
            {
                "observation": torch.as_tensor(obs),
                "action": torch.as_tensor(action, dtype=torch.float32),
                "next": {
                    "observation": torch.as_tensor(nxt),
                    "reward": torch.as_tensor(reward),
                    "done": torch.as_tensor(done, dtype=torch.float32),
                    "truncated": torch.as_tensor(cut),
                },
            }
        )
        if t % 3 == 2:
            filled = ours.size() * n
            index = rng.choice(filled, size=3, replace=False)
            prio = rng.random(3) * 4
            ours.update_priorities(index, prio)
            ref.update_priority(index, prio)
    mine_sampler, ref_sampler = ours.replay_buffer.sampler, ref.sampler
    assert isinstance(mine_sampler, PrioritizedSampler)
    assert isinstance(ref_sampler, PrioritizedSampler)
    assert torch.equal(mine_sampler.priority_values(), ref_sampler.priority_values())
    storage = ours.storage
    mine = dict(zip([leaf.key for leaf in storage.layout.leaves], storage.buffers, strict=True))
    for leaf, b in zip(ref.storage.layout.leaves, ref.storage.buffers, strict=True):
        assert torch.equal(mine[leaf.key], b), leaf.key


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_pickle_round_trip_keeps_writing_like_the_original(cls: type) -> None:
    import pickle

    box, act = SPACES["box"]
    rb = cls(12, box, act, "cpu", 2, handle_timeout_termination=True)
    rng = np.random.default_rng(15)
    for _ in range(4):
        rb.add(*_step(rng, box, act, 2, True))
    copy = pickle.loads(pickle.dumps(rb))
    for _ in range(5):  # wraps: both keep writing on their own storage
        step = _step(rng, box, act, 2, True)
        rb.add(*step)
        copy.add(*step)
    a, b = rb.storage, copy.storage
    assert (len(a), a.next_slot, copy.pos, copy.full) == (len(b), b.next_slot, rb.pos, rb.full)
    assert all(torch.equal(x, y) for x, y in zip(a.buffers, b.buffers, strict=True))
    _assert_same(rb.sample(16), copy.sample(16))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device_and_cuda_storage_match_cpu() -> None:
    box, act = SPACES["box"]
    cpu = ReplayBuffer(12, box, act, "cpu", 2, generator=torch.Generator().manual_seed(0))
    on_gpu = ReplayBuffer(12, box, act, "cuda", 2, generator=torch.Generator().manual_seed(0))
    gpu_storage = ReplayBuffer(
        12,
        box,
        act,
        "cuda",
        2,
        storage=TensorStorage(12, device="cuda"),
        generator=torch.Generator().manual_seed(0),
    )
    rng = np.random.default_rng(16)
    for _ in range(9):
        step = _step(rng, box, act, 2, True)
        for rb in (cpu, on_gpu, gpu_storage):
            rb.add(*step)
    ref = cpu.sample(32)
    for rb in (on_gpu, gpu_storage):
        got = rb.sample(32)
        assert got.observations.device.type == "cuda"
        _assert_same(ref, ReplayBufferSamples(*(t.cpu() for t in got[:5])))
