"""``RayReplayBuffer``: replay buffers owned by Ray actors, sharded across machines.

Each shard is a Ray actor holding an ordinary :class:`~rbdata.ReplayBuffer`; the handle
(:class:`RayReplayBuffer`) is picklable, so collector tasks and learner actors all use the same
buffer. Batches travel through Ray's object store as numpy arrays (a TensorDict is flattened to
its leaves and its batch size, and rebuilt on the other side), never as pickled TensorDicts.

Global indices encode the shard: ``global = local * num_shards + shard`` (with one shard, the
global index is the local slot). :func:`split_index` decodes them.

``ray`` is imported only when a :class:`RayReplayBuffer` is built; without it the constructor
raises :class:`~rbdata.errors.MissingExtraError` with ``pip install 'rbdata[ray]'``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbdata import checkpoint
from rbdata.buffer import ReplayBuffer
from rbdata.errors import EmptyBufferError, MissingExtraError
from rbdata.samplers.base import Sampler, check_batch_size
from rbdata.samplers.prioritized import PrioritizedSampler
from rbdata.storages.arrow import ArrowStorage
from rbdata.storages.base import Storage
from rbdata.storages.memmap import MemmapStorage
from rbdata.storages.tensor import TensorStorage
from rbdata.writers.base import Writer

__all__ = ["RayReplayBuffer", "global_weights", "split_index"]

_FEATURE = "rbdata.distributed.RayReplayBuffer"
# storages that copy what they are given: the actor may hand them object-store memory
_COPYING = (TensorStorage, MemmapStorage, ArrowStorage)


def _ray() -> Any:
    """The ``ray`` module, or a :class:`MissingExtraError` with the install line."""
    try:
        import ray
    except ImportError as err:
        raise MissingExtraError("ray", "ray", _FEATURE) from err
    return ray


# --- index and weight arithmetic (pure functions) ---------------------------------------------
def split_index(index: Any, num_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode global indices into ``(shard, local)`` arrays (``global = local * k + shard``).

    Raises:
        ValueError: if an index is negative.

    Examples:
        >>> shard, local = split_index([0, 1, 6, 7], num_shards=2)
        >>> shard.tolist(), local.tolist()
        ([0, 1, 0, 1], [0, 0, 3, 3])
    """
    idx = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index)
    if idx.dtype.kind not in "iu" and idx.size:
        raise ValueError(f"index: expected integers, got an array of dtype {idx.dtype}")
    idx = idx.astype(np.int64, copy=False).reshape(-1)
    if idx.size and int(idx.min()) < 0:
        raise ValueError(f"index: global indices are >= 0, got {int(idx.min())}")
    return idx % num_shards, idx // num_shards


def global_weights(
    values: np.ndarray,
    shard: np.ndarray,
    share: np.ndarray,
    total: np.ndarray,
    vmin: np.ndarray,
    beta: float,
) -> np.ndarray:
    """Importance weights of a batch drawn across shards, normalised like the local sampler.

    Shard ``s`` was chosen for each item with probability ``share[s]``, then item ``i`` with
    probability ``values[i] / total[s]``; so ``P(i) = share[s] * values[i] / total[s]`` and
    ``w_i = (P(i) / P_min)^-beta`` with ``P_min`` the smallest probability of any item of a
    shard that could be chosen (``share > 0``). When ``share`` is ``total / total.sum()``
    this is exactly ``(values[i] / min_j v_j)^-beta`` over all shards, the local formula.

    Args:
        values: the stored value ``(p + eps)^alpha`` of each sampled item.
        shard: the shard of each sampled item.
        share: per shard, the probability it was chosen for an item.
        total: per shard, the sum of its stored values when it drew.
        vmin: per shard, the smallest positive stored value when it drew.
        beta: the importance-sampling exponent.

    Examples:
        >>> w = global_weights(
        ...     np.array([1.0, 4.0]), np.array([0, 1]), np.array([0.2, 0.8]),
        ...     np.array([1.0, 4.0]), np.array([1.0, 2.0]), beta=1.0)
        >>> w.tolist()
        [1.0, 0.25]
    """
    live = share > 0
    pmin = float(np.min(share[live] * vmin[live] / total[live]))
    prob = share[shard] * values / total[shard]
    return np.power(prob / pmin, -beta)


