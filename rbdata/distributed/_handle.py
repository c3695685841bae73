"""``RayReplayBuffer``: the picklable handle of the shard actors."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from rbdata import checkpoint
from rbdata.distributed._shard import actor_class, make_part, ray_get, ray_module
from rbdata.distributed._weights import global_weights, split_index
from rbdata.distributed._wire import concat, pack, unpack
from rbdata.errors import EmptyBufferError
from rbdata.samplers.base import Sampler, check_batch_size
from rbdata.storages.base import Storage
from rbdata.writers.base import Writer

__all__ = ["RayReplayBuffer"]


# --- the handle ---------------------------------------------------------------------------------
class RayReplayBuffer:
    """A replay buffer owned by ``num_shards`` Ray actors; the handle is picklable.

    Each shard actor builds its own :class:`~rbdata.ReplayBuffer` from the *templates* given:
    a ``storage``/``sampler``/``writer`` instance is never shipped, only its class and
    ``config()`` (so it must be unused: an empty storage), and each shard builds a fresh one;
    a zero-argument callable (e.g. ``lambda: MemmapStorage(10**6, path=...)``) is called in
    each actor instead. Samplers built from a template get their own generator per shard,
    seeded from the template's generator (deterministic); samplers from a factory keep theirs.

    Every method returns when the actor(s) have done the work, like a local buffer's;
    :meth:`extend_async` and :meth:`add_async` return a Ray ``ObjectRef`` instead.

    Sharding (``num_shards=k``): each ``extend``/``add`` call goes whole to the next shard in
    turn (round-robin per handle; every pickled copy of the handle starts one shard further,
    so collectors spread out). :meth:`sample` asks every shard for its mass (its length, or
    its total priority for a :class:`~rbdata.samplers.PrioritizedSampler`), splits the batch
    multinomially in proportion, and has the shards draw in parallel: two round trips (one
    with a single shard). Importance weights are recomputed for the draw actually made
    (:func:`global_weights`): with no concurrent writer they equal the local formula over the
    union of the shards; with writers racing, each shard's share is the one read a moment
    before it drew (the weights stay exact for that distribution). Epoch samplers
    (``SamplerWithoutReplacement``) keep their epochs per shard only.

    Global indices are ``local * k + shard`` (:func:`split_index`); :meth:`update_priority`
    sends each shard its own indices, in parallel. Bad priorities (NaN, negative) and negative
    indices are refused before any shard changes; an index past a shard's filled range is
    refused by that shard, after the other shards applied theirs.

    Batches move as numpy arrays through Ray's object store (zero copy on the actor side for
    storages that copy on write); sampled batches are copied once into the learner's own
    memory, so they are writable.

    Args:
        storage: template storage (empty) or zero-argument factory.
        sampler: template sampler (unbound) or factory; default: uniform with replacement.
        writer: template writer or factory; default: round-robin.
        batch_size: default batch size of :meth:`sample`.
        num_shards: number of actors.
        actor_options: passed to ``ActorClass.options`` (``num_cpus``, ``resources``,
            ``scheduling_strategy``...).

    Raises:
        rbdata.errors.MissingExtraError: if ``ray`` is not installed.

    Examples:
        >>> import ray, torch  # doctest: +SKIP
        >>> from rbdata import PrioritizedSampler, TensorStorage  # doctest: +SKIP
        >>> rb = RayReplayBuffer(TensorStorage(1000), PrioritizedSampler(1000, 0.6, 0.4),
        ...                      batch_size=32, num_shards=2)  # doctest: +SKIP
        >>> rb.extend({"observation": torch.randn(100, 4)}).shape  # doctest: +SKIP
        torch.Size([100])
        >>> batch = rb.sample()  # doctest: +SKIP
        >>> rb.update_priority(batch["index"], torch.rand(32))  # doctest: +SKIP
    """

    def __init__(
        self,
        storage: Storage | Callable[[], Storage],
        sampler: Sampler | Callable[[], Any] | None = None,
        writer: Writer | Callable[[], Any] | None = None,
        batch_size: int | None = None,
        num_shards: int = 1,
        actor_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be a positive integer, got {num_shards!r}")
        batch_size = None if batch_size is None else check_batch_size(batch_size)
        if isinstance(sampler, Sampler):  # shard seeds follow the template's generator
            seed = int(torch.randint(1 << 62, (1,), generator=sampler.generator))
        else:  # ... or torch's global RNG
            seed = int(torch.randint(1 << 62, (1,)))
        parts = (
            make_part(storage, Storage, "storage", None),
            None if sampler is None else make_part(sampler, Sampler, "sampler", seed),
            None if writer is None else make_part(writer, Writer, "writer", None),
        )
        cls = actor_class()
        if actor_options:
            cls = cls.options(**dict(actor_options))
        actors = [cls.remote(s, num_shards, parts, batch_size, seed) for s in range(num_shards)]
        self._setup(actors, seed)

    def _setup(self, actors: list[Any], seed: int) -> None:
        self._actors = actors
        self.num_shards = len(actors)
        infos = ray_get([a.info.remote() for a in actors])
        self.batch_size: int | None = infos[0]["batch_size"]
        self._prioritized = bool(infos[0]["prioritized"])
        self._beta = infos[0]["beta"]
        self._cursor = 0
        self._rng = np.random.default_rng(seed)

    def _loads_into(
        self,
        path: str | os.PathLike[str],
        num_shards: int | None = None,
        actor_options: Mapping[str, Any] | None = None,
    ) -> RayReplayBuffer:
        """``rb.loads(path)``: :meth:`load` into this buffer's shards; returns it."""
        if num_shards is not None and num_shards != len(self._actors):
            raise ValueError(
                f"num_shards: this buffer has {len(self._actors)} shards, got {num_shards}"
            )
        if actor_options is not None:
            raise ValueError("actor_options: the shards of a buffer loaded in place exist")
        self.load(path)
        return self

    @checkpoint.LoadsDescriptor.in_place(_loads_into)
    @classmethod
    def loads(
        cls,
        path: str | os.PathLike[str],
        num_shards: int | None = None,
        actor_options: Mapping[str, Any] | None = None,
    ) -> RayReplayBuffer:
        """New shard actors, each loading ``path/shard-<i>`` with ``ReplayBuffer.loads``.

        Called on a buffer (``rb.loads(path)``), it loads into that buffer's shards instead
        (:meth:`load`) and returns it.

        Args:
            path: a directory written by :meth:`dumps`, visible to the actors.
            num_shards: the number of shards; ``None`` counts the ``shard-<i>``
                directories (then ``path`` must also be visible here).
            actor_options: as in the constructor.
        """
        root = Path(path)
        if num_shards is None:
            num_shards = 0
            while (root / f"shard-{num_shards}").is_dir():
                num_shards += 1
            if num_shards == 0:
                raise FileNotFoundError(f"path: no shard-0 checkpoint under {str(root)!r}")
        actor_cls = actor_class()
        if actor_options:
            actor_cls = actor_cls.options(**dict(actor_options))
        seed = int(torch.randint(1 << 62, (1,)))
        actors = [
            actor_cls.remote(s, num_shards, None, None, seed, str(root / f"shard-{s}"))
            for s in range(num_shards)
        ]
        self = cls.__new__(cls)
        self._setup(actors, seed)
        return self

    # --- pickling: copies start on the next shard and draw their own shard splits ----------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_rng"] = np.random.default_rng(int(self._rng.integers(1 << 62)))
        self._cursor = (self._cursor + 1) % self.num_shards
        return state

    def __repr__(self) -> str:
        return (
            f"RayReplayBuffer(num_shards={self.num_shards}, batch_size={self.batch_size}, "
            f"prioritized={self._prioritized})"
        )

    @property
    def actors(self) -> list[Any]:
        """The shard actors' handles (shard ``i`` at position ``i``)."""
        return list(self._actors)

    # --- writes ----------------------------------------------------------------------------
    def _next_actor(self) -> Any:
        actor = self._actors[self._cursor]
        self._cursor = (self._cursor + 1) % self.num_shards
        return actor

    def extend_async(self, data: Any) -> Any:
        """Like :meth:`extend`, returning an ``ObjectRef`` to the global indices (numpy)."""
        return self._next_actor().extend.remote(pack(data))

    def extend(self, data: Any) -> torch.Tensor:
        """Add a batch to the next shard; return the global indices as a ``LongTensor``."""
        return torch.from_numpy(np.array(ray_get(self.extend_async(data))))

    def add_async(self, item: Any) -> Any:
        """Like :meth:`add`, returning an ``ObjectRef`` to the global index."""
        return self._next_actor().add.remote(pack(item))

    def add(self, item: Any) -> int:
        """Add one item to the next shard; return its global index (-1 if dropped)."""
        return int(ray_get(self.add_async(item)))

    # --- reads -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(sum(ray_get([a.length.remote() for a in self._actors])))

    def sample(self, batch_size: int | None = None) -> Any:
        """Draw one batch across the shards (default size: ``batch_size``).

        TensorDict batches carry global ``"index"`` values and, for prioritized sampling,
        ``"weight"`` normalised over all shards.
        """
        if batch_size is None:
            if self.batch_size is None:
                raise ValueError(
                    "batch_size: pass sample(batch_size) or RayReplayBuffer(batch_size=...)"
                )
            batch_size = self.batch_size
        batch_size = check_batch_size(batch_size)
        if self.num_shards == 1:
            packed, _ = ray_get(self._actors[0].sample.remote(batch_size, False))
            return unpack(packed, copy=True)
        stats = np.array(ray_get([a.stats.remote() for a in self._actors]), dtype=np.float64)
        mass = stats[:, 1]
        if not stats[:, 0].any():
            raise EmptyBufferError("cannot sample: the buffer is empty (add or extend first)")
        if not mass.sum() > 0:
            raise ValueError("cannot sample: every priority in the buffer is zero")
        share = mass / mass.sum()
        counts = self._rng.multinomial(batch_size, share)
        shards = [s for s in range(self.num_shards) if counts[s]]
        refs = [self._actors[s].sample.remote(int(counts[s]), self._prioritized) for s in shards]
        replies = ray_get(refs)
        packed = concat([r[0] for r in replies]) if len(replies) > 1 else replies[0][0]
        batch = unpack(packed, copy=len(replies) == 1)
        if self._prioritized and isinstance(batch, TensorDictBase):
            total, vmin = stats[:, 1].copy(), stats[:, 2].copy()
            for s, (_, (_, t, m)) in zip(shards, replies, strict=True):
                total[s], vmin[s] = t, m
            values = np.concatenate([r[1][0] for r in replies])
            shard = np.repeat(np.array(shards), counts[shards])
            weight = global_weights(values, shard, share, total, vmin, float(self._beta))
            batch.set("weight", torch.from_numpy(weight.astype(np.float32)))
        return batch

    # --- priorities --------------------------------------------------------------------------
    def update_priority_async(self, index: Any, priority: Any) -> list[Any]:
        """Like :meth:`update_priority`, returning the shards' ``ObjectRef`` s."""
        shard, local = split_index(index, self.num_shards)
        prio = np.asarray(priority.cpu() if isinstance(priority, torch.Tensor) else priority)
        prio = np.broadcast_to(
            prio.astype(np.float64, copy=False).reshape(-1)
            if prio.ndim
            else prio.astype(np.float64),
            local.shape,
        )
        bad = ~np.isfinite(prio) | (prio < 0)
        if bad.any():
            raise ValueError(
                f"priority: expected finite values >= 0, got {float(prio[bad][0])}; nothing "
                "was changed"
            )
        if self.num_shards == 1:
            return [self._actors[0].update_priority.remote(local, np.ascontiguousarray(prio))]
        refs = []
        for s in np.unique(shard).tolist():
            mask = shard == s
            refs.append(self._actors[s].update_priority.remote(local[mask], prio[mask]))
        return refs

    def update_priority(self, index: Any, priority: Any) -> None:
        """Set priorities at global ``index`` (as returned by :meth:`sample`), shard by shard.

        Raises:
            ValueError: for a negative index or a NaN, infinite or negative priority (no shard
                changes), or an index past its shard's filled range (that shard changes
                nothing).
            TypeError: if the sampler has no priorities.
        """
        ray_get(self.update_priority_async(index, priority))

    # --- checkpoints and lifetime ------------------------------------------------------------
    def dumps(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        """Each shard writes ``path/shard-<i>`` with ``ReplayBuffer.dumps`` (in parallel).

        Each shard's checkpoint is atomic; the set is not (a crash mid-way may leave some
        shards newer than others). ``path`` is on the actors' machines (a shared filesystem
        for a multi-machine cluster).
        """
        root = Path(path)
        ray_get(
            [a.dumps.remote(str(root / f"shard-{s}"), fsync) for s, a in enumerate(self._actors)]
        )

    def load(self, path: str | os.PathLike[str]) -> None:
        """Load ``path/shard-<i>`` into shard ``i`` (``ReplayBuffer.load``: same components)."""
        root = Path(path)
        ray_get([a.load.remote(str(root / f"shard-{s}")) for s, a in enumerate(self._actors)])

    def empty(self) -> None:
        """Remove every item from every shard."""
        ray_get([a.empty.remote() for a in self._actors])

    def close(self) -> None:
        """Kill the shard actors (their buffers are lost; :meth:`dumps` first to keep them)."""
        ray = ray_module()
        for actor in self._actors:
            ray.kill(actor)
