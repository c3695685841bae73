"""``rbdata.compat.sb3``: SB3's arrays as views of the storage, Dict spaces, SB3's edge cases.

Checked against independent expectations (no stable-baselines3 needed); the comparisons with
SB3's own buffers are in ``test_compat_sb3_reference.py``.
"""

from __future__ import annotations

import io
import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

spaces = pytest.importorskip("gymnasium.spaces")

from rbdata import MemmapStorage  # noqa: E402
from rbdata.compat.sb3 import (  # noqa: E402
    DictReplayBuffer,
    DictReplayBufferSamples,
    PrioritizedReplayBuffer,
    ReplayBuffer,
)
from rbdata.errors import EmptyBufferError  # noqa: E402

BOX = spaces.Box(-5, 5, (3, 2), dtype=np.float32)
ACT = spaces.Box(-1, 1, (2,), dtype=np.float64)  # stored as float32
DICT = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), dtype=np.float32), "goal": spaces.Discrete(5)})
ARRAYS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")
#: SB3's array name -> the storage key it views
KEYS = {
    "observations": ("observation",),
    "next_observations": ("next", "observation"),
    "actions": ("action",),
    "rewards": ("next", "reward"),
    "dones": ("next", "done"),
    "timeouts": ("next", "truncated"),
}


def _buffer(n_envs: int, optimize: bool, storage: str, tmp_path: Path, **kw: Any) -> ReplayBuffer:
    path = tmp_path / "rb" if storage == "memmap" else None
    return ReplayBuffer(
        6 * n_envs,
        BOX,
        ACT,
        "cpu",
        n_envs,
        optimize,
        not optimize,
        storage=storage,
        path=path,
        **kw,
    )


def _leaf(rb: ReplayBuffer, key: tuple[str, ...]) -> torch.Tensor:
    storage = rb.storage
    keys = [leaf.key for leaf in storage.layout.leaves]
    return storage.buffers[keys.index(key)]


def _steps(n: int, count: int, seed: int = 0) -> list[tuple[Any, ...]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        obs = rng.standard_normal((n, 3, 2)).astype(np.float32)
        nxt = rng.standard_normal((n, 3, 2)).astype(np.float32)
        act = rng.uniform(-1, 1, (n, 2))
        rew = rng.standard_normal(n).astype(np.float32)
        done = rng.random(n) < 0.3
        infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} for d in done]
        out.append((obs, nxt, act, rew, done, infos))
    return out


def _expected(steps: list[tuple[Any, ...]], n: int, optimize: bool) -> dict[str, np.ndarray]:
    """SB3's arrays after ``steps``, computed here by SB3's rules (6 slots).

    With ``optimize``, one difference: the slot at ``pos`` (which holds only the last next
    observation, and is never sampled) is zero in the other arrays, where SB3 keeps what the
    transition it overwrites had there.
    """
    want = {
        "observations": np.zeros((6, n, 3, 2), np.float32),
        "next_observations": np.zeros((6, n, 3, 2), np.float32),
        "actions": np.zeros((6, n, 2), np.float32),
        "rewards": np.zeros((6, n), np.float32),
        "dones": np.zeros((6, n), np.float32),
        "timeouts": np.zeros((6, n), np.float32),
    }
    for t, (obs, nxt, act, rew, done, infos) in enumerate(steps):
        pos = t % 6
        want["observations"][pos] = obs
        if optimize:
            want["observations"][(pos + 1) % 6] = nxt
            for name in ("actions", "rewards", "dones", "timeouts"):
                want[name][(pos + 1) % 6] = 0
        else:
            want["next_observations"][pos] = nxt
            want["timeouts"][pos] = [i["TimeLimit.truncated"] for i in infos]
        want["actions"][pos], want["rewards"][pos], want["dones"][pos] = act, rew, done
    if optimize:
        del want["next_observations"]
    return want


# --- views --------------------------------------------------------------------------------
@pytest.mark.parametrize("storage", ["tensor", "memmap"])
@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("optimize", [False, True])
def test_arrays_are_views_of_the_storage(
    tmp_path: Path, storage: str, n_envs: int, optimize: bool
) -> None:
    rb = _buffer(n_envs, optimize, storage, tmp_path)
    steps = _steps(n_envs, 9)  # wraps
    for step in steps:
        rb.add(*step)
    for name, want in _expected(steps, n_envs, optimize).items():
        got = getattr(rb, name)
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)
        buf = _leaf(rb, KEYS[name])
        assert got.__array_interface__["data"][0] == buf.data_ptr(), name  # no copy
        assert np.shares_memory(got, buf.numpy()), name
    if optimize:
        with pytest.raises(AttributeError, match="next_observations"):
            rb.next_observations  # noqa: B018 - as SB3: no such array
    rb.close()