# --- wire format -----------------------------------------------------------------------------
# (kind, keys, leaves, batch_size): kind "td" (TensorDict), "dict" (nested mapping of
# tensors), "tensor" (one tensor) or "object" (anything else, pickled by Ray as it is).
Packed = tuple[str, list[Any], list[Any], tuple[int, ...] | None]


def _leaf_out(value: Any) -> Any:
    """A tensor as a numpy array sharing its memory where possible (else the CPU tensor)."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        try:
            return value.resolve_conj().resolve_neg().numpy()
        except (TypeError, RuntimeError):  # e.g. bfloat16 has no numpy dtype
            return value
    return value


def _leaf_in(value: Any, copy: bool) -> Any:
    """A numpy leaf back as a tensor; object-store arrays are read-only, so copy if asked."""
    if isinstance(value, np.ndarray):
        if copy or not value.flags.writeable:
            if copy:
                return torch.from_numpy(np.array(value))
            with warnings.catch_warnings():  # read only: the storage copies it, never writes
                warnings.filterwarnings("ignore", "The given NumPy array is not writable")
                return torch.from_numpy(value)
        return torch.from_numpy(value)
    return value


def _pack(data: Any) -> Packed:
    """Flatten a batch into numpy leaves for the object store."""
    if isinstance(data, TensorDictBase):
        keys, leaves = [], []
        for key, value in data.items(include_nested=True, leaves_only=True):
            keys.append(key)
            leaves.append(_leaf_out(value))
        return ("td", keys, leaves, tuple(data.batch_size))
    if isinstance(data, torch.Tensor):
        return ("tensor", [], [_leaf_out(data)], None)
    if isinstance(data, Mapping) and data:
        keys, leaves = [], []
        _flatten(data, (), keys, leaves)
        return ("dict", keys, leaves, None)
    return ("object", [], [data], None)


def _flatten(
    data: Mapping[Any, Any], prefix: tuple[Any, ...], keys: list[Any], out: list[Any]
) -> None:
    for key, value in data.items():
        if isinstance(value, Mapping):
            _flatten(value, (*prefix, key), keys, out)
        else:
            keys.append((*prefix, key))
            out.append(_leaf_out(value))


def _nest(keys: Sequence[Any], leaves: Sequence[Any]) -> dict[Any, Any]:
    root: dict[Any, Any] = {}
    for key, value in zip(keys, leaves, strict=True):
        path = key if isinstance(key, tuple) else (key,)
        node = root
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return root


def _unpack(packed: Packed, copy: bool) -> Any:
    """Rebuild what :func:`_pack` flattened (``copy``: into writable memory of our own)."""
    kind, keys, leaves, batch_size = packed
    if kind == "object":
        return leaves[0]
    tensors = [_leaf_in(v, copy) for v in leaves]
    if kind == "tensor":
        return tensors[0]
    nested = _nest(keys, tensors)
    if kind == "dict":
        return nested
    return TensorDict(nested, batch_size=batch_size)


def _concat(parts: Sequence[Packed]) -> Packed:
    """Join packed batches of one layout along the batch dimension (a fresh, writable copy)."""
    kind, keys, first, batch_size = parts[0]
    if kind == "object":
        raise TypeError("cannot join batches of Python objects across shards")
    leaves: list[Any] = []
    for j, leaf in enumerate(first):
        pieces = [p[2][j] for p in parts]
        if isinstance(leaf, np.ndarray):
            leaves.append(np.concatenate(pieces))
        else:
            leaves.append(torch.cat([torch.as_tensor(x) for x in pieces]))
    if batch_size is not None:
        batch_size = (sum(int(p[3][0]) for p in parts if p[3]), *batch_size[1:])
    return (kind, keys, leaves, batch_size)


# --- the actor ---------------------------------------------------------------------------------
Part = tuple[str, Any]  # ("config", (class, config, seed)) or ("factory", callable)


def _part(value: Any, base: type, name: str, seed: int | None) -> Part:
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


class _Shard:
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
        return self._global(self.rb.extend(_unpack(packed, self.copy_in)))

    def add(self, packed: Packed) -> int:
        slot = self.rb.add(_unpack(packed, self.copy_in))
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
        return _pack(batch), extra

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


def _actor_class() -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = _ray().remote(_Shard)
    return _ACTOR_CLASS


def _get(refs: Any) -> Any:
    """``ray.get``, re-raising a failed actor call as its own exception (ValueError...)."""
    ray = _ray()
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, Exception):
            raise cause from err
        raise


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
            _part(storage, Storage, "storage", None),
            None if sampler is None else _part(sampler, Sampler, "sampler", seed),
            None if writer is None else _part(writer, Writer, "writer", None),
        )
        cls = _actor_class()
        if actor_options:
            cls = cls.options(**dict(actor_options))
        actors = [cls.remote(s, num_shards, parts, batch_size, seed) for s in range(num_shards)]
        self._setup(actors, seed)

    def _setup(self, actors: list[Any], seed: int) -> None:
        self._actors = actors
        self.num_shards = len(actors)
        infos = _get([a.info.remote() for a in actors])
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
        actor_cls = _actor_class()
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
        return self._next_actor().extend.remote(_pack(data))

    def extend(self, data: Any) -> torch.Tensor:
        """Add a batch to the next shard; return the global indices as a ``LongTensor``."""
        return torch.from_numpy(np.array(_get(self.extend_async(data))))

    def add_async(self, item: Any) -> Any:
        """Like :meth:`add`, returning an ``ObjectRef`` to the global index."""
        return self._next_actor().add.remote(_pack(item))

    def add(self, item: Any) -> int:
        """Add one item to the next shard; return its global index (-1 if dropped)."""
        return int(_get(self.add_async(item)))

    # --- reads -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(sum(_get([a.length.remote() for a in self._actors])))

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
            packed, _ = _get(self._actors[0].sample.remote(batch_size, False))
            return _unpack(packed, copy=True)
        stats = np.array(_get([a.stats.remote() for a in self._actors]), dtype=np.float64)
        mass = stats[:, 1]
        if not stats[:, 0].any():
            raise EmptyBufferError("cannot sample: the buffer is empty (add or extend first)")
        if not mass.sum() > 0:
            raise ValueError("cannot sample: every priority in the buffer is zero")
        share = mass / mass.sum()
        counts = self._rng.multinomial(batch_size, share)
        shards = [s for s in range(self.num_shards) if counts[s]]
        refs = [self._actors[s].sample.remote(int(counts[s]), self._prioritized) for s in shards]
        replies = _get(refs)
        packed = _concat([r[0] for r in replies]) if len(replies) > 1 else replies[0][0]
        batch = _unpack(packed, copy=len(replies) == 1)
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
        _get(self.update_priority_async(index, priority))

    # --- checkpoints and lifetime ------------------------------------------------------------
    def dumps(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        """Each shard writes ``path/shard-<i>`` with ``ReplayBuffer.dumps`` (in parallel).

        Each shard's checkpoint is atomic; the set is not (a crash mid-way may leave some
        shards newer than others). ``path`` is on the actors' machines (a shared filesystem
        for a multi-machine cluster).
        """
        root = Path(path)
        _get([a.dumps.remote(str(root / f"shard-{s}"), fsync) for s, a in enumerate(self._actors)])

    def load(self, path: str | os.PathLike[str]) -> None:
        """Load ``path/shard-<i>`` into shard ``i`` (``ReplayBuffer.load``: same components)."""
        root = Path(path)
        _get([a.load.remote(str(root / f"shard-{s}")) for s, a in enumerate(self._actors)])

    def empty(self) -> None:
        """Remove every item from every shard."""
        _get([a.empty.remote() for a in self._actors])

    def close(self) -> None:
        """Kill the shard actors (their buffers are lost; :meth:`dumps` first to keep them)."""
        ray = _ray()
        for actor in self._actors:
            ray.kill(actor)
