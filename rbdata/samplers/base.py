"""The sampler contract: a seeded, stateful :class:`torch.utils.data.Sampler` of storage indices.

A sampler draws whole batches with :meth:`Sampler.draw` (indices plus per-item extras such as
importance weights) and :meth:`Sampler.sample` (indices only). Iterating it yields ints, so it
plugs into ``DataLoader(storage, sampler=s, batch_size=B)``; :class:`BatchSampler` yields one
index batch per step for ``DataLoader(storage, batch_sampler=...)``. Both iterators are
*stateful* in torchdata's sense and draw lazily, so ``StatefulDataLoader`` resumes mid-epoch with
exactly the batches it would have produced.
"""

from __future__ import annotations

import numbers
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler as TorchSampler

from rbdata._core.index import IndexBatch
from rbdata._core.shown import shown
from rbdata.errors import EmptyBufferError

__all__ = [
    "BatchSampler",
    "IndexBatch",
    "Sampler",
    "check_batch_size",
    "check_bool",
    "default_generator",
]


def default_generator() -> torch.Generator:
    """A private generator seeded once from torch's global RNG (so ``torch.manual_seed`` rules).

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> a = default_generator().initial_seed()
        >>> _ = torch.manual_seed(0)
        >>> a == default_generator().initial_seed()
        True
    """
    seed = int(torch.empty((), dtype=torch.int64).random_().item())
    return torch.Generator().manual_seed(seed)


def check_batch_size(batch_size: Any) -> int:
    """Return ``batch_size`` as a positive int or raise ``ValueError`` naming it.

    Integer-like values (``numpy.int64``, anything :class:`numbers.Integral` but a bool) are
    accepted.

    Examples:
        >>> import numpy as np
        >>> check_batch_size(np.int64(4))
        4
    """
    if type(batch_size) is int and batch_size > 0:  # the common case: one type check
        return batch_size
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, numbers.Integral)
        or batch_size <= 0
    ):
        raise ValueError(f"batch_size must be a positive integer, got {shown(batch_size)}")
    return int(batch_size)


