"""Real Atari frames for the pixel tests and benchmarks: 84x84 gray 4-stacks, cached on disk.

:func:`atari_steps` plays ``ALE/<game>-v5`` (``frameskip=1``) through gymnasium's
``AtariPreprocessing(frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)`` and
``FrameStackObservation(4)`` with a seeded random policy, the setup of DQN on Atari (CleanRL's
``dqn_atari.py``, SB3's ``AtariWrapper``). Each step gives the observation stack, the action,
the reward, ``terminated``, ``truncated`` and the next observation stack (at an episode's end
the terminal observation; the next step starts from a reset).

Each frame is kept once: :class:`AtariSteps` holds the frames in the order the env made them
(an episode's frames are consecutive) and, per step, the indices of the 4 frames of each stack;
the stacks are checked against the env's own while they are recorded. The result is cached as a
compressed ``.npz`` under :func:`cache_root` (outside the repository), so a second run loads
20,000 steps in about a second.

Without ``ale-py`` (or its ROMs), the frames are **synthetic** — a few moving sprites on a
static background, episodes of random length — and a banner on stderr says so; ``source`` is
then ``"synthetic"``: numbers measured on them do not describe real games.

Used by ``tests/benchmarks/bench_codecs.py`` and ``bench_pixels.py`` (which put ``tests/`` on
``sys.path``), and importable by tests as ``from _atari_frames import atari_steps``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["GAMES", "SIZE", "STACK", "AtariSteps", "ale_available", "atari_steps", "cache_root"]

GAMES = ("Pong", "Breakout", "Seaquest")  #: least to most detail on screen
SIZE = 84  #: frames are ``SIZE x SIZE`` gray ``uint8``
STACK = 4  #: frames per observation
_FORMAT = 1  #: bump when the recorded arrays change meaning: old cache files are ignored


@dataclass
class AtariSteps:
    """``n`` steps of one game, each frame stored once.

    Attributes:
        game: the game's name (``"Pong"``).
        source: ``"ale"`` (real frames) or ``"synthetic"`` (the fallback).
        frames: ``uint8 [F, 84, 84]``, in the order they were made.
        frame_episode: ``int32 [F]``, the episode of each frame (consecutive per episode).
        obs_index: ``int64 [n, 4]``, the frames of each step's observation stack.
        next_index: ``int64 [n, 4]``, the frames of each step's next observation stack.
        action: ``int64 [n]``.
        reward: ``float32 [n]``.
        terminated: ``bool [n]``.
        truncated: ``bool [n]``.
    """

    game: str
    source: str
    frames: np.ndarray
    frame_episode: np.ndarray
    obs_index: np.ndarray
    next_index: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    def __len__(self) -> int:
        return int(self.action.shape[0])

    @property
    def episodes(self) -> int:
        """Episodes started (the last one may be unfinished)."""
        return int(self.frame_episode[-1]) + 1 if self.frame_episode.size else 0

    def obs(self, index: Any = slice(None)) -> np.ndarray:
        """Observation stacks of the steps ``index``: ``uint8 [k, 4, 84, 84]`` (a copy)."""
        return self.frames[self.obs_index[index]]

    def next_obs(self, index: Any = slice(None)) -> np.ndarray:
        """Next observation stacks of the steps ``index`` (a copy)."""
        return self.frames[self.next_index[index]]

    def transitions(self, start: int, stop: int) -> dict[str, Any]:
        """Steps ``[start, stop)`` as rbdata's (TorchRL's) nested keys, numpy arrays."""
        term, trunc = self.terminated[start:stop], self.truncated[start:stop]
        return {
            "observation": self.obs(slice(start, stop)),
            "action": self.action[start:stop],
            "next": {
                "observation": self.next_obs(slice(start, stop)),
                "reward": self.reward[start:stop],
                "done": term | trunc,
                "terminated": term,
                "truncated": trunc,
            },
        }

    def describe(self) -> str:
        """One line for a benchmark's header: what the frames are and where they came from."""
        what = (
            "real ALE frames"
            if self.source == "ale"
            else "SYNTHETIC frames (ale-py missing: not real games)"
        )
        return (
            f"{self.game}: {len(self)} steps, {self.episodes} episodes, {len(self.frames)} "
            f"distinct frames, {what}"
        )


