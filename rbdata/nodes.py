"""A ``torchdata.nodes`` source over a replay buffer: :class:`BufferSource`.

:class:`BufferSource` is a :class:`torchdata.nodes.BaseNode` whose items are whole batches
drawn from a :class:`~rbdata.ReplayBuffer` (``rb.sample(batch_size)``: ``"index"``, the
sampler's extras such as ``"weight"``, and the buffer's transform) or from a storage and an
rbdata :class:`~rbdata.samplers.BatchSampler` (:meth:`BufferSource.from_storage`). The
standard nodes compose around it with no glue::

    Loader(Prefetcher(PinMemory(ParallelMapper(BufferSource(rb), transform, 2)), 4))

A :class:`~rbdata.MixedBuffer` is a source too (``BufferSource(mixed)``): its state is the
weights and each source sampler's draw state, by the rule below.

**Finite or endless.** A :class:`~rbdata.samplers.SamplerWithoutReplacement` gives one epoch per
iteration (``reset()`` starts the next one). Samplers with replacement (uniform, prioritized,
slice) are endless unless ``num_batches`` ends each iteration after that many batches.

**State.** ``get_state()`` (so ``Loader.state_dict()``) holds the batch count and the sampler's
*draw state*: everything that decides the next batches. For a uniform sampler that is its
generator; for a :class:`~rbdata.samplers.SamplerWithoutReplacement` also the epoch's
permutation and position. The priorities of a :class:`~rbdata.samplers.PrioritizedSampler` and
the episode index of a :class:`~rbdata.samplers.SliceSampler` are the buffer's data, like the
items: they are saved with the buffer (``rb.dumps``), not with the pipeline, so loading a
pipeline state never rolls them back (it restores the generator only). Prefetching nodes save
the state after the last batch handed to *you*: a resumed pipeline draws the batches that
were prefetched but never consumed again.

**Prefetching and priorities.** A prefetching pipeline draws batches ahead of the training
step, in another thread. A batch is drawn once, with the priorities of that moment: its
``"index"`` and ``"weight"`` do not change when priorities are updated after it was drawn, so
up to the pipeline's depth (``prefetch_factor`` plus the mapper's batches in flight) of the next
batches were drawn with the previous priorities. Its indices stay valid for
``update_priority`` (slots are never removed), with one caveat that holds without prefetching
too: a slot that the writer has overwritten since the draw now holds a newer item, which gets
the priority. :meth:`BufferSource.update_priority` (or any write under
``with source.lock:``) never runs at the same time as a draw: use it while a pipeline
prefetches, since the priority trees and the storage are not safe to change during a draw.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torchdata.nodes import BaseNode

from rbdata._core.index import IndexBatch
from rbdata._core.shown import shown
from rbdata.buffer import ReplayBuffer, apply_transform
from rbdata.mixed import MixedBuffer
from rbdata.samplers.base import BatchSampler, Sampler, check_batch_size
from rbdata.storages.base import Storage

__all__ = ["BufferSource"]

_STATE_KEYS = ("sampler", "batch_size", "num_yielded", "started", "sampler_state")


def _draw_state(sampler: Sampler) -> dict[str, Any]:
    """The part of ``sampler``'s state that decides its next draws (see the module doc)."""
    return sampler.draw_state()


def _load_draw_state(sampler: Sampler, state: dict[str, Any]) -> None:
    """Restore a :func:`_draw_state` (the sampler checks it before changing anything)."""
    sampler.load_draw_state(state)


class _StorageReader:
    """A storage and a sampler read like a buffer: ``sample``, ``update_priority``, ``sampler``."""

    def __init__(
        self, storage: Storage, sampler: Sampler, transform: Callable[[Any], Any] | None
    ) -> None:
        self.storage = storage
        self.sampler = sampler
        self.transform = transform

    def sample(self, batch_size: int) -> Any:
        idx, extras = self.sampler.draw(batch_size)
        batch = self.storage.__getitems__(IndexBatch(idx, extras))
        transform = self.transform
        return batch if transform is None else apply_transform(transform, batch)

    def update_priority(self, index: Any, priority: Any) -> None:
        update = getattr(self.sampler, "update_priority", None)
        if update is None:
            raise TypeError(
                f"{type(self.sampler).__name__} has no priorities: use a PrioritizedSampler"
            )
        update(index, priority)


