"""``rbdata.compat.sb3`` against SB3 itself: arrays, Dict buffers, subclasses, algorithms.

SB3's own test files run with our buffers through ``tests/sb3_suite/run_sb3_tests.py`` (a
documented script: they are not in SB3's wheel, and take minutes); this is the fast subset
that rbdata's suite runs whenever stable-baselines3 is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _paths import ROOT_DIR, TESTS_DIR

gym_spaces = pytest.importorskip("gymnasium.spaces")
sb3_buffers = pytest.importorskip("stable_baselines3.common.buffers")

from rbdata.compat.sb3 import DictReplayBuffer, ReplayBuffer  # noqa: E402

sys.path.insert(0, str(TESTS_DIR / "sb3_suite"))
from sb3_swap import rebuild_class  # noqa: E402

ROOT = ROOT_DIR
SPACES = {
    "box": (gym_spaces.Box(-5, 5, (3, 2), np.float32), gym_spaces.Box(-1, 1, (2,), np.float64)),
    "discrete": (gym_spaces.Discrete(7), gym_spaces.Discrete(3)),
    "multi": (gym_spaces.MultiBinary(4), gym_spaces.MultiDiscrete([3, 4])),
    "dict": (
        gym_spaces.Dict({"a": gym_spaces.Box(0, 9, (2,), np.uint8), "b": gym_spaces.Discrete(4)}),
        gym_spaces.Box(-1, 1, (2,), np.float32),
    ),
}
ARRAYS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def _step(rng: np.random.Generator, kind: str, n: int) -> tuple[Any, ...]:
    obs_space, act_space = SPACES[kind]
    obs_space.seed(int(rng.integers(1 << 30)))
    act_space.seed(int(rng.integers(1 << 30)))

    def batch() -> Any:
        items = [obs_space.sample() for _ in range(n)]
        if kind == "dict":
            return {k: np.stack([i[k] for i in items]) for k in items[0]}
        return np.stack(items)

    action = np.stack([act_space.sample() for _ in range(n)])
    done = rng.random(n) < 0.3
    infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} for d in done]
    return batch(), batch(), action, rng.standard_normal(n).astype(np.float32), done, infos


def _pair(kind: str, n: int, timeouts: bool, optimize: bool) -> tuple[Any, Any]:
    args = (6 * n, *SPACES[kind], "cpu", n, optimize, timeouts)
    if kind == "dict":
        return sb3_buffers.DictReplayBuffer(*args), DictReplayBuffer(*args)
    return sb3_buffers.ReplayBuffer(*args), ReplayBuffer(*args)


def _same(a: Any, b: Any, name: str) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), name
        for key in a:
            _same(a[key], b[key], f"{name}[{key}]")
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype, a.shape, b.shape)
    np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("kind", list(SPACES))
@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("timeouts,optimize", [(True, False), (False, True)], ids=["to", "opt"])
def test_arrays_and_samples_as_sb3s(kind: str, n_envs: int, timeouts: bool, optimize: bool) -> None:
    if kind == "dict" and optimize:
        pytest.skip("SB3's DictReplayBuffer has no optimize_memory_usage")
    sb3, ours = _pair(kind, n_envs, timeouts, optimize)
    for name in ARRAYS:  # before any add: the same zeros
        assert hasattr(ours, name) == hasattr(sb3, name), name
        if hasattr(sb3, name):
            _same(getattr(sb3, name), getattr(ours, name), name)
    assert ours.obs_shape == sb3.obs_shape and ours.action_dim == sb3.action_dim
    rng = np.random.default_rng(0)
    for t in range(9):  # 6 slots: wraps
        step = _step(rng, kind, n_envs)
        sb3.add(*step)
        ours.add(*step)
        pos = ours.pos
        for name in ARRAYS:
            if optimize and name == "next_observations":
                assert not hasattr(ours, name) and not hasattr(sb3, name)
                continue
            mine, theirs = getattr(ours, name), getattr(sb3, name)
            if optimize and name != "observations":  # slot pos: see test_compat_sb3_arrays
                mine, theirs = np.delete(mine, pos, 0), np.delete(theirs, pos, 0)
            _same(theirs, mine, f"{name} after step {t}")
        np.random.seed(t)
        slots = np.random.randint(0, ours.size(), size=16)
        if optimize and ours.full:  # as SB3's sample: never the slot at pos
            slots = (np.random.randint(1, 6, size=16) + pos) % 6
        np.random.seed(t)
        want = sb3._get_samples(slots)
        np.random.seed(t)
        got = ours._get_samples(slots, env_indices=np.random.randint(0, n_envs, size=16))
        for name in want._fields:
            if getattr(want, name) is not None:
                _same(getattr(want, name), getattr(got, name), name)


@pytest.mark.parametrize("kind", ["box", "dict"])
def test_writes_through_arrays_read_back_as_in_sb3(kind: str) -> None:
    sb3, ours = _pair(kind, 2, True, False)
    rng = np.random.default_rng(1)
    for _ in range(4):
        step = _step(rng, kind, 2)
        sb3.add(*step)
        ours.add(*step)
    for buf in (sb3, ours):  # what SB3's own code writes: _setup_learn, HER, n-step returns
        buf.dones[(buf.pos - 1) % buf.buffer_size] = True
        buf.timeouts[1, 0] = True
        buf.rewards[2] *= 3
    slots = np.array([0, 1, 1, 2, 3])
    np.random.seed(5)
    want = sb3._get_samples(slots)
    np.random.seed(5)
    got = ours._get_samples(slots, env_indices=np.random.randint(0, 2, size=5))
    for name in ("observations", "actions", "dones", "rewards"):
        _same(getattr(want, name), getattr(got, name), name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.uint8, np.float16, None])
def test_maybe_cast_dtype_as_sb3s(dtype: Any) -> None:
    assert ReplayBuffer._maybe_cast_dtype(dtype) == sb3_buffers.ReplayBuffer._maybe_cast_dtype(
        dtype
    )


@pytest.mark.parametrize("kind", ["box", "discrete", "dict"])
def test_full_before_any_add_as_sb3(kind: str) -> None:
    sb3, ours = _pair(kind, 2, True, False)
    sb3.full = ours.full = True
    np.random.seed(0)
    want = sb3.sample(8)
    got = ours.sample(8)  # all zeros: which slots were drawn does not matter
    for name in want._fields[:5]:
        _same(getattr(want, name), getattr(got, name), name)


def test_sb3_subclass_on_ours_samples_as_on_sb3s() -> None:
    """SB3's NStepReplayBuffer on our class (it writes ``timeouts`` while it samples)."""
    ns = dict(vars(sb3_buffers), ReplayBuffer=ReplayBuffer)
    nstep_ours = rebuild_class(sb3_buffers.NStepReplayBuffer, ns)
    assert issubclass(nstep_ours, ReplayBuffer)
    obs, act = SPACES["box"]
    args = (8, obs, act, "cpu", 2)
    theirs = sb3_buffers.NStepReplayBuffer(*args, n_steps=3, gamma=0.9)
    ours = nstep_ours(*args, n_steps=3, gamma=0.9)
    rng = np.random.default_rng(2)
    for t in range(7):
        step = _step(rng, "box", 2)
        theirs.add(*step)
        ours.add(*step)
        np.random.seed(t)
        want = theirs.sample(32)
        np.random.seed(t)
        slots = np.random.randint(0, theirs.size(), size=32)
        got = ours._get_samples(slots)
        for name in want._fields:
            _same(getattr(want, name), getattr(got, name), name)
        _same(theirs.timeouts, ours.timeouts, "timeouts restored")
    assert ours.sample(4).discounts.shape == (4, 1)  # our sample() calls its _get_samples