@pytest.mark.parametrize("storage", ["tensor", "memmap"])
def test_writes_through_the_arrays_land_in_the_storage(tmp_path: Path, storage: str) -> None:
    rb = _buffer(2, False, storage, tmp_path)
    for step in _steps(2, 3):
        rb.add(*step)
    rb.dones[1] = True  # what SB3's OffPolicyAlgorithm._setup_learn does
    rb.timeouts[1, 0] = 1.0
    rb.rewards[:] += 1.0
    rb.observations[2, 1] = 7.0
    item = rb.storage[1 * 2 + 0]  # slot 1, env 0
    assert float(item["next", "done"]) == 1.0 and float(item["next", "truncated"]) == 1.0
    assert torch.equal(rb.storage[2 * 2 + 1]["observation"], torch.full((3, 2), 7.0))
    sample = rb._get_samples(np.array([1, 1]), env_indices=np.array([0, 1]))
    assert sample.dones.flatten().tolist() == [0.0, 1.0]  # done * (1 - timeout), as SB3
    if storage == "memmap":  # the files hold the writes
        want = [b.clone() for b in rb.storage.buffers]
        rb.close()
        back = MemmapStorage.open(tmp_path / "rb")
        assert all(torch.equal(a, b) for a, b in zip(back.buffers, want, strict=True))
        back.close()


def test_assigning_an_array_copies_into_the_storage() -> None:
    rb = ReplayBuffer(8, BOX, ACT, "cpu", 2)
    before = rb.rewards
    rb.rewards = np.arange(8, dtype=np.float32).reshape(4, 2)
    rb.dones = 1  # broadcast, as numpy assignment
    assert np.shares_memory(before, rb.rewards) and before[3, 1] == 7.0
    assert (rb.dones == 1).all()
    with pytest.raises(ValueError, match=r"^rewards: expected shape \(4, 2\)"):
        rb.rewards = np.zeros(5)


def test_arrays_follow_memory_that_torch_moves() -> None:
    rb = ReplayBuffer(4, BOX, ACT, "cpu", 1)
    old = rb.observations
    ForkingPickler(io.BytesIO()).dump(rb.storage.buffers[0])  # moves the arena to shm
    step = _steps(1, 1)[0]
    rb.add(*step)
    now = rb.observations
    assert now.__array_interface__["data"][0] == _leaf(rb, KEYS["observations"]).data_ptr()
    np.testing.assert_array_equal(now[0], step[0])
    assert not np.shares_memory(old, now)


def test_a_pickled_copy_has_arrays_of_its_own() -> None:
    rb = ReplayBuffer(4, BOX, ACT, "cpu", 1)
    for step in _steps(1, 2):
        rb.add(*step)
    copy = pickle.loads(pickle.dumps(rb))
    np.testing.assert_array_equal(copy.observations, rb.observations)
    assert not np.shares_memory(copy.observations, rb.observations)
    copy.dones[0] = 5.0
    assert rb.dones[0, 0] != 5.0 and float(copy.storage[0]["next", "done"]) == 5.0


# --- SB3's other surface --------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype,want",
    [
        (np.float64, np.float32),
        (np.dtype(np.float64), np.float32),
        (np.float32, np.float32),
        (np.dtype(np.int64), np.dtype(np.int64)),
        (np.uint8, np.uint8),
        (None, None),
    ],
)
def test_maybe_cast_dtype(dtype: Any, want: Any) -> None:
    assert ReplayBuffer._maybe_cast_dtype(dtype) == want
    assert DictReplayBuffer._maybe_cast_dtype(dtype) == want