class _Recorder:
    """Collects stacks into frames-once form, checking each stack continues the last one."""

    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []
        self.episode: list[int] = []
        self.obs: list[list[int]] = []
        self.next: list[list[int]] = []
        self.rest: list[tuple[int, float, bool, bool]] = []
        self._current: list[int] = []
        self._episodes = 0

    def _add(self, frame: np.ndarray) -> int:
        self.frames.append(np.array(frame, dtype=np.uint8, copy=True))
        self.episode.append(self._episodes - 1)
        return len(self.frames) - 1

    def reset(self, stack: np.ndarray) -> None:
        """An episode starts with ``stack`` (a frame repeated in a row is stored once)."""
        self._episodes += 1
        ids: list[int] = []
        for j in range(len(stack)):
            same = j and np.array_equal(stack[j], self.frames[ids[-1]])
            ids.append(ids[-1] if same else self._add(stack[j]))
        self._current = ids

    def step(self, action: int, reward: float, term: bool, trunc: bool, nxt: np.ndarray) -> None:
        """One step to ``nxt``, which must be the current stack shifted by one new frame."""
        kept = self._current[1:]
        if not all(np.array_equal(nxt[j], self.frames[i]) for j, i in enumerate(kept)):
            raise AssertionError("a next stack does not continue its observation stack")
        ids = [*kept, self._add(nxt[-1])]
        self.obs.append(self._current)
        self.next.append(ids)
        self.rest.append((action, reward, term, trunc))
        self._current = ids

    def result(self, game: str, source: str) -> AtariSteps:
        action, reward, term, trunc = (np.array(c) for c in zip(*self.rest, strict=True))
        return AtariSteps(
            game,
            source,
            np.stack(self.frames),
            np.array(self.episode, np.int32),
            np.array(self.obs, np.int64),
            np.array(self.next, np.int64),
            action.astype(np.int64),
            reward.astype(np.float32),
            term.astype(bool),
            trunc.astype(bool),
        )


def ale_available() -> bool:
    """Whether ``ale-py`` and ``gymnasium`` (and OpenCV, for the resizing) import."""
    try:
        import ale_py  # noqa: F401
        import cv2  # noqa: F401
        import gymnasium  # noqa: F401
    except ImportError:
        return False
    return True


def _play_ale(game: str, n: int, seed: int) -> AtariSteps:
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make(f"ALE/{game}-v5", frameskip=1)
    env = gym.wrappers.AtariPreprocessing(
        env, frame_skip=4, screen_size=SIZE, grayscale_obs=True, noop_max=30
    )
    env = gym.wrappers.FrameStackObservation(env, STACK)
    rng = np.random.default_rng(seed)
    rec = _Recorder()
    try:
        obs, _ = env.reset(seed=seed)
        rec.reset(obs)
        actions = int(env.action_space.n)
        for _ in range(n):
            action = int(rng.integers(actions))
            nxt, reward, term, trunc, _ = env.step(action)
            rec.step(action, float(reward), bool(term), bool(trunc), nxt)
            if term or trunc:
                obs, _ = env.reset()
                rec.reset(obs)
    finally:
        env.close()
    return rec.result(game, "ale")


