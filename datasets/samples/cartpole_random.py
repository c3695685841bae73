"""Recipe for the ``cartpole-random-v0`` sample dataset.

Transitions from gymnasium's ``CartPole-v1`` under a uniform random policy, fully seeded, saved
with :func:`numpy.savez_compressed`. Every array has leading dimension ``N`` (the number of
transitions):

- ``observation``: float32 ``[N, 4]``
- ``action``: int64 ``[N]``
- ``next_observation``: float32 ``[N, 4]`` (the true next observation, also at episode ends)
- ``next_reward``: float32 ``[N, 1]``
- ``next_done``, ``next_terminated``, ``next_truncated``: bool ``[N, 1]``

The environment is reset after every terminated or truncated step. Regenerate the shipped file
from the repository root with::

    python datasets/samples/cartpole_random.py
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["ENV_ID", "NUM_TRANSITIONS", "SEED", "build", "collect"]

ENV_ID = "CartPole-v1"
NUM_TRANSITIONS = 20_000
SEED = 0
FILENAME = "cartpole-random-v0.npz"


def collect(num_transitions: int = NUM_TRANSITIONS, seed: int = SEED) -> dict[str, np.ndarray]:
    """Run the random policy for ``num_transitions`` steps and return the arrays."""
    import gymnasium as gym

    n = num_transitions
    obs_dim = 4
    out: dict[str, np.ndarray] = {
        "observation": np.empty((n, obs_dim), dtype=np.float32),
        "action": np.empty((n,), dtype=np.int64),
        "next_observation": np.empty((n, obs_dim), dtype=np.float32),
        "next_reward": np.empty((n, 1), dtype=np.float32),
        "next_done": np.empty((n, 1), dtype=bool),
        "next_terminated": np.empty((n, 1), dtype=bool),
        "next_truncated": np.empty((n, 1), dtype=bool),
    }
    env = gym.make(ENV_ID)
    try:
        env.action_space.seed(seed)
        obs, _ = env.reset(seed=seed)
        for t in range(n):
            action = env.action_space.sample()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            out["observation"][t] = obs
            out["action"][t] = action
            out["next_observation"][t] = next_obs
            out["next_reward"][t] = reward
            out["next_terminated"][t] = terminated
            out["next_truncated"][t] = truncated
            out["next_done"][t] = terminated or truncated
            # Later resets continue the environment's seeded RNG: no reseeding needed.
            obs = env.reset()[0] if terminated or truncated else next_obs
    finally:
        env.close()
    return out


def build(path: str | os.PathLike[str]) -> None:
    """Collect the dataset and write it to ``path`` (a ``.npz`` file), atomically."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    arrays = collect()
    # np.savez_compressed appends ".npz" to names without it: keep the suffix on the temp file.
    tmp = target.with_name(f".{target.stem}.tmp-{os.getpid()}.npz")
    try:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


if __name__ == "__main__":
    out = Path(__file__).with_name(FILENAME)
    build(out)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.3f} MB)")