def _python(code: str, tmp_path: Path) -> str:
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent(code))
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "sb3_suite")])
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_sb3_isinstance_accepts_ours_in_any_import_order(tmp_path: Path) -> None:
    out = _python(
        """
        import sys
        import numpy as np
        from gymnasium import spaces
        from rbdata.compat.sb3 import DictReplayBuffer, ReplayBuffer, register_with_sb3
        box = spaces.Box(-1, 1, (2,))
        early = ReplayBuffer(4, box, box, "cpu")  # SB3 not imported yet
        assert "stable_baselines3" not in sys.modules
        from stable_baselines3.common import buffers
        print(isinstance(early, buffers.ReplayBuffer))  # nothing of ours ran since: False
        late = ReplayBuffer(4, box, box, "cpu")  # building one registers
        d = DictReplayBuffer(4, spaces.Dict({"x": box}), box, "cpu")
        print(isinstance(early, buffers.ReplayBuffer), isinstance(late, buffers.BaseBuffer))
        print(isinstance(d, buffers.DictReplayBuffer), isinstance(d, buffers.ReplayBuffer))
        rollout = issubclass(ReplayBuffer, buffers.RolloutBuffer)
        print(isinstance(late, buffers.DictReplayBuffer), rollout)
        register_with_sb3()  # idempotent
        """,
        tmp_path,
    )
    assert out.split() == ["False", "True", "True", "True", "True", "False", "False"]


def test_sb3_algorithms_run_save_and_load_ours(tmp_path: Path) -> None:
    """The issue's crash (a second ``learn`` with ``optimize_memory_usage``), save/load, HER."""
    out = _python(
        f"""
        import numpy as np
        import sb3_swap
        classes = sb3_swap.swap("all")
        from stable_baselines3 import DQN, SAC, HerReplayBuffer
        from stable_baselines3.common.envs import BitFlippingEnv
        from rbdata.compat import sb3 as ours
        assert classes["ReplayBuffer"] is ours.ReplayBuffer

        model = DQN("MlpPolicy", "CartPole-v1", buffer_size=200, learning_starts=20,
                    optimize_memory_usage=True, replay_buffer_kwargs=dict(
                        handle_timeout_termination=False), seed=0)
        assert type(model.replay_buffer) is ours.ReplayBuffer
        model.learn(60)
        pos = (model.replay_buffer.pos - 1) % model.replay_buffer.buffer_size
        model.replay_buffer.dones[pos] = 0.0
        model._setup_learn(10)  # SB3 writes replay_buffer.dones[pos - 1] = True
        assert model.replay_buffer.dones[pos].all()
        assert model.replay_buffer.storage[pos]["next", "done"] == 1.0  # in the storage
        model.learn(60)  # the issue's crash: a second learn()
        model.save_replay_buffer({str(tmp_path / "rb.pkl")!r})
        model.load_replay_buffer({str(tmp_path / "rb.pkl")!r})  # SB3's isinstance assert
        assert isinstance(model.replay_buffer, ours.ReplayBuffer)

        env = BitFlippingEnv(n_bits=4, continuous=True)
        her = SAC("MultiInputPolicy", env, replay_buffer_class=HerReplayBuffer,
                  learning_starts=20, buffer_size=500, seed=0)
        assert isinstance(her.replay_buffer, ours.DictReplayBuffer)
        her.learn(80)
        print("ok")
        """,
        tmp_path,
    )
    assert out.strip().endswith("ok")
