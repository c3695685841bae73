"""SB3's ``DictReplayBuffer`` (``Dict`` observation spaces) on an rbdata storage."""

from __future__ import annotations

import os
from typing import Any

import torch

from rbdata.compat import _sb3_spaces as spaces
from rbdata.compat._sb3_buffer import ReplayBuffer
from rbdata.compat._sb3_register import counterpart_of
from rbdata.compat._sb3_samples import DictReplayBufferSamples
from rbdata.storages.base import Storage

__all__ = ["DictReplayBuffer"]


@counterpart_of("DictReplayBuffer")
class DictReplayBuffer(ReplayBuffer):
    """Stable-Baselines3's ``DictReplayBuffer``: :class:`ReplayBuffer` for ``Dict`` spaces.

    Each key of the observation space is a leaf of its own, ``("observation", key)`` and
    ``("next", "observation", key)`` in the storage; ``observations`` and
    ``next_observations`` are dicts of views ``[buffer_size, n_envs, ...]`` of them, and
    samples are :class:`DictReplayBufferSamples` whose observations are dicts of tensors.
    SB3's ``HerReplayBuffer`` runs on it (it reads and writes those arrays).

    Args:
        buffer_size: as :class:`ReplayBuffer`.
        observation_space: a gymnasium ``Dict`` of ``Box``, ``Discrete``,
            ``MultiDiscrete`` or ``MultiBinary`` spaces.
        action_space: as :class:`ReplayBuffer`.
        device: as :class:`ReplayBuffer`.
        n_envs: as :class:`ReplayBuffer`.
        optimize_memory_usage: must be ``False`` (as in SB3).
        handle_timeout_termination: as :class:`ReplayBuffer`.
        storage: as :class:`ReplayBuffer`; with ``"frames"`` (or a
            :class:`~rbdata.storages.FrameStackStorage`), the stacks of key ``frames_key``
            go to the frame storage, under ``("observation", frames_key)``, and the other keys
            are stored as usual.
        path: as :class:`ReplayBuffer`.
        generator: as :class:`ReplayBuffer`.
        codec: as :class:`ReplayBuffer` (``storage="frames"`` only).
        frames_key: the key whose image stacks are stored as frames (``storage="frames"``
            only); ``None``: the space's only key of a 3-D or 4-D ``Box``.

    Raises:
        TypeError: if ``observation_space`` is not a ``Dict`` space.
        ValueError: with ``optimize_memory_usage=True``; with ``frames_key`` (or ``codec``)
            but no frame storage, or no such key (none, or several image keys, if ``None``).

    Examples:
        >>> import numpy as np
        >>> from gymnasium import spaces
        >>> space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "goal": spaces.Discrete(4)})
        >>> rb = DictReplayBuffer(10, space, spaces.Discrete(2), device="cpu")
        >>> obs = {"pos": np.zeros((1, 2), np.float32), "goal": np.array([3])}
        >>> rb.add(obs, obs, np.array([1]), np.array([0.5]), np.array([False]), [{}])
        >>> batch = rb.sample(4)
        >>> batch.observations["pos"].shape, batch.next_observations["goal"].tolist()
        (torch.Size([4, 2]), [[3], [3], [3], [3]])
        >>> rb.observations["goal"].shape, int(rb.observations["goal"][0, 0, 0])
        ((10, 1, 1), 3)
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: Any,
        action_space: Any,
        device: torch.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        *,
        storage: str | Storage = "tensor",
        path: str | os.PathLike[str] | None = None,
        generator: torch.Generator | None = None,
        codec: str | tuple[str, int] | None = None,
        frames_key: str | None = None,
    ) -> None:
        self._frames_key = frames_key
        if optimize_memory_usage:
            raise ValueError(
                "optimize_memory_usage: DictReplayBuffer does not support "
                "optimize_memory_usage (as in SB3)"
            )
        super().__init__(
            buffer_size,
            observation_space,
            action_space,
            device,
            n_envs,
            False,
            handle_timeout_termination,
            storage=storage,
            path=path,
            generator=generator,
            codec=codec,
        )

    def _obs_specs(self, observation_space: Any) -> Any:
        return spaces.dict_obs_specs(observation_space)

    def _samples(self, *fields: Any) -> Any:
        return DictReplayBufferSamples(*fields)