class BufferSource(BaseNode):
    """A ``torchdata.nodes`` source node: each item is one batch drawn from a replay buffer.

    See the module documentation for finite vs endless iteration, what the state holds and
    what prefetching means for priorities.

    Args:
        buffer: the :class:`~rbdata.ReplayBuffer` to draw from (with an rbdata sampler).
            Its sampler and generator are shared: ``rb.sample()`` between steps of the
            pipeline advances the same generator.
        batch_size: items per batch; default the buffer's ``batch_size``.
        num_batches: batches per iteration for samplers with replacement (``None``:
            endless). An epoch sampler (:class:`~rbdata.samplers.SamplerWithoutReplacement`)
            ends with its epoch and takes no ``num_batches``.

    Raises:
        TypeError: if ``buffer`` is not a ``ReplayBuffer`` with an rbdata sampler.
        ValueError: for a missing or non-positive ``batch_size``, a non-positive
            ``num_batches``, or ``num_batches`` with an epoch sampler.

    Examples:
        >>> import torch
        >>> from torchdata.nodes import Loader, Prefetcher
        >>> from rbdata import ReplayBuffer, TensorStorage
        >>> rb = ReplayBuffer(TensorStorage(100), batch_size=4)
        >>> _ = rb.extend({"observation": torch.randn(10, 3)})
        >>> loader = Loader(Prefetcher(BufferSource(rb, num_batches=3), prefetch_factor=2))
        >>> [batch["index"].shape for batch in loader]
        [torch.Size([4]), torch.Size([4]), torch.Size([4])]
    """

    def __init__(
        self, buffer: ReplayBuffer, batch_size: int | None = None, num_batches: int | None = None
    ) -> None:
        if not isinstance(buffer, (ReplayBuffer, _StorageReader, MixedBuffer)):
            raise TypeError(
                f"buffer must be an rbdata ReplayBuffer or MixedBuffer, got {type(buffer).__name__}"
            )
        sampler = buffer.sampler
        if not isinstance(sampler, Sampler):
            raise TypeError(
                "buffer: BufferSource needs an rbdata Sampler (its state is the pipeline's), "
                f"got {type(sampler).__name__}"
            )
        if batch_size is None:
            batch_size = getattr(buffer, "batch_size", None)
            if batch_size is None:
                raise ValueError(
                    "batch_size: pass BufferSource(rb, batch_size=...) or "
                    "ReplayBuffer(batch_size=...), got None for both"
                )
        batch_size = check_batch_size(batch_size)
        if num_batches is not None:
            if (
                isinstance(num_batches, bool)
                or not isinstance(num_batches, int)
                or num_batches <= 0
            ):
                raise ValueError(
                    f"num_batches must be a positive integer, got {shown(num_batches)}"
                )
            if sampler.epoch_based:
                raise ValueError(
                    f"num_batches: {type(sampler).__name__} ends each iteration with its epoch; "
                    f"pass num_batches=None, got {num_batches}"
                )
        super().__init__()
        self._buffer = buffer
        self._sampler = sampler
        self.batch_size = batch_size
        self.num_batches = num_batches
        self._lock = threading.RLock()
        self._num_yielded = 0
        self._started = False

    @classmethod
    def from_storage(
        cls,
        storage: Storage,
        batch_sampler: BatchSampler,
        transform: Callable[[Any], Any] | None = None,
    ) -> BufferSource:
        """A source reading ``storage`` with an rbdata :class:`~rbdata.samplers.BatchSampler`.

        Each item is what ``DataLoader(storage, batch_sampler=batch_sampler)`` would yield
        (``"index"`` and the sampler's extras), passed through ``transform``. The batch
        sampler gives the batch size and, for samplers with replacement, ``num_batches``.
        For any other torch sampler, use ``torchdata.nodes.MapStyleWrapper``.

        Args:
            storage: the storage to read.
            batch_sampler: an rbdata ``BatchSampler`` whose sampler reads ``storage``.
            transform: called on every batch (``None``: none); its ``on_sampled`` where it
                has one, as :meth:`rbdata.ReplayBuffer.sample` does.

        Raises:
            TypeError: for a ``storage`` that is not an rbdata Storage, a ``batch_sampler``
                that is not an rbdata ``BatchSampler``, or a ``transform`` that is not
                callable.
            ValueError: if the batch sampler's sampler reads another storage.

        Examples:
            >>> import torch
            >>> from rbdata import BatchSampler, TensorStorage, UniformSampler
            >>> storage = TensorStorage(100)
            >>> storage.set(slice(0, 10), torch.arange(10.0))
            >>> batches = BatchSampler(UniformSampler(storage), batch_size=5, num_batches=2)
            >>> [b.shape for b in BufferSource.from_storage(storage, batches)]
            [torch.Size([5]), torch.Size([5])]
        """
        if not isinstance(storage, Storage):
            raise TypeError(f"storage must be an rbdata Storage, got {type(storage).__name__}")
        if not isinstance(batch_sampler, BatchSampler):
            raise TypeError(
                "batch_sampler must be an rbdata BatchSampler (use "
                "torchdata.nodes.MapStyleWrapper for other samplers), got "
                f"{type(batch_sampler).__name__}"
            )
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        sampler = batch_sampler.sampler
        if sampler.data_source is not storage:
            raise ValueError(
                f"batch_sampler: its {type(sampler).__name__} reads another data_source than "
                "storage; build it with data_source=storage"
            )
        num_batches = None if sampler.epoch_based else batch_sampler.num_batches
        reader = _StorageReader(storage, sampler, transform)
        return cls(reader, batch_sampler.batch_size, num_batches)  # type: ignore[arg-type]

    @property
    def sampler(self) -> Sampler:
        """The sampler the batches are drawn with (the buffer's)."""
        return self._sampler

    @property
    def lock(self) -> threading.RLock:
        """The lock held during each draw; hold it to write to the buffer during prefetch."""
        return self._lock

    def update_priority(self, index: Any, priority: Any) -> None:
        """``update_priority`` of the buffer (or sampler), never during a draw (see :attr:`lock`).

        Raises:
            TypeError: if the sampler has no priorities.
            ValueError: for bad indices or priorities (nothing is changed then).
        """
        with self._lock:
            self._buffer.update_priority(index, priority)

    # --- the BaseNode contract ----------------------------------------------------------------
    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start a new iteration, or resume the one ``initial_state`` was saved in.

        ``reset()`` starts over: the next batch starts a new epoch for an epoch sampler and a
        new count of ``num_batches``; the generator goes on (a reset never replays batches).

        Raises:
            ValueError: if ``initial_state`` is not a state of a source like this one (same
                sampler type and batch size); nothing is changed then.
        """
        if initial_state is None:
            with self._lock:
                self._num_yielded = 0
                self._started = False
            super().reset(None)
            return
        num_yielded, started, sampler_state = self._check_state(initial_state)
        with self._lock:
            try:
                _load_draw_state(self._sampler, sampler_state)
            except (KeyError, TypeError, RuntimeError) as e:
                raise ValueError(
                    f"initial_state['sampler_state']: not a state of this "
                    f"{type(self._sampler).__name__} ({type(e).__name__}: {e})"
                ) from e
            self._num_yielded = num_yielded
            self._started = started
        super().reset(initial_state)

    def _check_state(self, state: Any) -> tuple[int, bool, dict[str, Any]]:
        if not isinstance(state, dict) or any(k not in state for k in _STATE_KEYS):
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"initial_state: expected a dict with keys {_STATE_KEYS}, got {keys}")
        kind = type(self._sampler).__name__
        if state["sampler"] != kind:
            raise ValueError(
                f"initial_state['sampler']: the state is for a {state['sampler']}, this source "
                f"draws with a {kind}"
            )
        if state["batch_size"] != self.batch_size:
            raise ValueError(
                f"initial_state['batch_size']: the state was saved with {state['batch_size']}, "
                f"this source has {self.batch_size}"
            )
        num_yielded = state["num_yielded"]
        if isinstance(num_yielded, bool) or not isinstance(num_yielded, int) or num_yielded < 0:
            raise ValueError(
                f"initial_state['num_yielded']: expected an int >= 0, got {num_yielded!r}"
            )
        started = state["started"]
        if not isinstance(started, bool):
            raise ValueError(f"initial_state['started']: expected a bool, got {started!r}")
        sampler_state = state["sampler_state"]
        if not isinstance(sampler_state, dict):
            raise ValueError(
                "initial_state['sampler_state']: expected a dict, got "
                f"{type(sampler_state).__name__}"
            )
        return num_yielded, started, sampler_state

    def next(self) -> Any:
        """Draw the next batch (``StopIteration`` at the end of an epoch or ``num_batches``)."""
        with self._lock:
            sampler = self._sampler
            if sampler.epoch_based:
                if not self._started:
                    sampler.begin_epoch()  # a fresh epoch (raises if the buffer is empty)
                    self._started = True
                if sampler.epoch_over(self.batch_size):
                    raise StopIteration
            else:
                self._started = True
                if self.num_batches is not None and self._num_yielded >= self.num_batches:
                    raise StopIteration
            batch = self._buffer.sample(self.batch_size)
            self._num_yielded += 1
            return batch

    def get_state(self) -> dict[str, Any]:
        """Sampler type, batch size, batches yielded since the reset, and the draw state."""
        with self._lock:
            return {
                "sampler": type(self._sampler).__name__,
                "batch_size": self.batch_size,
                "num_yielded": self._num_yielded,
                "started": self._started,
                "sampler_state": _draw_state(self._sampler),
            }

    @property
    def num_yielded(self) -> int:
        """Batches drawn since the last reset (prefetched ones included)."""
        return self._num_yielded

    def __repr__(self) -> str:
        return (
            f"BufferSource(sampler={type(self._sampler).__name__}, batch_size={self.batch_size}, "
            f"num_batches={self.num_batches})"
        )
