"""The shard actor: one local :class:`~rbdata.ReplayBuffer` built from templates in Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from rbdata.buffer import ReplayBuffer
from rbdata.distributed._wire import Packed, pack, unpack
from rbdata.errors import MissingExtraError
from rbdata.samplers.prioritized import PrioritizedSampler
from rbdata.storages.arrow import ArrowStorage
from rbdata.storages.memmap import MemmapStorage
from rbdata.storages.tensor import TensorStorage

__all__ = ["Part", "Shard", "actor_class", "make_part", "ray_get", "ray_module"]

_FEATURE = "rbdata.distributed.RayReplayBuffer"
# storages that copy what they are given: the actor may hand them object-store memory
_COPYING = (TensorStorage, MemmapStorage, ArrowStorage)

Part = tuple[str, Any]  # ("config", (class, config, seed)) or ("factory", callable)


def ray_module() -> Any:
    """The ``ray`` module, or a :class:`MissingExtraError` with the install line."""
    try:
        import ray
    except ImportError as err:
        raise MissingExtraError("ray", "ray", _FEATURE) from err
    return ray


def make_part(value: Any, base: type, name: str, seed: int | None) -> Part:
    """Turn a template (an unused component, or a zero-argument factory) into a recipe."""
    if isinstance(value, base):
        if name == "storage" and len(value) > 0:  # type: ignore[arg-type]
            raise ValueError(
                f"storage: a template must be empty, got {len(value)} items; to serve a "  # type: ignore[arg-type]
                "filled buffer, dumps() it and use RayReplayBuffer.loads"
            )
        return ("config", (type(value), value.config(), seed))  # type: ignore[attr-defined]
    if callable(value) and not isinstance(value, type):
        return ("factory", value)
    raise TypeError(
        f"{name} must be an rbdata {base.__name__} (a template: each shard builds its own "
        f"from its config()) or a zero-argument factory, got {type(value).__name__}"
    )


def _build(part: Part | None, shard_seed: int | None) -> Any:
    if part is None:
        return None
    how, what = part
    if how == "factory":
        return what()
    cls, config, _ = what
    if shard_seed is not None:  # every rbdata sampler takes generator=
        return cls(**config, generator=torch.Generator().manual_seed(shard_seed))
    return cls(**config)


def _shard_seed(seed: int, shard: int) -> int:
    state = np.random.SeedSequence([seed, shard]).generate_state(1, np.uint64)[0]
    return int(state) & ((1 << 63) - 1)


def _tree_stats(sampler: Any) -> tuple[float, float]:
    """Total and smallest positive stored value of a prioritized sampler's trees."""
    return sampler.total(), sampler.min()


class Shard:
    """The actor: one local buffer and the shard's place among ``num_shards``."""

    def __init__(
        self,
        shard: int,
        num_shards: int,
        parts: tuple[Part, Part | None, Part | None] | None,
        batch_size: int | None,
        seed: int,
        checkpoint: str | None = None,
    ) -> None:
        self.shard, self.k = shard, num_shards
        if checkpoint is not None or parts is None:
            self.rb = ReplayBuffer.loads(str(checkpoint))
        else:
            storage_part, sampler_part, writer_part = parts
            sampler_seed = _shard_seed(seed, shard)
            reseed = sampler_part is not None and sampler_part[0] == "config"
            self.rb = ReplayBuffer(
                _build(storage_part, None),
                _build(sampler_part, sampler_seed if reseed else None),
                _build(writer_part, None),
                batch_size=batch_size,
            )
        self.copy_in = not isinstance(self.rb.storage, _COPYING)

    def info(self) -> dict[str, Any]:
        sampler = self.rb.sampler
        prioritized = isinstance(sampler, PrioritizedSampler)
        return {
            "batch_size": self.rb.batch_size,
            "prioritized": prioritized,
            "beta": float(sampler.beta) if isinstance(sampler, PrioritizedSampler) else None,
            "sampler": type(sampler).__name__,
        }

    def _global(self, local: torch.Tensor) -> np.ndarray:
        return (local.cpu().numpy().astype(np.int64) * self.k) + self.shard

    def extend(self, packed: Packed) -> np.ndarray:
        return self._global(self.rb.extend(unpack(packed, self.copy_in)))

    def add(self, packed: Packed) -> int:
        slot = self.rb.add(unpack(packed, self.copy_in))
        return -1 if slot < 0 else slot * self.k + self.shard

    def stats(self) -> tuple[int, float, float]:
        n = len(self.rb)
        if isinstance(self.rb.sampler, PrioritizedSampler):
            total, vmin = _tree_stats(self.rb.sampler)
            return n, (total if n else 0.0), vmin
        return n, float(n), 1.0

    def sample(self, batch_size: int, values: bool) -> tuple[Packed, Any]:
        """A packed batch with global indices, plus (values, total, vmin) if asked."""
        batch = self.rb.sample(batch_size)
        extra = None
        if isinstance(batch, TensorDictBase) and "index" in batch.keys():
            local = batch["index"]
            sampler = self.rb.sampler
            if values and isinstance(sampler, PrioritizedSampler):
                total, vmin = _tree_stats(sampler)
                v = sampler.priority_values(local).double().cpu().numpy()
                extra = (v, total, vmin)
            batch.set("index", torch.from_numpy(self._global(local)))
        return pack(batch), extra

    def update_priority(self, local: np.ndarray, priority: np.ndarray) -> None:
        n = len(self.rb)
        if local.size and int(local.max()) >= n:
            bad = int(local[local >= n][0])
            raise ValueError(
                f"index: {bad * self.k + self.shard} (shard {self.shard}, slot {bad}) is outside "
                f"the shard's filled range [0, {n}); nothing was changed in this shard"
            )
        self.rb.update_priority(torch.from_numpy(local), torch.from_numpy(priority))

    def length(self) -> int:
        return len(self.rb)

    def dumps(self, path: str, fsync: bool) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.rb.dumps(path, fsync=fsync)

    def load(self, path: str) -> None:
        self.rb.load(path)

    def empty(self) -> None:
        self.rb.empty()


_ACTOR_CLASS: Any = None


def actor_class() -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray_module().remote(Shard)
    return _ACTOR_CLASS


def ray_get(refs: Any) -> Any:
    """``ray.get``, re-raising a failed actor call as its own exception (ValueError...)."""
    ray = ray_module()
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, Exception):
            raise cause from err
        raise