def check_bool(value: Any, name: str) -> bool:
    """Return ``value`` as a bool, or raise ``TypeError`` naming ``name`` if it is not one.

    ``bool`` and ``numpy.bool_`` are accepted; strings, ints and ``None`` are not (``"no"``
    would otherwise be true).

    Examples:
        >>> check_bool(False, "replacement")
        False
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {shown(value)} ({type(value).__name__})")


class _SampleIterator(Iterator[Any]):
    """Lazy, stateful iterator over a sampler's draws (ints or index batches).

    Nothing is drawn before the first ``next``: torchdata creates a fresh iterator *after*
    restoring the sampler's state and then restores the iterator's, so an eager draw would
    advance the generator. Drawn-but-unyielded ints are part of the state.
    """

    def __init__(
        self, sampler: Sampler, total: int | None, batch_size: int | None, wrap: bool = True
    ) -> None:
        self.sampler = sampler
        self.wrap = wrap  # batches as IndexBatch (for DataLoader) or (index, extras) tuples
        self.remaining = total  # None: endless
        self.batch_size = batch_size  # None: yield ints
        self.pending: list[int] = []
        self.started = False

    def __iter__(self) -> _SampleIterator:
        return self

    def __next__(self) -> Any:
        if not self.started:
            self.started = True
            self.sampler.begin_epoch()
        if self.batch_size is None:
            if not self.pending:
                if self.remaining is not None and self.remaining <= 0:
                    raise StopIteration
                k = self.sampler._iter_chunk
                if self.remaining is not None:
                    k = min(k, self.remaining)
                    self.remaining -= k
                self.pending = self.sampler.sample(k).tolist()[::-1]
            return self.pending.pop()
        if self.remaining is not None:
            if self.remaining <= 0:
                raise StopIteration
            self.remaining -= 1
        elif self.sampler.epoch_over(self.batch_size):
            raise StopIteration
        idx, extras = self.sampler.draw(self.batch_size)
        return IndexBatch(idx, extras) if self.wrap else (idx, extras)

    def state_dict(self) -> dict[str, Any]:
        return {
            "remaining": self.remaining,
            "pending": list(self.pending),
            "started": self.started,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.remaining = state["remaining"]
        self.pending = list(state["pending"])
        self.started = bool(state["started"])


class _Packed:
    """A generator (its state) or a tensor, pickled as a numpy array."""

    __slots__ = ("array", "device", "kind")

    def __init__(self, kind: str, device: str, array: np.ndarray) -> None:
        self.kind, self.device, self.array = kind, device, array

    def __getstate__(self) -> tuple[str, str, np.ndarray]:
        return self.kind, self.device, self.array

    def __setstate__(self, state: tuple[str, str, np.ndarray]) -> None:
        self.kind, self.device, self.array = state

    def unpack(self) -> Any:
        data = torch.from_numpy(self.array)
        if self.kind == "generator":
            gen = torch.Generator(device=self.device)
            gen.set_state(data)
            return gen
        return data.to(self.device)


class Sampler(TorchSampler[int]):
    """Base class: iterate indices like any torch sampler, or draw a batch with ``sample``.

    Subclasses implement :meth:`draw`; the base owns iteration, state and validation.

    **For implementers.** Every batch iterator (the sampler's own, :class:`BatchSampler`'s,
    :class:`~rbdata.nodes.BufferSource`) runs one loop over two epoch hooks: at its first
    batch it calls :meth:`begin_epoch`, and before each batch it asks :meth:`epoch_over`
    (an :attr:`epoch_based` sampler's iteration ends there; the others' is ended by a count
    of batches). The defaults suit samplers with replacement: no epoch, never over.
    :meth:`describe_state` adds summary values to ``rbdata inspect``'s view of a saved
    :meth:`state_dict`; :meth:`draw_state` is what a pipeline saves (the buffer's data aside).

    Args:
        data_source: the storage (anything with ``__len__``) to sample from; ``None`` lets a
            :class:`~rbdata.ReplayBuffer` bind its storage.
        generator: the random generator; ``None`` creates a private one seeded from torch's
            global RNG. Its state is part of :meth:`state_dict`.
    """

    #: ints drawn at a time when iterating the sampler itself
    _iter_chunk = 64
    #: whether iteration ends with an epoch (else a buffer iterates forever)
    epoch_based = False

    def __init__(self, data_source: Sized | None, generator: torch.Generator | None) -> None:
        self.data_source = data_source
        self.generator = default_generator() if generator is None else generator
        # set by load_state_dict: the state is authoritative, attach must not re-derive it
        self._restored = False

    def _length(self) -> int:
        source = self.data_source
        if source is None:
            raise RuntimeError(
                f"{type(self).__name__} has no data_source: pass one or use it in a ReplayBuffer"
            )
        n = len(source)
        if n == 0:
            raise EmptyBufferError("cannot sample: the buffer is empty (add or extend first)")
        return n

    @abstractmethod
    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Draw one batch: a ``LongTensor`` of indices and per-item extras (may be empty)."""

    def sample(self, batch_size: int) -> torch.Tensor:
        """Draw one batch of ``batch_size`` indices as a ``LongTensor``."""
        return self.draw(check_batch_size(batch_size))[0]

    def check_source(self, storage: Sized) -> None:
        """Raise ``ValueError`` if this sampler cannot read ``storage`` (e.g. too small).

        Called by :meth:`attach` before anything is bound; a sampler given a ``data_source``
        at construction calls it too. The default accepts any storage.
        """

    def attach(self, storage: Sized) -> None:
        """Bind to the storage of a buffer (called by :class:`~rbdata.ReplayBuffer`).

        Raises:
            ValueError: if the sampler already reads another storage, or cannot read this one
                (:meth:`check_source`); nothing is changed then.
        """
        self.check_source(storage)
        if self.data_source is None:
            self.data_source = storage
        elif self.data_source is not storage:
            raise ValueError(
                f"{type(self).__name__} already reads another data_source; "
                "use one sampler per storage"
            )

    def check_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Called by the buffer *before* ``data`` is written at ``index`` (an int or a tensor).

        Raise here (and change nothing) to refuse a write: the buffer's writer then leaves the
        storage and its own state as they were. A sampler that validates here may keep what it
        computed for the :meth:`on_write` that follows a successful write.
        """

    def on_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Called by the buffer after ``data`` was written at ``index`` (an int or a tensor).

        It must not fail for a write that :meth:`check_write` accepted.
        """

    def reset(self) -> None:
        """Forget everything about the data (called by ``ReplayBuffer.empty``)."""

    def begin_epoch(self) -> None:
        """Called at the first draw of an iterator (epoch samplers start a fresh epoch).

        Raises:
            ~rbdata.errors.EmptyBufferError: an epoch sampler over an empty storage.
        """

    def epoch_over(self, batch_size: int) -> bool:
        """Whether the epoch that :meth:`begin_epoch` started has no batch of ``batch_size`` left.

        The default (samplers with replacement): never.
        """
        return False

    #: whether :meth:`on_write` reads the written data (a buffer then reads the items other
    #: processes wrote before handing them over; others get ``data=None`` for those)
    on_write_reads_data = False

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the generator as its state bytes and tensors as numpy arrays (plain data).

        ``multiprocessing`` pickles tensors and generators through torch's shared memory:
        that fails for a generator in a spawned child ("unable to resize file") and moves
        the sender's tensors to new memory behind the back of numpy views of them. Plain
        bytes avoid both; the receiver gets a copy.
        """
        state = {}
        for name, value in self.__dict__.items():
            if isinstance(value, torch.Generator):
                value = _Packed("generator", str(value.device), value.get_state().numpy().copy())
            elif isinstance(value, torch.Tensor):
                value = _Packed("tensor", str(value.device), value.detach().cpu().numpy().copy())
            state[name] = value
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            if isinstance(value, _Packed):
                state[name] = value.unpack()
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.data_source) if self.data_source is not None else 0

    def __iter__(self) -> Iterator[int]:
        return _SampleIterator(self, total=len(self), batch_size=None)

    def config(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this sampler (used by checkpoints).

        ``data_source`` and ``generator`` are left out: a buffer binds the storage, and
        checkpoints restore the generator from :meth:`state_dict`.
        """
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state, including its generator."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`."""
        self.generator.set_state(state["generator"])
        self._restored = True

    def draw_state(self) -> dict[str, Any]:
        """What decides the next draws, the buffer's data (priorities, episodes) left out."""
        return self.state_dict()

    def load_draw_state(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`draw_state` (checked before anything changes)."""
        self.load_state_dict(state)

    @classmethod
    def describe_state(
        cls, state: Mapping[str, Any], read: Callable[[Any, int], float | None]
    ) -> dict[str, Any]:
        """Summary values of a saved :meth:`state_dict`, for ``rbdata inspect`` (for implementers).

        ``state`` is the state as saved, its tensors not loaded; ``read(value, i)`` returns
        element ``i`` of the saved one-dimensional floating tensor that the state entry
        ``value`` stands for (one small read), or ``None`` when ``value`` is no such tensor,
        it is too short or the element is not finite. The items returned are shown with the
        state. The default adds nothing.

        Examples:
            >>> Sampler.describe_state({"generator": "<tensor>"}, lambda value, i: None)
            {}
        """
        del state, read
        return {}


class BatchSampler(TorchSampler[list[int]]):
    """One index batch per step from ``sampler.draw(batch_size)``, for ``batch_sampler=``.

    Epoch samplers (:class:`~rbdata.samplers.SamplerWithoutReplacement`) give one epoch per
    iteration; the others go on for ``num_batches`` batches (forever if ``None``). Each batch is
    an :class:`!IndexBatch`, so ``DataLoader(storage, batch_sampler=...)`` batches carry
    ``"index"`` and the sampler's extras (e.g. ``"weight"``).

    Args:
        sampler: an rbdata sampler.
        batch_size: indices per batch.
        num_batches: batches per iteration for non-epoch samplers (``None``: endless).

    Examples:
        >>> import torch
        >>> from rbdata.samplers import UniformSampler
        >>> batches = BatchSampler(UniformSampler(range(100)), batch_size=4, num_batches=2)
        >>> [len(b) for b in batches]
        [4, 4]
    """

    def __init__(self, sampler: Sampler, batch_size: int, num_batches: int | None = None):
        self.sampler = sampler
        self.batch_size = check_batch_size(batch_size)
        if num_batches is not None and (not isinstance(num_batches, int) or num_batches <= 0):
            raise ValueError(f"num_batches must be a positive integer, got {shown(num_batches)}")
        self.num_batches = num_batches

    def __iter__(self) -> Iterator[list[int]]:
        total = None if self.sampler.epoch_based else self.num_batches
        return _SampleIterator(self.sampler, total=total, batch_size=self.batch_size)

    def draws(self) -> Iterator[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        """Like iteration, but yield ``(index, extras)`` tensors (no Python list of ints)."""
        total = None if self.sampler.epoch_based else self.num_batches
        return _SampleIterator(self.sampler, total=total, batch_size=self.batch_size, wrap=False)

    def __len__(self) -> int:
        if self.sampler.epoch_based:
            return self.sampler._epoch_batches(self.batch_size)  # type: ignore[attr-defined]
        if self.num_batches is None:
            raise TypeError("an endless BatchSampler (num_batches=None) has no len()")
        return self.num_batches

    def state_dict(self) -> dict[str, Any]:
        """The wrapped sampler's state."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the wrapped sampler's state."""
        self.sampler.load_state_dict(state)