@pytest.mark.parametrize("storage", ["tensor", "memmap"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint64, np.float16, np.float64])
def test_a_full_buffer_before_any_add_samples_zeros(
    tmp_path: Path, storage: str, dtype: Any
) -> None:
    obs = spaces.Box(0, 100, dtype=dtype)  # gymnasium makes it shape (1,)
    path = tmp_path / "rb" if storage == "memmap" else None
    rb = ReplayBuffer(1, obs, ACT, "cpu", storage=storage, path=path)
    assert rb.observations.shape == (1, 1, 1) and rb.observations.dtype == dtype
    with pytest.raises(EmptyBufferError):
        rb.sample(4)
    rb.full = True  # SB3 samples the zeros its arrays start with
    batch = rb.sample(64)
    assert batch.observations.shape == (64, 1) and batch.observations.numpy().dtype == dtype
    assert batch.actions.dtype == torch.float32 and batch.actions.shape == (64, 2)
    for t in batch[:5]:
        assert not t.any()
    assert len(rb.storage) == 0  # nothing was written
    rb.close()


def test_building_a_buffer_leaves_torchs_global_rng_alone() -> None:
    torch.manual_seed(3)
    state = torch.get_rng_state()
    a = ReplayBuffer(10, BOX, ACT, "cpu")
    DictReplayBuffer(10, DICT, ACT, "cpu")
    PrioritizedReplayBuffer(10, BOX, ACT, "cpu")
    assert torch.equal(state, torch.get_rng_state())
    torch.manual_seed(3)
    b = ReplayBuffer(10, BOX, ACT, "cpu")  # the seed still decides the draws
    for step in _steps(1, 3):
        a.add(*step)
        b.add(*step)
    assert torch.equal(a.sample(16).observations, b.sample(16).observations)


class _NStep(ReplayBuffer):
    """A subclass with SB3's ``_get_samples(batch_inds, env)`` (like SB3's NStepReplayBuffer)."""

    def _get_samples(self, batch_inds: Any, env: Any = None, env_indices: Any = None) -> Any:
        self.seen = batch_inds
        return super()._get_samples(batch_inds, env, np.zeros_like(batch_inds))


def test_a_subclass_get_samples_is_called_with_the_drawn_slots() -> None:
    rb = _NStep(10, BOX, ACT, "cpu", 2, generator=torch.Generator().manual_seed(0))
    for step in _steps(2, 3):
        rb.add(*step)
    batch = rb.sample(50)
    assert isinstance(rb.seen, np.ndarray) and set(rb.seen.tolist()) == {0, 1, 2}
    np.testing.assert_array_equal(batch.observations.numpy(), rb.observations[rb.seen, 0])


# --- DictReplayBuffer -----------------------------------------------------------------------
def _dict_steps(n: int, count: int) -> list[tuple[Any, ...]]:
    rng = np.random.default_rng(1)
    out = []
    for _ in range(count):
        obs = {
            "pos": rng.standard_normal((n, 2)).astype(np.float32),
            "goal": rng.integers(5, size=n),
        }
        nxt = {
            "pos": rng.standard_normal((n, 2)).astype(np.float32),
            "goal": rng.integers(5, size=n),
        }
        act = rng.uniform(-1, 1, (n, 2))
        out.append((obs, nxt, act, rng.standard_normal(n), rng.random(n) < 0.5, [{}] * n))
    return out


@pytest.mark.parametrize("storage", ["tensor", "memmap"])
def test_dict_buffer_arrays_and_samples(tmp_path: Path, storage: str) -> None:
    path = tmp_path / "rb" if storage == "memmap" else None
    rb = DictReplayBuffer(8, DICT, ACT, "cpu", 2, storage=storage, path=path)
    assert rb.obs_shape == {"pos": (2,), "goal": (1,)}
    steps = _dict_steps(2, 5)  # 4 slots: wraps
    for step in steps:
        rb.add(*step)
    obs, nxt = rb.observations, rb.next_observations
    assert set(obs) == {"pos", "goal"} and obs["goal"].shape == (4, 2, 1)
    assert obs["goal"].dtype == np.int64 and nxt["pos"].dtype == np.float32
    last = steps[4]  # slot 0 again
    np.testing.assert_array_equal(obs["pos"][0], last[0]["pos"])
    np.testing.assert_array_equal(nxt["goal"][0, :, 0], last[1]["goal"])
    keys = [leaf.key for leaf in rb.storage.layout.leaves]
    for name, prefix in (
        ("observations", ("observation",)),
        ("next_observations", KEYS["next_observations"]),
    ):
        for key, view in getattr(rb, name).items():
            buf = rb.storage.buffers[keys.index((*prefix, key))]
            assert view.__array_interface__["data"][0] == buf.data_ptr()
    batch = rb._get_samples(np.array([0, 3, 1]), env_indices=np.array([1, 0, 1]))
    assert isinstance(batch, DictReplayBufferSamples)
    np.testing.assert_array_equal(
        batch.observations["pos"].numpy(), obs["pos"][[0, 3, 1], [1, 0, 1]]
    )
    assert batch.next_observations["goal"].shape == (3, 1) and batch.dones.shape == (3, 1)
    assert rb.sample(7).observations["goal"].dtype == torch.int64
    rb.close()


