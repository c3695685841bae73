"""SB3's ``ReplayBuffer`` and ``DictReplayBuffer``: samples, arrays (see :mod:`rbdata.compat.sb3`).

SB3's array attributes are :class:`SB3Array` descriptors: views of the storage's memory,
read through :meth:`ReplayBuffer.sb3_array`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch

from rbdata.buffer import ReplayBuffer as _Buffer
from rbdata.compat.sb3 import _spaces as spaces
from rbdata.compat.sb3._frames import step_writer
from rbdata.compat.sb3._register import counterpart_of, register_if_loaded
from rbdata.errors import EmptyBufferError
from rbdata.samplers.base import Sampler
from rbdata.samplers.uniform import UniformSampler
from rbdata.storages.base import Storage

__all__ = [
    "DictReplayBuffer",
    "DictReplayBufferSamples",
    "ReplayBuffer",
    "ReplayBufferSamples",
    "SB3Array",
    "positive_int",
    "quiet_generator",
]


class ReplayBufferSamples(NamedTuple):
    """SB3's ``ReplayBufferSamples``: same fields, shapes ``[B, ...]`` and ``[B, 1]``."""

    observations: torch.Tensor
    actions: torch.Tensor
    next_observations: torch.Tensor
    dones: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor | None = None


class DictReplayBufferSamples(NamedTuple):
    """SB3's ``DictReplayBufferSamples``: observations are dicts of ``[B, ...]`` tensors."""

    observations: dict[str, torch.Tensor]
    actions: torch.Tensor
    next_observations: dict[str, torch.Tensor]
    dones: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor | None = None


def positive_int(value: Any, name: str) -> int:
    """``value`` as an ``int`` if it is a positive integer (not a bool).

    Raises:
        ValueError: naming ``name`` otherwise.

    Examples:
        >>> positive_int(np.int64(3), "n_envs")
        3
        >>> positive_int(0, "n_envs")
        Traceback (most recent call last):
        ...
        ValueError: n_envs: expected a positive int, got 0
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return int(value)


def quiet_generator() -> torch.Generator:
    """A generator seeded from the state of torch's global RNG, which it leaves as it was.

    SB3's buffer draws nothing from torch's RNG, so neither may building ours: a model's
    initial weights and its whole run then come out as with SB3's buffer for the same seed.
    ``torch.manual_seed`` still decides the seed (a hash of the global state).

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> a, state = quiet_generator(), torch.get_rng_state()
        >>> _ = torch.manual_seed(0)
        >>> b = quiet_generator()
        >>> torch.equal(state, torch.get_rng_state()), a.initial_seed() == b.initial_seed()
        (True, True)
    """
    digest = hashlib.blake2b(torch.get_rng_state().numpy().tobytes(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little"))


class SB3Array:
    """Data descriptor of one of SB3's arrays: a view of the storage's memory.

    Read: ``[buffer_size, n_envs, ...]`` over the storage's buffer (no copy), what SB3 keeps
    as a numpy array: the owner's :meth:`ReplayBuffer.sb3_array`. Assigned: the value is
    copied into that memory (as ``buffer.<name>[...] = value``).
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return obj.sb3_array(self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        target = obj.sb3_array(self.name)
        if not isinstance(target, dict):
            _write(target, _fit(target, value, self.name))
            return
        if not isinstance(value, Mapping) or set(value) != set(target):
            raise ValueError(f"{self.name}: expected a dict with keys {list(target)}")
        # every key checked before any is written: a bad one changes nothing
        fitted = {k: _fit(a, value[k], f"{self.name}[{k!r}]") for k, a in target.items()}
        for key, array in target.items():
            _write(array, fitted[key])


def _write(target: Any, fitted: Any) -> None:
    if isinstance(target, torch.Tensor):
        target.copy_(fitted)
    else:
        np.copyto(target, fitted, "unsafe")  # numpy assignment's casting, as SB3's


def _fit(target: Any, value: Any, name: str) -> Any:
    """``value`` broadcast to ``target``'s shape (a tensor for a tensor target)."""
    try:
        if isinstance(target, torch.Tensor):
            return torch.as_tensor(np.asarray(value)).broadcast_to(target.shape)
        return np.broadcast_to(np.asarray(value), target.shape)
    except (ValueError, TypeError, RuntimeError) as err:
        shape = getattr(value, "shape", None)
        raise ValueError(
            f"{name}: expected shape {tuple(target.shape)}, got {shape}: {err}"
        ) from None


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

    def sb3_array(self, name: str) -> Any:
        """SB3's array ``name`` (``observations``, ``actions``, ...): a view of the storage.

        Shaped ``[buffer_size, n_envs, ...]``: a numpy array for a CPU storage, a tensor view
        on another device, a dict of them for the observations of a ``Dict`` space. What the
        attributes of the same names read.

        Raises:
            AttributeError: for a name the buffer has no array of (``next_observations``
                with ``optimize_memory_usage``; the observations with ``storage="frames"``).
        """
        return self._writer.array(self._storage, name)

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


def _to(obs: Any, device: torch.device) -> Any:
    """A tensor, or a dict of them, on ``device``."""
    if isinstance(obs, dict):
        return {k: v.to(device) for k, v in obs.items()}
    return obs.to(device)
