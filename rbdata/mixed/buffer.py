"""``MixedBuffer``: batches drawn from several sources in fixed proportions (RLPD, Cal-QL)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import torch

from rbdata import checkpoint
from rbdata.mixed import _checkpoint
from rbdata.mixed._batch import assemble, fill_extras
from rbdata.mixed._counts import check_weights
from rbdata.mixed._priorities import route_priorities, split_index
from rbdata.mixed._sources import make_sources, select_keys
from rbdata.mixed.dataset import MixedDataset
from rbdata.mixed.sampler import MixedSampler
from rbdata.samplers.base import BatchSampler, check_batch_size

__all__ = ["MixedBuffer"]


class MixedBuffer:
    """Batches from several sources, exactly ``round(w_i * B)`` items from source ``i``.

    The sources are offline datasets (:class:`~rbdata.datasets.D4RL`,
    :class:`~rbdata.datasets.Minari`), live :class:`~rbdata.ReplayBuffer` s and bare
    storages; each is sampled by its own sampler (uniform, prioritized, slices). A batch of
    ``B`` takes ``largest_remainder(weights, B)`` items from the sources (each count is
    ``floor(w_i / sum(w) * B)`` or one more, the extra items going to the largest
    remainders, so the counts sum to ``B``), source after source, in the order of
    ``sources``. A source that holds no data yet counts as weight 0: its share goes to the
    others until it has data. The two-source case is RLPD's symmetric sampling:
    ``MixedBuffer({"offline": D4RL(...), "online": rb}, {"offline": 0.5, "online": 0.5})``.

    **Indices.** Source ``i``'s row ``r`` has the *combined index* ``offsets[i] + r``
    (:attr:`offsets`: the sum of the capacities of the sources before it), which never
    changes as sources fill up. TensorDict batches carry ``"index"`` (combined),
    ``"source"`` (the source's position in ``sources``, int64) and the samplers' extras
    (``"weight"``, in every batch if any source is prioritized: 1 for rows of samplers
    without importance weights). So
    ``mixed.update_priority(batch["index"], p)`` routes each row to its source's sampler,
    and :meth:`locate` gives each row's source and row within it.

    **Layouts.** Every source must hold the same keys, shapes and dtypes (checked when a
    source first has data; the error names the differing keys). ``keys=[...]`` keeps those
    keys only; ``drop_info=True`` leaves out the ``("info", ...)`` keys of offline datasets.

    Args:
        sources: source name -> :class:`~rbdata.ReplayBuffer`, offline dataset or
            :class:`~rbdata.storages.Storage` (their transforms are not applied: a source
            with one is refused).
        weights: source name -> weight (finite, ``>= 0``, one at least positive); the
            proportions are ``w_i / sum(w)``. Assign :attr:`weights` to change them.
        samplers: source name -> sampler, for datasets and storages (default: a dataset's
            own sampler, a :class:`~rbdata.samplers.UniformSampler` for a storage). A
            buffer samples with its own sampler, which sees its writes.
        batch_size: default batch size of :meth:`sample` and iteration.
        generator: seeds the samplers the mixture creates (storages without a sampler).
        keys: keep only these keys (str or tuple of str each) of every source.
        drop_info: leave out the ``("info", ...)`` keys.

    Raises:
        TypeError: a source, sampler, weight or option of the wrong type.
        ValueError: bad weights, a sampler bound to another storage, an epoch sampler
            (:class:`~rbdata.samplers.SamplerWithoutReplacement`), sources on different
            devices or whose keys, shapes or dtypes differ. Nothing is bound then.

    Examples:
        >>> import torch
        >>> from rbdata import MixedBuffer, ReplayBuffer, TensorStorage
        >>> offline = TensorStorage(100)
        >>> offline.set(slice(0, 100), {"obs": torch.zeros(100, 3)})
        >>> online = ReplayBuffer(TensorStorage(1000))
        >>> mixed = MixedBuffer({"offline": offline, "online": online},
        ...                     {"offline": 0.5, "online": 0.5}, batch_size=8)
        >>> mixed.sample()["source"].tolist()  # online is empty: all from offline
        [0, 0, 0, 0, 0, 0, 0, 0]
        >>> _ = online.extend({"obs": torch.ones(10, 3)})
        >>> batch = mixed.sample()
        >>> batch["source"].tolist(), bool((batch["index"][4:] >= 100).all())
        ([0, 0, 0, 0, 1, 1, 1, 1], True)
        >>> mixed.weights = {"offline": 0.25, "online": 0.75}
        >>> mixed.sample()["source"].tolist()
        [0, 0, 1, 1, 1, 1, 1, 1]
    """

    def __init__(
        self,
        sources: Mapping[str, Any],
        weights: Mapping[str, float],
        *,
        samplers: Mapping[str, Any] | None = None,
        batch_size: int | None = None,
        generator: torch.Generator | None = None,
        keys: Any = None,
        drop_info: bool = False,
    ) -> None:
        keys, drop_info = select_keys(keys, drop_info)
        batch_size = None if batch_size is None else check_batch_size(batch_size)
        if isinstance(sources, Mapping) and sources:  # weights: checked before any binding
            check_weights(weights, list(sources))
        parts, layout = make_sources(sources, samplers, generator, keys, drop_info)
        self._sources = parts
        self.dataset = MixedDataset(parts, layout)
        self.sampler = MixedSampler(parts, weights, self.dataset, layout, keys, drop_info)
        self.dataset.owner = self.sampler
        self.batch_size = batch_size
        self._device = parts[0].storage.device
        self._options = {"keys": keys, "drop_info": drop_info}

    # --- what it is ------------------------------------------------------------------------
    @property
    def sources(self) -> Mapping[str, Any]:
        """The sources, by name (read-only)."""
        return MappingProxyType({s.name: s.obj for s in self._sources})

    @property
    def samplers(self) -> Mapping[str, Any]:
        """Each source's sampler, by name (read-only)."""
        return MappingProxyType({s.name: s.sampler for s in self._sources})

    @property
    def offsets(self) -> Mapping[str, int]:
        """Each source's first combined index, by name (read-only)."""
        return MappingProxyType({s.name: s.offset for s in self._sources})

    @property
    def weights(self) -> Mapping[str, float]:
        """The weights by source name (read-only; assign a new dict to change them).

        Assigning checks the whole dict (every source, finite, ``>= 0``, one positive)
        before anything changes; the next batch uses the new counts.
        """
        return MappingProxyType(self.sampler.weights)

    @weights.setter
    def weights(self, weights: Mapping[str, float]) -> None:
        self.sampler.weights = weights

    def counts(self, batch_size: int | None = None) -> dict[str, int]:
        """How many items of a batch each source gives now (empty sources: 0)."""
        counts = self.sampler.plan(self._batch_size(batch_size))[0]
        return dict(zip(self.sampler.names, counts, strict=True))

    def locate(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Combined indices as ``(source position, row within the source)`` tensors."""
        position, idx = split_index(index, self._sources)
        offsets = torch.tensor([s.offset for s in self._sources], device=idx.device)
        return position, idx - offsets[position]

    def __getitem__(self, index: Any) -> Any:
        """``mixed[index]``: the rows at combined ``index``, as ``mixed.dataset[index]`` gives.

        An int gives one row, anything else (indices, a tensor) a batch with ``"index"`` and
        ``"source"``.

        Raises:
            ~rbdata.errors.IndexOutOfRangeError: an index outside ``[0, len(mixed.dataset))``
                (the sum of the sources' capacities) or past its source's filled rows, as
                ``rb[index]`` raises for a :class:`~rbdata.ReplayBuffer` (an ``IndexError``).
        """
        return self.dataset[index]

    def __len__(self) -> int:
        """Items in all sources together."""
        return sum(len(s) for s in self._sources)

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{s.name}={type(s.obj).__name__}(len={len(s)}, weight={w:g})"
            for s, w in zip(self._sources, self.sampler.weights.values(), strict=True)
        )
        return f"MixedBuffer({parts}, batch_size={self.batch_size})"

    # --- sampling --------------------------------------------------------------------------
    def _batch_size(self, batch_size: int | None) -> int:
        if batch_size is not None:
            return check_batch_size(batch_size)
        if self.batch_size is None:
            raise ValueError("batch_size: pass sample(batch_size) or MixedBuffer(batch_size=...)")
        return self.batch_size

    def sample(self, batch_size: int | None = None) -> Any:
        """Draw one batch (default size: ``batch_size``), source after source.

        Raises:
            ~rbdata.errors.EmptyBufferError: no source with a positive weight holds data.
        """
        n = self._batch_size(batch_size)
        sampler = self.sampler
        parts, extras, counts, plan = sampler.draw_parts(n)
        extra = fill_extras(extras, counts, sampler.weighted)
        layout = sampler.layout
        assert layout is not None  # a drawn source has data, hence a layout
        return assemble(parts, layout, n, self._device, extra, self.dataset.row_gather, plan)

    def __iter__(self) -> Iterator[Any]:
        """Endless batches of ``batch_size``."""
        n = self._batch_size(None)
        while True:
            yield self.sample(n)

    def batch_sampler(
        self, batch_size: int | None = None, num_batches: int | None = None
    ) -> BatchSampler:
        """A batch sampler of combined indices for ``DataLoader(mixed.dataset, batch_sampler=...)``.

        Its batches are this mixture's (same counts, same samplers: drawing advances them);
        ``num_batches`` ends each iteration (``None``: endless). Its ``state_dict`` is the
        mixture's (:meth:`state_dict`), so ``StatefulDataLoader`` resumes it.
        """
        return BatchSampler(self.sampler, self._batch_size(batch_size), num_batches)

    def update_priority(self, index: Any, priority: Any) -> None:
        """Set priorities by combined index (``batch["index"]``), each row in its source.

        Rows of sources whose sampler has no priorities (uniform) are skipped. Everything
        is checked before any sampler changes, each source's priorities by its sampler's
        ``check_priority`` (a tree total that would overflow included): a refused call
        changes no source (on CUDA, a call that updates several sources waits for the GPU).

        Raises:
            TypeError: no source samples with priorities, or bad types.
            ~rbdata.errors.IndexOutOfRangeError: an index outside its source's filled rows
                (the source is named); an ``IndexError`` and a ``ValueError``, as
                ``rb.update_priority`` raises it.
            ValueError: a NaN, infinite or negative priority, or a count that is neither 1
                nor one per index.
        """
        routes = route_priorities(self._sources, index, priority)
        if len(routes) > 1:  # one sampler's own update is all or nothing already
            for source, local, priority_i in routes:
                check = getattr(source.sampler, "check_priority", None)
                if callable(check):
                    check(local, priority_i)
        for source, local, priority_i in routes:
            source.sampler.update_priority(local, priority_i)  # type: ignore[attr-defined]

    # --- state and checkpoints -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The weights and every source sampler's state (no items: see :meth:`dumps`)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`, all of it or nothing (``ValueError`` says why)."""
        self.sampler.load_state_dict(state)

    def dumps(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        """Write the mixture to directory ``path``, atomically and without pickle.

        Buffer and storage sources are saved whole (as ``rb.dumps`` saves a buffer); offline
        datasets are recorded by identity (family, id, backend, size, source sha256) and
        cache path, not copied; every sampler's state, the weights, ``batch_size`` and the
        key options are saved. See ``docs/offline_to_online.md``.

        Raises:
            TypeError: a component that cannot be saved without pickle (nothing is written).
            FileExistsError: ``path`` holds files that are not a checkpoint's.
        """
        _checkpoint.dump(self, path, fsync=fsync)

    def load(self, path: str | os.PathLike[str], *, verify: bool = False) -> None:
        """Load a :meth:`dumps` checkpoint into this mixture (all of it, or nothing).

        The sources must match the checkpoint's by name, kind and order; each offline
        dataset must be the recorded one (same family, id, backend, size and source
        sha256); samplers, buffers and storages must have the checkpoint's classes and
        configuration. Buffers and storages get the saved items, every sampler its state,
        and the mixture its weights; ``batch_size`` is kept.

        Raises:
            ValueError: anything differs (nothing is changed then).
            rbdata.errors.CheckpointError: a missing, tampered or foreign checkpoint.
        """
        _checkpoint.load_into(self, path, verify=verify)

    def _loads_into(self, path: str | os.PathLike[str], *, verify: bool = False) -> MixedBuffer:
        self.load(path, verify=verify)
        return self

    @checkpoint.LoadsDescriptor.in_place(_loads_into)
    @classmethod
    def loads(
        cls,
        path: str | os.PathLike[str],
        *,
        datasets: Mapping[str, Any] | None = None,
        verify: bool = False,
    ) -> MixedBuffer:
        """A new mixture from checkpoint ``path`` (on the class); on a mixture, :meth:`load`.

        Buffers and storages are rebuilt from their saved checkpoints; offline datasets are
        reopened from the cache path recorded by :meth:`dumps` (or taken from
        ``datasets``) and refused unless they are the recorded dataset. Sampling continues
        where the saved mixture was.

        Args:
            path: a directory written by :meth:`dumps`.
            datasets: source name -> offline dataset, for datasets whose cache moved.
            verify: check every saved file's checksum (see :meth:`rbdata.ReplayBuffer.loads`).

        Raises:
            ValueError: a dataset that is not the recorded one.
            rbdata.errors.CheckpointError: a missing, tampered or foreign checkpoint.
        """
        kwargs, states = _checkpoint.build(path, datasets, verify)
        mixed = cls(**kwargs)
        for name, state in states.items():
            mixed.samplers[name].load_state_dict(state)
        return mixed