def test_dict_buffer_full_before_add_and_bad_input() -> None:
    rb = DictReplayBuffer(4, DICT, spaces.Discrete(3), "cpu")
    rb.full = True
    batch = rb.sample(5)
    assert batch.observations["pos"].shape == (5, 2) and not batch.observations["goal"].any()
    step = list(_dict_steps(1, 1)[0])
    step[2] = np.array([1])
    rb.full = False
    rb.add(*step)
    before = [b.clone() for b in rb.storage.buffers]
    bad = dict(step[0], pos=np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"^obs\['pos'\]: expected shape \(1, 2\)"):
        rb.add(bad, *step[1:])
    with pytest.raises(ValueError, match=r"^next_obs: key 'goal' missing"):
        rb.add(step[0], {"pos": step[1]["pos"]}, *step[2:])
    with pytest.raises(ValueError, match=r"^obs: expected a dict"):
        rb.add(np.zeros((1, 2)), *step[1:])
    assert all(torch.equal(a, b) for a, b in zip(before, rb.storage.buffers, strict=True))
    assert rb.pos == 1
    with pytest.raises(ValueError, match=r"^observations\['goal'\]: expected shape"):
        rb.observations = {"pos": 5.0, "goal": np.zeros(3)}
    assert all(torch.equal(a, b) for a, b in zip(before, rb.storage.buffers, strict=True))
    rb.observations = {"pos": 5.0, "goal": 2}
    assert (rb.observations["pos"] == 5.0).all() and (rb.observations["goal"] == 2).all()


def test_dict_buffer_refuses_what_sb3_refuses() -> None:
    with pytest.raises(TypeError, match="Dict obs space only"):
        DictReplayBuffer(4, BOX, ACT)
    with pytest.raises(ValueError, match=r"^optimize_memory_usage:"):
        DictReplayBuffer(4, DICT, ACT, "cpu", 1, True, False)
    with pytest.raises(NotImplementedError, match="nested Dict"):
        DictReplayBuffer(4, spaces.Dict({"a": DICT}), ACT)
    with pytest.raises(NotImplementedError, match="DictReplayBuffer"):
        ReplayBuffer(4, DICT, ACT)


def test_dict_buffer_checkpoint_round_trip(tmp_path: Path) -> None:
    rb = DictReplayBuffer(8, DICT, ACT, "cpu", 2, generator=torch.Generator().manual_seed(0))
    for step in _dict_steps(2, 3):
        rb.add(*step)
    rb.dumps(tmp_path / "ckpt")
    back = DictReplayBuffer.loads(tmp_path / "ckpt", DICT, ACT, "cpu", 2)
    assert (back.pos, back.full) == (rb.pos, rb.full)
    a, b = rb.sample(16), back.sample(16)
    assert all(torch.equal(a.observations[k], b.observations[k]) for k in ("pos", "goal"))
    np.testing.assert_array_equal(back.observations["pos"], rb.observations["pos"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_arrays_of_a_cuda_storage_are_tensor_views() -> None:
    from rbdata import TensorStorage

    rb = ReplayBuffer(8, BOX, ACT, "cuda", 2, storage=TensorStorage(8, device="cuda"))
    for step in _steps(2, 3):
        rb.add(*step)
    dones = rb.dones
    assert isinstance(dones, torch.Tensor) and dones.shape == (4, 2) and dones.is_cuda
    assert dones.data_ptr() == _leaf(rb, KEYS["dones"]).data_ptr()
    rb.dones[0] = 1.0
    assert float(rb.storage[1]["next", "done"]) == 1.0
    rb.full = True
    assert rb.sample(4).observations.is_cuda
