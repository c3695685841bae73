"""The SB3-compatible ``PrioritizedReplayBuffer`` and its samples (see :mod:`rbdata.compat.sb3`)."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
import torch

from rbdata.compat.sb3._buffer import ReplayBuffer, positive_int, quiet_generator
from rbdata.compat.sb3._frames import wants_frames
from rbdata.errors import EmptyBufferError
from rbdata.samplers.base import Sampler
from rbdata.samplers.prioritized import PrioritizedSampler
from rbdata.storages.base import Storage

__all__ = ["PrioritizedReplayBuffer", "PrioritizedReplayBufferSamples"]


class PrioritizedReplayBufferSamples(NamedTuple):
    """:class:`ReplayBufferSamples` plus ``indices`` ``[B]`` and importance ``weights`` ``[B, 1]``.

    ``indices`` are flat transition indices ``slot * n_envs + env``, for
    :meth:`PrioritizedReplayBuffer.update_priorities`.
    """

    observations: torch.Tensor
    actions: torch.Tensor
    next_observations: torch.Tensor
    dones: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor | None = None
    indices: torch.Tensor | None = None
    weights: torch.Tensor | None = None


class PrioritizedReplayBuffer(ReplayBuffer):
    """:class:`ReplayBuffer` with proportional prioritized sampling (Schaul et al., 2016).

    Every ``(slot, env)`` transition has a priority; new ones get the highest seen so far.
    ``sample`` returns :class:`PrioritizedReplayBufferSamples` whose ``indices`` go back to
    :meth:`update_priorities` with the new priorities (e.g. ``|TD error|``).

    A buffer sampled ``warn_after_samples`` times with no :meth:`update_priorities` call in
    between warns once (a ``UserWarning``): its priorities do not follow the learning (never
    updated, they are all equal and it samples uniformly). SB3's ``DQN`` never updates
    priorities; :class:`PrioritizedDQN` does.

    Args:
        alpha: prioritization exponent (0: uniform).
        beta: importance-sampling exponent; assign ``rb.beta`` to anneal it.
        eps: added to every priority before the exponent.
        *args: as :class:`ReplayBuffer`.
        **kwargs: as :class:`ReplayBuffer` (``optimize_memory_usage`` must be ``False``,
            except with ``storage="frames"``).

    Examples:
        >>> import numpy as np
        >>> from gymnasium import spaces
        >>> rb = PrioritizedReplayBuffer(
        ...     100, spaces.Box(-1, 1, (3,)), spaces.Discrete(2), "cpu", alpha=0.6, beta=0.4
        ... )
        >>> for i in range(4):
        ...     obs = np.full((1, 3), i, np.float32)
        ...     rb.add(obs, obs, np.array([0]), np.array([1.0]), np.array([False]), [{}])
        >>> rb.update_priorities(np.arange(4), np.array([0.0, 0.0, 5.0, 0.0]))
        >>> batch = rb.sample(8)
        >>> batch.indices.unique().tolist(), batch.weights.shape
        ([2], torch.Size([8, 1]))
    """

    #: ``sample`` calls with no :meth:`update_priorities` in between after which the buffer
    #: warns, once (``None``: never); assignable per buffer
    warn_after_samples: int | None = 1000
    _unupdated_samples = 0  # class defaults: buffers pickled before these existed load too
    _warned_unupdated = False

    def __init__(
        self,
        *args: Any,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        **kwargs: Any,
    ) -> None:
        self._per = (alpha, beta, eps)
        optimize = kwargs.get("optimize_memory_usage", args[5] if len(args) > 5 else False)
        if optimize and not wants_frames(kwargs.get("storage")):  # frames: next obs stored
            raise NotImplementedError(
                "optimize_memory_usage=True: PrioritizedReplayBuffer cannot skip the slot "
                "whose next observation is not written yet; use optimize_memory_usage=False"
            )
        super().__init__(*args, **kwargs)

    def _new_sampler(self, storage: Storage, generator: torch.Generator | None) -> Sampler:
        alpha, beta, eps = self._per
        gen = generator or quiet_generator()
        return PrioritizedSampler(storage.capacity, alpha, beta, eps, generator=gen)

    @property
    def beta(self) -> float:
        """The importance-sampling exponent of the next samples (assignable)."""
        return float(self._sampler.beta)  # type: ignore[attr-defined]

    @beta.setter
    def beta(self, value: float) -> None:
        if not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            raise ValueError(f"beta: expected a finite number >= 0, got {value!r}")
        self._sampler.beta = float(value)  # type: ignore[attr-defined]

    def _bind(self, storage: Storage, sampler: Sampler) -> None:
        super()._bind(storage, sampler)
        self._pending = 0  # steps added since the sampler last heard of writes
        self._pending_from = 0

    def _written(self, pos: int) -> None:
        # new transitions get their priority when it matters (sample, update, checkpoint):
        # no priority changes in between, so the highest-seen default is the same
        if not self._pending:
            self._pending_from = pos
        self._pending += 1

    def _sync(self) -> None:
        super()._sync()
        count = self._pending
        if not count:
            return
        n, slots = self.n_envs, self.buffer_size
        if count >= slots:
            index = torch.arange(slots * n)
        else:
            first = torch.arange(self._pending_from, self._pending_from + count) % slots
            index = (first[:, None] * n + torch.arange(n)).reshape(-1)
        self._sampler.on_write(index, None)
        self._pending = 0

    def reset(self) -> None:
        """Forget every transition and priority."""
        super().reset()
        self._pending = 0

    def sample(self, batch_size: int, env: Any = None) -> PrioritizedReplayBufferSamples:
        """Draw ``batch_size`` transitions proportionally to their priorities."""
        batch_size = positive_int(batch_size, "batch_size")
        self._sync()
        if self.size() == 0:
            raise EmptyBufferError("cannot sample: the buffer is empty (add first)")
        index, extras = self._sampler.draw(batch_size)
        self._count_unupdated()
        obs, actions, next_obs, dones, rewards = self._gather(index, env)
        weights = extras["weight"].reshape(-1, 1).to(self.device)
        return PrioritizedReplayBufferSamples(
            obs, actions, next_obs, dones, rewards, None, index.to(self.device), weights
        )

    def _count_unupdated(self) -> None:
        """Count a sample with no priority update since; warn once past the threshold."""
        self._unupdated_samples += 1
        limit = self.warn_after_samples
        if self._warned_unupdated or limit is None or self._unupdated_samples < limit:
            return
        self._warned_unupdated = True
        warnings.warn(
            f"PrioritizedReplayBuffer: sampled {self._unupdated_samples} times with no "
            "update_priorities call in between: priorities change only through "
            "update_priorities, so they do not follow the learning (never updated, they are "
            "all equal: sampling is uniform and every importance weight is 1). SB3's DQN "
            "never updates priorities: train with rbdata.compat.sb3.PrioritizedDQN, or call "
            "update_priorities(batch.indices, |TD error|) after each sample.",
            UserWarning,
            stacklevel=3,
        )

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """Set the priorities of the transitions at ``indices`` (from a sample).

        ``priorities`` may be a tensor of any shape with one value per index (e.g. ``[B, 1]``
        TD errors, on any device, with grad): it is detached and flattened.

        Raises:
            ValueError: for NaN or negative priorities, or an index out of range;
                no priority is changed then.
        """
        self._sync()
        if isinstance(indices, torch.Tensor):
            indices = indices.detach().to("cpu")
        if isinstance(priorities, torch.Tensor):
            priorities = priorities.detach().to("cpu", torch.float64).reshape(-1)
        else:
            priorities = np.asarray(priorities, dtype=np.float64).reshape(-1)
        self._sampler.update_priority(indices, priorities)  # type: ignore[attr-defined]
        self._unupdated_samples = 0
