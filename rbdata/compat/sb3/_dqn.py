"""``PrioritizedDQN``: SB3's ``DQN`` that trains on prioritized replay (imports SB3).

Reached as ``rbdata.compat.sb3.PrioritizedDQN``, lazily: importing :mod:`rbdata.compat.sb3`
does not import stable-baselines3; the first use of this name does.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import torch
from stable_baselines3 import DQN
from torch.nn import functional as F

from rbdata.compat.sb3._prioritized import PrioritizedReplayBuffer

__all__ = ["PrioritizedDQN"]


def _exponent(value: Any, name: str) -> float:
    """``value`` as a float if it is a finite number >= 0, else a ValueError naming ``name``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    return float(value)


class PrioritizedDQN(DQN):
    """Stable-Baselines3's ``DQN`` with prioritized experience replay (Schaul et al., 2016).

    Everything is SB3's ``DQN`` (same arguments, ``learn``, ``predict``, ``save``/``load``)
    except the replay buffer, a :class:`PrioritizedReplayBuffer`, and :meth:`train`, which is
    ``DQN.train`` step for step with two changes: the Huber loss of each sampled transition is
    multiplied by its importance weight before the mean (:meth:`weighted_huber_loss`), and
    after each gradient step the batch's priorities become its ``|TD error|`` (computed
    before the step, detached). A transition is then drawn with probability proportional to
    ``(|TD error| + priority_eps) ** alpha``; new transitions get the highest priority seen
    so far. With ``alpha=0`` sampling is uniform, every weight is 1, and :meth:`train` is
    exactly ``DQN.train``.

    The importance-sampling exponent goes linearly from ``beta`` to ``beta_final`` with SB3's
    training progress (``1 - _current_progress_remaining``, what the learning-rate schedule
    reads): ``beta`` at the start of ``learn``, ``beta_final`` at ``total_timesteps``. It is
    logged as ``train/beta``. ``beta_final=beta`` keeps it constant.

    Args:
        policy: as ``DQN`` (``"MlpPolicy"``, ``"CnnPolicy"``, a policy class).
        env: as ``DQN`` (an environment or its registered id). ``Dict`` observation spaces
            are not supported (the buffer refuses them).
        alpha: prioritization exponent (0: uniform sampling).
        beta: importance-sampling exponent at the start of training.
        beta_final: importance-sampling exponent at the end of training.
        priority_eps: added to every priority before the exponent, so that a transition
            with a TD error of 0 can still be drawn.
        replay_buffer_class: ``None`` (:class:`PrioritizedReplayBuffer`) or a subclass of it.
        replay_buffer_kwargs: more arguments of the buffer (``storage``, ``generator``, ...);
            not ``alpha``, ``beta`` nor ``eps``, which come from the arguments above.
        n_steps: must be 1 (n-step returns need SB3's ``NStepReplayBuffer``).
        **dqn_kwargs: the other arguments of ``stable_baselines3.DQN``.

    Raises:
        ValueError: for an exponent that is not a finite number >= 0, a
            ``replay_buffer_class`` that is not prioritized, PER arguments given in
            ``replay_buffer_kwargs``, or ``n_steps`` other than 1.

    Examples:
        >>> model = PrioritizedDQN(
        ...     "MlpPolicy", "CartPole-v1", alpha=0.6, beta=0.4, buffer_size=500, learning_starts=50
        ... )
        >>> _ = model.learn(80)
        >>> type(model.replay_buffer).__name__, model.replay_buffer.beta > 0.4
        ('PrioritizedReplayBuffer', True)
    """

    def __init__(
        self,
        policy: Any,
        env: Any,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_final: float = 1.0,
        priority_eps: float = 1e-6,
        replay_buffer_class: type[PrioritizedReplayBuffer] | None = None,
        replay_buffer_kwargs: dict[str, Any] | None = None,
        n_steps: int = 1,
        **dqn_kwargs: Any,
    ) -> None:
        self.alpha = _exponent(alpha, "alpha")
        self.beta = _exponent(beta, "beta")
        self.beta_final = _exponent(beta_final, "beta_final")
        self.priority_eps = _exponent(priority_eps, "priority_eps")
        if replay_buffer_class is None:
            replay_buffer_class = PrioritizedReplayBuffer
        elif not (
            isinstance(replay_buffer_class, type)
            and issubclass(replay_buffer_class, PrioritizedReplayBuffer)
        ):
            raise ValueError(
                "replay_buffer_class: PrioritizedDQN needs rbdata.compat.sb3."
                f"PrioritizedReplayBuffer or a subclass, got {replay_buffer_class!r}"
            )
        kwargs = dict(replay_buffer_kwargs or {})
        given = sorted({"alpha", "beta", "eps"} & kwargs.keys())
        if given:
            raise ValueError(
                f"replay_buffer_kwargs: {given} are PrioritizedDQN's own arguments "
                "(alpha=, beta=, beta_final=, priority_eps=); pass them there"
            )
        kwargs.update(alpha=self.alpha, beta=self.beta, eps=self.priority_eps)
        if n_steps != 1:
            raise ValueError(
                f"n_steps: PrioritizedDQN supports 1-step returns only, got {n_steps!r}"
            )
        super().__init__(
            policy,
            env,
            replay_buffer_class=cast(Any, replay_buffer_class),  # SB3's: a virtual subclass
            replay_buffer_kwargs=kwargs,
            n_steps=1,
            **dqn_kwargs,
        )

    def current_beta(self) -> float:
        """The importance-sampling exponent at the current training progress.

        Examples:
            >>> model = PrioritizedDQN("MlpPolicy", "CartPole-v1", beta=0.4, buffer_size=100)
            >>> model._current_progress_remaining = 0.25  # SB3's progress: 3/4 of the way
            >>> round(model.current_beta(), 6)
            0.85
        """
        done = 1.0 - float(self._current_progress_remaining)
        return self.beta + (self.beta_final - self.beta) * min(max(done, 0.0), 1.0)

    @staticmethod
    def weighted_huber_loss(
        current: torch.Tensor, target: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """``mean(weights * smooth_l1(current - target))``: DQN's Huber loss, importance-weighted.

        With all weights 1 it is ``F.smooth_l1_loss(current, target)``, ``DQN.train``'s loss.

        Examples:
            >>> current = torch.tensor([[0.0], [3.0]])
            >>> target = torch.tensor([[0.5], [0.0]])
            >>> PrioritizedDQN.weighted_huber_loss(current, target, torch.tensor([[1.0], [0.5]]))
            tensor(0.6875)
        """
        per_item = F.smooth_l1_loss(current, target, reduction="none")
        return (weights * per_item).mean()

    def _prioritized_buffer(self) -> PrioritizedReplayBuffer:
        buffer = self.replay_buffer
        if not isinstance(buffer, PrioritizedReplayBuffer):
            raise TypeError(
                "replay_buffer: PrioritizedDQN trains on a rbdata.compat.sb3."
                f"PrioritizedReplayBuffer, found {type(buffer).__name__} (load_replay_buffer "
                "replaced it?)"
            )
        return buffer

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        """``DQN.train`` with importance weights and priority updates (see the class).

        Args:
            gradient_steps: gradient steps, one sampled batch each.
            batch_size: transitions per batch.
        """
        buffer = self._prioritized_buffer()
        # Switch to train mode (this affects batch norm / dropout)
        self.policy.set_training_mode(True)
        # Update learning rate according to schedule
        self._update_learning_rate(self.policy.optimizer)
        buffer.beta = self.current_beta()

        losses = []
        for _ in range(gradient_steps):
            replay_data = buffer.sample(batch_size, env=self._vec_normalize_env)
            weights, indices = replay_data.weights, replay_data.indices
            assert weights is not None and indices is not None  # always set by sample
            # For n-step replay, discount factor is gamma**n_steps (when no early termination)
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma

            with torch.no_grad():
                # Compute the next Q-values using the target network
                next_q_values = self.q_net_target(replay_data.next_observations)
                # Follow greedy policy: use the one with the highest value
                next_q_values, _ = next_q_values.max(dim=1)
                # Avoid potential broadcast issue
                next_q_values = next_q_values.reshape(-1, 1)
                # 1-step TD target
                target_q_values = (
                    replay_data.rewards + (1 - replay_data.dones) * discounts * next_q_values
                )

            # Get current Q-values estimates
            current_q_values = self.q_net(replay_data.observations)
            # Retrieve the q-values for the actions from the replay buffer
            current_q_values = torch.gather(
                current_q_values, dim=1, index=replay_data.actions.long()
            )

            # Importance-weighted Huber loss
            loss = self.weighted_huber_loss(current_q_values, target_q_values, weights)
            losses.append(loss.item())
            td_error = (current_q_values - target_q_values).detach().abs()

            # Optimize the policy
            self.policy.optimizer.zero_grad()
            loss.backward()
            # Clip gradient norm
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()

            # New priorities: |TD error| (the buffer adds priority_eps before alpha)
            buffer.update_priorities(indices, td_error)

        # Increase update counter
        self._n_updates += gradient_steps

        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))
        self.logger.record("train/beta", buffer.beta)
