"""``tests/_atari_frames.py``: stacks rebuilt from frames stored once are the env's stacks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _atari_frames import STACK, AtariSteps, _play_synthetic, atari_steps


def _check(steps: AtariSteps) -> None:
    n = len(steps)
    obs, nxt = steps.obs(), steps.next_obs()
    assert obs.shape == nxt.shape == (n, STACK, 84, 84) and obs.dtype == np.uint8
    done = steps.terminated | steps.truncated
    # within an episode, each next stack is the following step's observation
    assert np.array_equal(nxt[:-1][~done[:-1]], obs[1:][~done[:-1]])
    # a new episode starts from its first frame repeated over the stack (gymnasium's padding)
    starts = np.r_[0, np.flatnonzero(done[:-1]) + 1]
    assert (obs[starts] == obs[starts, :1]).all()
    # frames are stored once: a step adds one frame, a reset one more
    assert len(steps.frames) == n + steps.episodes
    assert (np.diff(steps.frame_episode) >= 0).all()
    t = steps.transitions(2, 5)
    assert np.array_equal(t["next"]["observation"], nxt[2:5])
    assert np.array_equal(t["next"]["done"], done[2:5])


def test_synthetic_frames_keep_the_stacking_rules() -> None:
    steps = _play_synthetic("Breakout", 1_500, seed=3)
    assert steps.source == "synthetic" and steps.episodes >= 2
    assert "SYNTHETIC" in steps.describe()
    _check(steps)
    again = _play_synthetic("Breakout", 1_500, seed=3)
    assert np.array_equal(again.frames, steps.frames)  # seeded


def test_real_frames_are_recorded_checked_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    monkeypatch.setenv("RBDATA_FRAMES_CACHE", str(tmp_path))
    steps = atari_steps("Pong", 120, seed=1)
    assert steps.source == "ale" and len(steps) == 120
    _check(steps)
    assert len(list(tmp_path.glob("Pong-120-seed1-ale-*.npz"))) == 1
    cached = atari_steps("Pong", 120, seed=1)
    for name in ("frames", "obs_index", "next_index", "action", "reward", "terminated"):
        assert np.array_equal(getattr(cached, name), getattr(steps, name)), name
