"""A brute-force model of slice starts in a ring, shared by the slice sampler tests.

Independent of rbdata's episode index: it looks at every retained step's episode id.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rbdata import ReplayBuffer

__all__ = ["brute_spans", "episodes", "fill", "slot_of"]


def episodes(lengths: list[int], start_time: int = 0, first_episode: int = 0) -> TensorDict:
    """Steps of consecutive episodes: absolute time ``t``, ``episode`` id and done flags."""
    eps = torch.cat([torch.full((n,), first_episode + i) for i, n in enumerate(lengths)])
    done = torch.zeros(len(eps), 1, dtype=torch.bool)
    done[torch.cumsum(torch.tensor(lengths), 0) - 1] = True
    t = torch.arange(start_time, start_time + len(eps))
    return TensorDict({"t": t, "episode": eps, ("next", "done"): done}, batch_size=[len(eps)])


def brute_spans(episode_of: list[int], capacity: int, length: int, strict: bool) -> dict[int, int]:
    """Valid start time -> real steps of its slice, by looking at every retained step.

    ``episode_of[t]`` is the episode of time ``t`` (every step ever written, in order); the
    ring keeps the last ``capacity``. Strict: the ``length`` steps from the start are retained
    and share its episode. Else also: the first retained step of an episode with fewer than
    ``length`` retained steps (the slice is that whole run).
    """
    total = len(episode_of)
    oldest = max(0, total - capacity)
    out = {}
    for s in range(oldest, total):
        run = 0
        while s + run < total and episode_of[s + run] == episode_of[s]:
            run += 1
        if run >= length:
            out[s] = length
        elif not strict and (s == oldest or episode_of[s - 1] != episode_of[s]):
            out[s] = run
    return out


def fill(rb: ReplayBuffer, lengths: list[int], sizes: list[int]) -> list[int]:
    """Write the steps of episodes of ``lengths`` in extends of ``sizes`` steps (clipped to
    the capacity and to the steps there are); return the episode of every written step.

    The written steps may stop inside an episode: it is then still running.
    """
    capacity = rb.storage.capacity  # type: ignore[attr-defined]
    steps = episodes(lengths)
    total = steps.batch_size[0]
    time = 0
    for size in sizes:
        size = min(size, capacity, total - time)
        if size <= 0:
            break
        rb.extend(steps[time : time + size])
        time += size
    return steps["episode"][:time].tolist()


def slot_of(time: int, capacity: int) -> int:
    """The slot of time ``time`` in a ring written from slot 0."""
    return time % capacity