def _play_synthetic(game: str, n: int, seed: int) -> AtariSteps:
    """Sprites bouncing over a fixed background; episodes of 100 to 1,000 steps."""
    rng = np.random.default_rng([seed, GAMES.index(game) if game in GAMES else 99])
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    background = ((xx // 12 + yy // 7) % 3 * 30 + 40).astype(np.uint8)
    sprites = 2 + 3 * (GAMES.index(game) if game in GAMES else 1)
    rec = _Recorder()
    left = 0
    pos = vel = np.zeros((sprites, 2))
    stack: list[np.ndarray] = []

    def draw() -> np.ndarray:
        frame = background.copy()
        for k, (y, x) in enumerate(pos.astype(int)):
            frame[y : y + 4, x : x + 3] = 200 + 5 * k
        return frame

    for _ in range(n):
        if left == 0:
            left = int(rng.integers(100, 1001))
            pos = rng.uniform(0, SIZE - 4, (sprites, 2))
            vel = rng.uniform(-2, 2, (sprites, 2))
            stack = [draw()] * STACK
            rec.reset(np.stack(stack))
        pos = pos + vel
        vel = np.where((pos < 0) | (pos > SIZE - 4), -vel, vel)
        pos = pos.clip(0, SIZE - 4)
        stack = [*stack[1:], draw()]
        left -= 1
        reward = float(rng.random() < 0.02)
        rec.step(int(rng.integers(6)), reward, left == 0, False, np.stack(stack))
    return rec.result(game, "synthetic")


def cache_root() -> Path:
    """``$RBDATA_FRAMES_CACHE``, else ``rbdata-atari-frames-<uid>`` in the temp directory."""
    env = os.environ.get("RBDATA_FRAMES_CACHE")
    if env:
        return Path(env)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"rbdata-atari-frames-{uid}"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _cache_path(game: str, n: int, seed: int, source: str) -> Path:
    versions = f"ale{_version('ale-py')}-gym{_version('gymnasium')}" if source == "ale" else "np"
    return cache_root() / f"{game}-{n}-seed{seed}-{source}-v{_FORMAT}-{versions}.npz"


_ARRAYS = ("frames", "frame_episode", "obs_index", "next_index", "action", "reward")
_FLAGS = ("terminated", "truncated")


def _load(path: Path, game: str, source: str) -> AtariSteps | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            got = {k: z[k] for k in (*_ARRAYS, *_FLAGS)}
    except (OSError, ValueError, KeyError):  # absent, or a broken file: record again
        return None
    return AtariSteps(game=game, source=source, **got)


def _save(path: Path, steps: AtariSteps) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.part")
    try:
        with os.fdopen(fd, "wb") as f:
            arrays = {k: getattr(steps, k) for k in (*_ARRAYS, *_FLAGS)}
            np.savez_compressed(f, meta=np.array(json.dumps({"game": steps.game})), **arrays)
        os.replace(tmp, path)  # whole or absent: a killed run leaves no half file behind
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atari_steps(
    game: str = "Pong", n: int = 20_000, *, seed: int = 0, cache: bool = True
) -> AtariSteps:
    """``n`` steps of ``game`` with a seeded random policy (synthetic frames without ale-py).

    Args:
        game: an ALE game (``"Pong"``, ``"Breakout"``, ``"Seaquest"``, ...).
        n: steps to record.
        seed: the env's reset seed and the policy's.
        cache: load from / save to :func:`cache_root`.

    Returns:
        The steps, each frame stored once (see :class:`AtariSteps`).
    """
    source = "ale" if ale_available() else "synthetic"
    if source == "synthetic":
        print(
            "\n"
            + "!" * 78
            + f"\n!! ale-py (or gymnasium / opencv) is not installed: {game} frames "
            "are SYNTHETIC\n!! (moving sprites on a static background), NOT real Atari frames."
            "\n!! Ratios and times measured on them do not describe real games.\n!! Install the "
            "real ones with: pip install 'rbdata[bench]'\n" + "!" * 78,
            file=sys.stderr,
        )
    path = _cache_path(game, n, seed, source)
    if cache:
        got = _load(path, game, source)
        if got is not None:
            return got
    play = _play_ale if source == "ale" else _play_synthetic
    try:
        steps = play(game, n, seed)
    except Exception as err:  # e.g. the game's ROM missing from ale-py
        if source != "ale":
            raise
        print(f"!! ALE/{game}-v5 failed ({err!r}): SYNTHETIC frames instead", file=sys.stderr)
        return _play_synthetic(game, n, seed)
    if cache:
        _save(path, steps)
    return steps
