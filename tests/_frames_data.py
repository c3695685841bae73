"""Pixel transitions as env streams write them, and the reference they are checked against.

:func:`rollout` plays ``n_envs`` independent env streams with random episode lengths: each env
step makes one new frame (sometimes a repeat of the last one, as a paused screen), an episode
start repeats its first frame over the stack (gymnasium's ``FrameStackObservation`` padding)
or pads with zeros, and the step that ends an episode has the final stack as its next
observation. The reference for every read is the plain stacks themselves.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["rollout", "stacks_of"]


def rollout(
    steps: int,
    n_envs: int = 1,
    stack: int = 4,
    frame: tuple[int, ...] = (6, 5),
    seed: int = 0,
    mean_episode: int = 12,
    zero_pad: bool = False,
    repeat_p: float = 0.1,
) -> TensorDict:
    """``steps`` env steps of ``n_envs`` streams, in env-step order: ``[steps * n_envs]``.

    Item ``t * n_envs + e`` is env ``e``'s transition at env step ``t`` (what a vectorised
    env writes as one batch of ``n_envs`` per step).
    """
    rng = np.random.default_rng(seed)
    obs = np.zeros((steps, n_envs, stack, *frame), np.uint8)
    nxt = np.zeros_like(obs)
    done = np.zeros((steps, n_envs), bool)
    action = rng.integers(0, 6, (steps, n_envs))
    for e in range(n_envs):
        current = None
        for t in range(steps):
            if current is None:  # an episode starts
                first = rng.integers(0, 256, frame, dtype=np.uint8)
                current = (
                    np.zeros((stack, *frame), np.uint8) if zero_pad else np.stack([first] * stack)
                )
                current[-1] = first
            if rng.random() < repeat_p:
                new = current[-1].copy()
            else:
                new = rng.integers(0, 256, frame, dtype=np.uint8)
            after = np.concatenate([current[1:], new[None]])
            obs[t, e], nxt[t, e] = current, after
            done[t, e] = rng.random() < 1.0 / mean_episode
            current = None if done[t, e] else after
    n = steps * n_envs
    return TensorDict(
        {
            "observation": torch.from_numpy(obs.reshape(n, stack, *frame)),
            ("next", "observation"): torch.from_numpy(nxt.reshape(n, stack, *frame)),
            "action": torch.from_numpy(action.reshape(n)),
            ("next", "done"): torch.from_numpy(done.reshape(n, 1)),
            ("next", "reward"): torch.from_numpy(rng.normal(size=(n, 1)).astype(np.float32)),
        },
        batch_size=[n],
    )


def stacks_of(batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """The two stacks of a batch read back."""
    return batch["observation"], batch["next", "observation"]
