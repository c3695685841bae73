"""``HindsightRelabel``: hindsight experience replay (HER) as a transform of sampled batches.

The transform keeps its own :class:`~rbdata.transforms.EpisodeIndex` of the storage (so it
works with any sampler), draws every item's goal step in one numba pass over the batch
(``_goals.py``), gathers the goals with one read of one column of the storage, and calls the
reward function once on the whole batch. The storage is never written.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbdata._core.layout import Key
from rbdata._core.layout.keys import key_name
from rbdata.errors import MissingKeyError
from rbdata.transforms._batch import (
    check_probs,
    check_ratio,
    get_entry,
    leaf_names,
    put_entry,
    sampled_index,
)
from rbdata.transforms._goals import STRATEGIES, goal_draw, uniforms
from rbdata.transforms._relabel_cpu import CpuRelabel, blend_rewards
from rbdata.transforms.episodes import EpisodeIndex, as_key, read_column

__all__ = ["HindsightRelabel"]

RewardFn = Callable[[torch.Tensor, torch.Tensor, Any], Any]


class HindsightRelabel:
    """Replace the desired goal of a fraction of each batch by a goal the episode achieved.

    For ``int(her_ratio * batch_size)`` items chosen at random (Stable-Baselines3's count:
    its ``n_sampled_goal=4`` is ``her_ratio=0.8``), the desired goal becomes the achieved goal
    of a step of the same episode, and the reward becomes ``reward_fn(achieved, desired,
    info)``. The other items are returned bitwise as sampled. Strategies (``t`` is the item's
    step, ``[s, e]`` its episode's steps in the storage):

    - ``"future"``: a step uniform over ``[t, e]``, the current step included (SB3's
      definition);
    - ``"final"``: the step ``e``;
    - ``"episode"``: a step uniform over ``[s, e]``;
    - ``"ogbench"``: OGBench's ``GCDataset.sample_goals``: the step ``t`` with probability
      ``goal_probs[0]``, a later step of the episode with ``goal_probs[1]`` (``min(t + k,
      e)`` with ``k >= 1`` geometric of parameter ``1 - discount`` if ``geom_sample``, else
      OGBench's ``round(a * v + e * (1 - v))``, ``a = min(t + 1, e)``, ``v`` uniform), a step
      uniform over the whole storage with ``goal_probs[2]``.

    The goal of step ``t'`` and the achieved goal passed to ``reward_fn`` follow each
    convention: for ``future``/``final``/``episode`` they are ``("next", *achieved_key)``
    (the goal the step *reached*, as SB3 and gymnasium-robotics' ``compute_reward(next
    achieved_goal, desired_goal, info)``); for ``ogbench`` they are ``achieved_key`` itself
    (OGBench's goals are observations, its success is "this step's state is the goal").
    The new goal is also written to ``("next", *desired_key)`` when the batch has it.

    Episodes come from the end flags (``end_key``, or an episode id ``traj_key``) through an
    :class:`~rbdata.transforms.EpisodeIndex` that follows the storage's writes, which must go
    in time order through a ring (:class:`~rbdata.RoundRobinWriter`, offline datasets). An
    episode cut by the ring starts at the oldest step held; an episode still running ends, for
    ``future`` and ``final``, at the newest step written: no goal is ever taken past it.

    The output batch carries ``"goal_index"``, the slot of each item's goal step (``-1``
    where not relabeled), next to the sampler's ``"index"``.

    Args:
        storage: the storage the batches are sampled from.
        strategy: ``"future"``, ``"final"``, ``"episode"`` or ``"ogbench"``.
        her_ratio: fraction of each batch relabeled, in ``[0, 1]``.
        reward_fn: ``reward_fn(achieved, desired, info)`` → one reward per item (a tensor or
            array of ``batch_size`` or ``(batch_size, 1)`` values), called once per batch on
            every item; ``info`` is the relabeled batch (its ``"info"`` entries, ``"index"``,
            ``"goal_index"``). Its rewards replace the stored ones on the relabeled items.
        achieved_key: the achieved goal in an item's observation.
        desired_key: the desired goal (created if the items have none and ``her_ratio`` is 1).
        reward_key: the reward (created, shape ``(batch_size, 1)``, if the items have none).
        generator: random generator (``None``: a private one seeded from torch's global RNG).
        end_key: key of the per-step end flag.
        traj_key: key of a per-step episode id, used instead of ``end_key`` when given.
        goal_probs: ``ogbench`` only: ``(p_cur, p_traj, p_random)``, summing to 1 (default:
            OGBench's value goals, ``(0.2, 0.5, 0.3)``).
        geom_sample: ``ogbench`` only: geometric (``True``, default) or uniform later steps.
        discount: ``ogbench`` only: the geometric draw's discount, in ``[0, 1)``.

    Raises:
        ValueError: for an unknown strategy, ``her_ratio`` outside ``[0, 1]``, bad
            ``goal_probs`` or ``discount``, or OGBench options with another strategy.

    Examples:
        >>> import torch
        >>> from rbdata import ReplayBuffer, TensorStorage
        >>> storage = TensorStorage(100)
        >>> reached = lambda a, d, info: (a == d).all(-1).float()  # 1 when the goal is reached
        >>> her = HindsightRelabel(storage, reward_fn=reached, her_ratio=1.0)
        >>> rb = ReplayBuffer(storage, transform=her)
        >>> pos = torch.arange(11.0).unsqueeze(1)  # one episode: positions 0, 1, ..., 10
        >>> done = torch.arange(10).eq(9).unsqueeze(1)
        >>> obs = {"achieved_goal": pos[:-1], "desired_goal": torch.full((10, 1), 99.0)}
        >>> _ = rb.extend({"observation": obs, "next": {"observation": {"achieved_goal": pos[1:]},
        ...     "reward": torch.zeros(10, 1), "done": done}})
        >>> batch = rb.sample(64)
        >>> goal = batch["observation", "desired_goal"]
        >>> bool((goal > batch["observation", "achieved_goal"]).all())  # a later position
        True
        >>> bool((batch["next", "reward"] == (goal == batch["next", "observation",
        ...     "achieved_goal"]).float()).all())
        True
    """

    def __init__(
        self,
        storage: Any,
        *,
        strategy: str = "future",
        her_ratio: float = 0.8,
        reward_fn: RewardFn,
        achieved_key: str | tuple[str, ...] = ("observation", "achieved_goal"),
        desired_key: str | tuple[str, ...] = ("observation", "desired_goal"),
        reward_key: str | tuple[str, ...] = ("next", "reward"),
        generator: torch.Generator | None = None,
        end_key: str | tuple[str, ...] = ("next", "done"),
        traj_key: str | tuple[str, ...] | None = None,
        goal_probs: Sequence[float] | None = None,
        geom_sample: bool | None = None,
        discount: float | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {sorted(STRATEGIES)}, got {strategy!r}")
        if not callable(reward_fn):
            raise TypeError(f"reward_fn must be callable, got {type(reward_fn).__name__}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        ogbench = strategy == "ogbench"
        given = [n for n, v in [("goal_probs", goal_probs), ("geom_sample", geom_sample),
                                ("discount", discount)] if v is not None]  # fmt: skip
        if given and not ogbench:
            raise ValueError(f"{', '.join(given)}: only for strategy='ogbench'")
        self.goal_probs = check_probs((0.2, 0.5, 0.3) if goal_probs is None else goal_probs)
        self.geom_sample = True if geom_sample is None else bool(geom_sample)
        self.discount = 0.99 if discount is None else float(discount)
        if not 0.0 <= self.discount < 1.0:
            raise ValueError(f"discount must be in [0, 1), got {discount!r}")
        self.episodes = EpisodeIndex(storage, end_key=end_key, traj_key=traj_key)
        self.storage = storage
        self.strategy = strategy
        self.her_ratio = her_ratio  # checked by the setter
        self.reward_fn = reward_fn
        self.achieved_key = as_key(achieved_key, "achieved_key")
        self.desired_key = as_key(desired_key, "desired_key")
        self.reward_key = as_key(reward_key, "reward_key")
        #: the key goals are read from (and the achieved goal ``reward_fn`` gets)
        self.goal_key: Key = self.achieved_key if ogbench else ("next", *self.achieved_key)
        #: where the next step's desired goal is (blended as well where the batch has it)
        self.next_desired_key: Key = ("next", *self.desired_key)
        #: the strategy's code in the kernels (``_goals.STRATEGIES``)
        self.code = STRATEGIES[strategy]
        self._log_discount = math.log(self.discount) if self.discount > 0 else -math.inf
        #: held while the episode index and the kernel scratch are in use (one transform may
        #: be called from several threads, as by a ``torchdata.nodes.ParallelMapper``)
        self.draw_lock = threading.Lock()
        self._cpu = self._cpu_path()
        self._seed = torch.empty(64, dtype=torch.int64)
        self._seeds: list[int] = []  # drawn, not used yet (in reverse order)
        if generator is None:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            generator = torch.Generator().manual_seed(seed)
        self.generator = generator

    def __repr__(self) -> str:
        return (
            f"HindsightRelabel(strategy={self.strategy!r}, her_ratio={self.her_ratio}, "
            f"goal_key={key_name(self.goal_key)}, desired_key={key_name(self.desired_key)})"
        )

    @property
    def her_ratio(self) -> float:
        """The fraction of each batch relabeled, in ``[0, 1]`` (assignable, e.g. annealed)."""
        return self._her_ratio

    @her_ratio.setter
    def her_ratio(self, value: float) -> None:
        self._her_ratio = check_ratio(value)

    # --- the draw -----------------------------------------------------------------------------
    def seed(self) -> int:
        """A batch's seed: the generator's next 63-bit draw (its uniforms: ``uniforms``).

        The draws are taken from the generator 64 at a time (the same numbers, in the same
        order, as one by one); :meth:`state_dict` keeps the ones not used yet.
        """
        seeds = self._seeds
        if not seeds:
            seeds.extend(self._seed.random_(generator=self.generator).tolist())
            seeds.reverse()
        return seeds.pop()

    def _cpu_path(self) -> CpuRelabel:
        """The CPU path (its own goal column plan and scratch), sharing the lock and the draws."""
        return CpuRelabel(
            self.episodes,
            goal_key=self.goal_key,
            desired_key=self.desired_key,
            reward_key=self.reward_key,
            code=self.code,
            goal_probs=self.goal_probs,
            log_discount=self._log_discount if self.geom_sample else math.nan,
            lock=self.draw_lock,
            sync=self.sync,
            seed=self.seed,
        )

    def sync(self) -> None:
        """Bring the episode index up to date with the storage.

        Raises:
            ValueError: if the storage is empty.
        """
        episodes = self.episodes
        episodes.sync()
        if episodes.time == 0:
            raise ValueError("HindsightRelabel: the storage is empty")

    def _draw(self, index: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(goal, read, mask)`` of :func:`~rbdata.transforms._goals.goal_draw` for ``index``."""
        n = int(index.shape[0])
        slots = index.numpy() if index.device.type == "cpu" else index.cpu().numpy()
        with self.draw_lock:
            self.sync()
            episodes = self.episodes
            return goal_draw(
                slots.astype(np.int64, copy=False),
                uniforms(self.seed(), n),
                episodes.ends,
                episodes.time,
                episodes.base,
                episodes.capacity,
                self.code,
                int(self.her_ratio * n),
                self.goal_probs,
                self.geom_sample,
                self._log_discount,
            )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["draw_lock"] = None  # a lock does not pickle: a new one on arrival
        state["_cpu"] = None  # nor does it: a new CPU path, sharing the new one
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.draw_lock = threading.Lock()
        self._cpu = self._cpu_path()

    def goal_slots(self, index: torch.Tensor) -> torch.Tensor:
        """The goal slot of each sampled slot in ``index`` (``-1``: not relabeled).

        Draws one seed from the generator (:meth:`seed`), the same draws as a relabeled
        batch; the episode index is synced with the storage first.
        """
        return torch.from_numpy(self._draw(index)[0])

    def __call__(self, batch: Any) -> Any:
        """Relabel a sampled batch (a TensorDict carrying ``"index"``); return it."""
        if type(batch) is TensorDict and self._cpu.relabel_batch(
            batch, self._her_ratio, self.reward_fn
        ):
            return batch  # the CPU fast path did the whole batch
        index = sampled_index(batch, "HindsightRelabel")
        achieved = get_entry(batch, self.goal_key)
        if not isinstance(achieved, torch.Tensor):
            raise MissingKeyError(
                f"HindsightRelabel: the batch has no achieved goal {key_name(self.goal_key)}; "
                f"its keys: {leaf_names(batch)}"
            )
        old = get_entry(batch, self.desired_key)
        if not isinstance(old, torch.Tensor) and self.her_ratio < 1.0:
            raise MissingKeyError(
                f"HindsightRelabel: the batch has no desired goal {key_name(self.desired_key)} "
                "to keep on the items not relabeled; use her_ratio=1.0 to give every item one"
            )
        old_next = get_entry(batch, self.next_desired_key)
        fast = (
            self._cpu.relabel_goals(index, self._her_ratio, old, old_next)
            if achieved.is_cpu
            else None
        )
        if fast is not None:
            desired, new_next, goal_index = fast
            put_entry(batch, self.desired_key, desired)
            if new_next is not None:
                put_entry(batch, self.next_desired_key, new_next)
                old_next = None
        else:
            desired, goal_index = self._relabel(batch, achieved, old, index)
        if isinstance(old_next, torch.Tensor) and old_next.shape == desired.shape:
            new = desired if desired.dtype == old_next.dtype else desired.to(old_next.dtype)
            mask = (goal_index >= 0).view((-1,) + (1,) * (new.dim() - 1))
            put_entry(batch, self.next_desired_key, torch.where(mask, new, old_next))
        put_entry(batch, ("goal_index",), goal_index)
        self.blend_reward(batch, self.reward_fn(achieved, desired, batch), goal_index)
        return batch

    def on_sampled(self, batch: Any) -> Any:
        """Relabel a batch a :class:`~rbdata.ReplayBuffer` has just sampled; return it.

        The same goals and rewards as calling the transform; on the CPU path the batch's
        desired goals and rewards, new tensors of the storage's gather that nothing else
        holds, are written in place rather than replaced (three allocations less).
        """
        if type(batch) is TensorDict and self._cpu.relabel_batch(
            batch, self._her_ratio, self.reward_fn, in_place=True
        ):
            return batch
        return self(batch)

    def _relabel(
        self, batch: TensorDictBase, achieved: torch.Tensor, old: Any, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The general path: ``(desired, goal_index)`` on the batch's device, desired set."""
        goal_np, read_np, mask_np = self._draw(index)
        goals = read_column(self.storage, self.goal_key, torch.from_numpy(read_np))
        device = achieved.device
        relabeled = torch.from_numpy(mask_np)
        goal_index = torch.from_numpy(goal_np)
        if device.type != "cpu":
            goals, relabeled = goals.to(device), relabeled.to(device)
            goal_index = goal_index.to(device)
        mask = relabeled.view((-1,) + (1,) * (goals.dim() - 1))
        if isinstance(old, torch.Tensor):
            if old.shape != goals.shape:
                raise ValueError(
                    f"HindsightRelabel: desired goal {key_name(self.desired_key)} has shape "
                    f"{tuple(old.shape)}, the achieved goals {tuple(goals.shape)}"
                )
            if goals.dtype != old.dtype:
                goals = goals.to(old.dtype)
            desired = torch.where(mask, goals, old)
        else:
            desired = goals
        put_entry(batch, self.desired_key, desired)
        return desired, goal_index

    def blend_reward(self, batch: TensorDictBase, reward: Any, goal_index: torch.Tensor) -> None:
        """Set the batch's rewards: ``reward`` (``reward_fn``'s) where relabeled, else kept.

        Raises:
            TypeError: if ``reward`` is not a tensor or an array.
            ValueError: if it is not one reward per item.
        """
        blend_rewards(batch, self.reward_key, reward, goal_index)

    # --- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The generator's state and its unused draws (the episodes are read from the storage)."""
        return {"generator": self.generator.get_state(), "seeds": self._seeds[::-1]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`."""
        self.generator.set_state(state["generator"])
        self._seeds = [int(seed) for seed in reversed(state.get("seeds", ()))]
