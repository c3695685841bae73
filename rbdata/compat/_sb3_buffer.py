"""SB3's uniform ``ReplayBuffer`` and the sample tuples (see :mod:`rbdata.compat.sb3`)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np
import torch

from rbdata.buffer import ReplayBuffer as _Buffer
from rbdata.compat import _sb3_spaces as spaces
from rbdata.compat._sb3_arrays import SB3Array
from rbdata.compat._sb3_frames import step_writer
from rbdata.compat._sb3_register import counterpart_of, register_if_loaded
from rbdata.compat._sb3_samples import ReplayBufferSamples, positive_int, quiet_generator
from rbdata.errors import EmptyBufferError
from rbdata.samplers.base import Sampler
from rbdata.samplers.uniform import UniformSampler
from rbdata.storages.base import Storage

__all__ = ["ReplayBuffer"]


@counterpart_of("ReplayBuffer")
class ReplayBuffer:
    """Stable-Baselines3's ``ReplayBuffer`` on an rbdata storage.

    SB3's arrays ``observations``, ``next_observations`` (not with
    ``optimize_memory_usage``), ``actions``, ``rewards``, ``dones`` and ``timeouts``, shaped
    ``[buffer_size, n_envs, ...]``, are views of the storage's memory (numpy arrays for a
    CPU storage, memory-mapped ones included; tensors on a GPU): what ``add`` wrote reads
    there, and writes through them (SB3's ``dones[pos] = True``) land in the storage. Such
    writes bypass a :class:`~rbdata.storages.MemmapStorage`'s journal and other processes'
    change tracking. When stable-baselines3 is imported, ``isinstance`` with SB3's
    ``ReplayBuffer`` is true (see :func:`register_with_sb3`).

    Args:
        buffer_size: transitions in all; as in SB3, ``buffer_size // n_envs`` slots of
            ``n_envs`` transitions (``buffer_size`` then holds the slot count).
        observation_space: a gymnasium ``Box``, ``Discrete``, ``MultiDiscrete`` or
            ``MultiBinary`` space.
        action_space: same kinds.
        device: where sampled tensors go (``"auto"``: CUDA when available).
        n_envs: parallel environments per ``add``.
        optimize_memory_usage: keep one observation array (the next observation is the next
            slot's), as SB3; not together with ``handle_timeout_termination``. Accepted and
            meaning nothing with ``storage="frames"``.
        handle_timeout_termination: a ``TimeLimit.truncated`` info marks a cut, not a
            terminal: sampled ``dones`` are ``done * (1 - truncated)``.
        storage: ``"tensor"`` (RAM), ``"memmap"`` (files under ``path``), ``"frames"`` (image
            stacks in a :class:`~rbdata.storages.FrameStackStorage`, each frame stored once:
            see "Atari-sized buffers" in ``docs/compat.md``), or an empty or previously
            written storage of one of these classes, of capacity ``buffer_size // n_envs *
            n_envs`` (a reopened storage resumes where it was).
        path: directory of a ``"memmap"`` storage (``None``: a temporary one), or of a
            ``"frames"`` storage's steps (``None``: in memory).
        codec: ``storage="frames"`` only: ``None`` (raw frames), ``"lz4"``, ``"zstd"`` or
            ``("zstd", level)``, per frame (``pip install 'rbdata[pixels]'``).
        generator: random generator of ``sample`` (``None``: one seeded from the state of
            torch's global RNG without drawing from it, see ``quiet_generator``
            RNG).

    Examples:
        >>> import numpy as np
        >>> from gymnasium import spaces
        >>> rb = ReplayBuffer(100, spaces.Box(-1, 1, (3,)), spaces.Discrete(2), device="cpu")
        >>> obs = np.zeros((1, 3), np.float32)
        >>> rb.add(obs, obs + 1, np.array([1]), np.array([0.5]), np.array([False]), [{}])
        >>> batch = rb.sample(4)
        >>> batch.observations.shape, batch.actions.dtype, batch.rewards.shape, rb.size()
        (torch.Size([4, 3]), torch.int64, torch.Size([4, 1]), 1)
        >>> rb.observations.shape, rb.rewards[0], np.shares_memory(rb.dones, rb.dones)
        ((100, 1, 3), array([0.5], dtype=float32), True)
    """

    observations = SB3Array()
    next_observations = SB3Array()
    actions = SB3Array()
    rewards = SB3Array()
    dones = SB3Array()
    timeouts = SB3Array()
    #: ``_get_samples`` methods of rbdata's classes; a subclass with another one (SB3's
    #: ``NStepReplayBuffer`` built on this class) gets SB3's ``sample`` that calls it
    _own_get_samples: ClassVar[set[Any]] = set()
    _frames_key: str | None = None  # DictReplayBuffer's frames_key

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
    ) -> None:
        buffer_size = positive_int(buffer_size, "buffer_size")
        self.n_envs = positive_int(n_envs, "n_envs")
        self.observation_space = observation_space
        self.action_space = action_space
        obs = self._obs_specs(observation_space)
        self.obs_shape: Any = (
            {k: v.shape for k, v in obs.items()} if isinstance(obs, dict) else obs.shape
        )
        self.action_dim = spaces.action_dim(action_space)
        self.device = spaces.resolve_device(device)
        self.buffer_size = max(buffer_size // self.n_envs, 1)
        self.optimize_memory_usage = bool(optimize_memory_usage)
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self.pos = 0
        self.full = False
        self._writer = step_writer(
            storage,
            (self.buffer_size, self.n_envs, obs, self.action_dim),
            spaces.action_dtype(action_space),
            next_in_slot=self.optimize_memory_usage,
            timeouts=self.handle_timeout_termination,
            codec=codec,
            frames_key=self._frames_key,
        )
        store = self._writer.open_storage(storage, path)
        self._writer.allocate(store)  # SB3's arrays exist (zeros) before the first add
        self._bind(store, self._new_sampler(store, generator))
        register_if_loaded()

    def _obs_specs(self, observation_space: Any) -> Any:
        """How observations are stored (one array here; a dict of them for ``Dict`` spaces)."""
        return spaces.obs_spec(observation_space)

    @staticmethod
    def _maybe_cast_dtype(dtype: Any) -> Any:
        """SB3's: the stored action dtype, ``np.float32`` for ``np.float64`` (else unchanged).

        Examples:
            >>> ReplayBuffer._maybe_cast_dtype(np.float64), ReplayBuffer._maybe_cast_dtype(np.int8)
            (<class 'numpy.float32'>, <class 'numpy.int8'>)
        """
        return spaces.maybe_cast_dtype(dtype)

    # --- parts -------------------------------------------------------------------------------
    def _new_sampler(self, storage: Storage, generator: torch.Generator | None) -> Sampler:
        return UniformSampler(generator=generator or quiet_generator())

    def _bind(self, storage: Storage, sampler: Sampler) -> None:
        """Use ``storage`` and ``sampler``; ``pos`` and ``full`` are read from the storage."""
        self._rb = _Buffer(storage, sampler)
        self._storage = storage
        self._sampler = sampler
        self.pos, self.full = self._writer.position(storage)
        self._writer.attach(storage)

    def _sync(self) -> None:
        """Hook before the storage or sampler is read (the prioritized buffer's priorities)."""

    @property
    def storage(self) -> Storage:
        """The rbdata storage, one item per ``(slot, env)`` at ``slot * n_envs + env``."""
        self._sync()
        return self._storage

    @property
    def replay_buffer(self) -> _Buffer:
        """The same data as an :class:`rbdata.ReplayBuffer` (its writer is not used by ``add``)."""
        self._sync()
        self._rb.writer.load_state_dict({"cursor": self._storage.next_slot})
        return self._rb

    def __getstate__(self) -> dict[str, Any]:
        self._sync()  # pending priorities reach the sampler first
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._writer.attach(self._storage)
        register_if_loaded()

    # --- SB3 surface -------------------------------------------------------------------------
    def size(self) -> int:
        """Filled slots (``buffer_size`` once full), as SB3."""
        return self.buffer_size if self.full else self.pos

    def add(
        self,
        obs: Any,
        next_obs: Any,
        action: Any,
        reward: Any,
        done: Any,
        infos: Any,
    ) -> None:
        """Add one step of ``n_envs`` transitions at slot ``pos`` (arguments as SB3's).

        Raises:
            ValueError, TypeError: naming the argument whose shape or type does not fit;
                nothing is written then.
        """
        pos = self.pos
        self._writer.write(self._storage, pos, obs, next_obs, action, reward, done, infos)
        self._written(pos)
        pos += 1
        if pos == self.buffer_size:
            self.full = True
            pos = 0
        self.pos = pos

    def _written(self, pos: int) -> None:
        """Hook after slot ``pos`` was written (the prioritized buffer sets priorities)."""

    def extend(self, *args: Any) -> None:
        """Add several steps: each argument holds one entry per step (as SB3)."""
        for data in zip(*args, strict=True):
            self.add(*data)

    def reset(self) -> None:
        """Forget every transition (``pos = 0``, ``full = False``)."""
        self._rb.empty()
        self.pos, self.full = 0, False
        self._writer.attach(self._storage)

    def _draw(self, batch_size: int) -> torch.Tensor:
        """Flat indices ``slot * n_envs + env`` drawn as SB3 draws slots and envs."""
        n, cap = self.n_envs, self.buffer_size * self.n_envs
        gen = self._sampler.generator
        if self._writer.next_in_slot and self.full:  # every slot but pos (its next is stale)
            k = torch.randint(n, cap, (batch_size,), generator=gen)
            return k.add_(self.pos * n).remainder_(cap)
        high = cap if self.full else self.pos * n
        if high == 0:
            raise EmptyBufferError("cannot sample: the buffer is empty (add first)")
        return torch.randint(high, (batch_size,), generator=gen)

    def sample(self, batch_size: int, env: Any = None) -> Any:
        """Draw ``batch_size`` transitions uniformly (``env``: a ``VecNormalize`` to apply).

        A subclass that overrides ``_get_samples(batch_inds, env)`` (SB3's
        ``NStepReplayBuffer``) gets it called with the drawn slots, as SB3's ``sample`` does.
        """
        batch_size = positive_int(batch_size, "batch_size")
        if type(self)._get_samples not in ReplayBuffer._own_get_samples:
            return self._get_samples(self._draw_slots(batch_size), env=env)
        return self._samples(*self._gather(self._draw(batch_size), env))

    def _samples(self, *fields: Any) -> Any:
        return ReplayBufferSamples(*fields)

    def _draw_slots(self, batch_size: int) -> np.ndarray[Any, Any]:
        """Slots drawn as SB3's ``sample`` draws its ``batch_inds``."""
        slots, gen = self.buffer_size, self._sampler.generator
        if self._writer.next_in_slot and self.full:
            k = torch.randint(1, slots, (batch_size,), generator=gen)
            return ((k + self.pos) % slots).numpy()
        high = slots if self.full else self.pos
        if high == 0:
            raise EmptyBufferError("cannot sample: the buffer is empty (add first)")
        return torch.randint(high, (batch_size,), generator=gen).numpy()

    def _get_samples(self, batch_inds: Any, env: Any = None, env_indices: Any = None) -> Any:
        """The transitions at slots ``batch_inds`` of envs ``env_indices`` (random if ``None``)."""
        slots = torch.as_tensor(np.asarray(batch_inds), dtype=torch.long)
        if env_indices is None:
            gen = self._sampler.generator
            envs = torch.randint(self.n_envs, (len(slots),), generator=gen)
        else:
            envs = torch.as_tensor(np.asarray(env_indices), dtype=torch.long)
        return self._samples(*self._gather(slots * self.n_envs + envs, env))

    _own_get_samples.add(_get_samples)

    def _gather(self, flat: torch.Tensor, env: Any) -> tuple[Any, ...]:
        obs, actions, next_obs, dones, rewards = self._writer.gather(self._storage, flat)
        if env is not None:
            obs = self._normalized(obs, env)
            next_obs = self._normalized(next_obs, env)
            rewards = self.to_torch(self._normalize_reward(rewards.cpu().numpy(), env))
        device = self.device
        if actions.device != device:
            obs, next_obs = _to(obs, device), _to(next_obs, device)
            actions, dones, rewards = actions.to(device), dones.to(device), rewards.to(device)
        return obs, actions, next_obs, dones, rewards

    def _normalized(self, obs: Any, env: Any) -> Any:
        if isinstance(obs, dict):
            got = self._normalize_obs({k: v.cpu().numpy() for k, v in obs.items()}, env)
            return {k: self.to_torch(v) for k, v in got.items()}
        return self.to_torch(self._normalize_obs(obs.cpu().numpy(), env))

    def to_torch(self, array: np.ndarray[Any, Any], copy: bool = True) -> torch.Tensor:
        """A numpy array as a tensor on ``device`` (copied unless ``copy=False``), as SB3."""
        if copy:
            return torch.tensor(array, device=self.device)
        return torch.as_tensor(array, device=self.device)

    @staticmethod
    def swap_and_flatten(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """``[n_steps, n_envs, ...]`` to ``[n_steps * n_envs, ...]`` env by env, as SB3."""
        shape = arr.shape
        if len(shape) < 3:
            shape = (*shape, 1)
        return arr.swapaxes(0, 1).reshape(shape[0] * shape[1], *shape[2:])

    @staticmethod
    def _normalize_obs(obs: Any, env: Any = None) -> Any:
        return obs if env is None else env.normalize_obs(obs)

    @staticmethod
    def _normalize_reward(reward: Any, env: Any = None) -> Any:
        return reward if env is None else env.normalize_reward(reward).astype(np.float32)

    # --- checkpoints -------------------------------------------------------------------------
    def dumps(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        """Write the buffer (transitions, ``pos``/``full``, sampler state) to directory ``path``.

        Atomic and pickle-free: :meth:`rbdata.ReplayBuffer.dumps`.
        """
        self.replay_buffer.dumps(path, fsync=fsync)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Copy checkpoint ``path`` into this buffer (built with the same arguments).

        Raises:
            ValueError: if the checkpoint's capacity, layout or sampler differ.
        """
        rb = self._rb
        layout = rb.storage.layout
        rb.load(path)
        if layout is not None and rb.storage.layout != layout:  # pragma: no cover - copied
            raise ValueError(f"path: {path} holds another layout")
        self.pos, self.full = self._writer.position(self._storage)
        self._writer.attach(self._storage)

    @classmethod
    def loads(
        cls,
        path: str | os.PathLike[str],
        observation_space: Any,
        action_space: Any,
        device: torch.device | str = "auto",
        n_envs: int = 1,
        **kwargs: Any,
    ) -> Any:
        """A buffer over checkpoint ``path``, mapped lazily (writes stay in this process).

        The spaces and ``n_envs`` are given again (spaces are not saved; ``buffer_size`` is
        the checkpoint's); the storage's layout must fit them, and sampling resumes with the
        saved sampler state. ``kwargs`` are the other constructor arguments.

        With ``optimize_memory_usage=True``, a buffer saved one step before it first fills
        comes back as full at the same ``pos`` (the storage cannot tell the two apart): it
        samples the same transitions, only ``size()`` is one slot more.

        Raises:
            rbdata.errors.CheckpointError: for a missing or corrupt checkpoint.
            ValueError: if the checkpoint does not fit the arguments.
        """
        loaded = _Buffer.loads(path)
        storage = loaded.storage
        self = cls(
            storage.capacity,
            observation_space,
            action_space,
            device,
            n_envs,
            storage=storage,
            **kwargs,
        )
        if type(loaded.sampler) is not type(self._sampler):
            raise ValueError(
                f"path: {path} holds a {type(loaded.sampler).__name__}, this buffer uses a "
                f"{type(self._sampler).__name__}"
            )
        self._bind(storage, loaded.sampler)
        return self

    def close(self) -> None:
        """Close the storage (a temporary memmap directory is removed)."""
        close = getattr(self._storage, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(buffer_size={self.buffer_size}, n_envs={self.n_envs}, "
            f"size={self.size()}, storage={type(self._storage).__name__})"
        )


def _to(obs: Any, device: torch.device) -> Any:
    """A tensor, or a dict of them, on ``device``."""
    if isinstance(obs, dict):
        return {k: v.to(device) for k, v in obs.items()}
    return obs.to(device)
