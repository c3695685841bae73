"""``ReplayBuffer``: a storage, a sampler, a writer and an optional transform, composed."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from tensordict import TensorDictBase

from rbdata import checkpoint
from rbdata._core.index import as_index_tensor
from rbdata._core.torchrl_names import (
    BUFFER_ATTRIBUTES,
    BUFFER_KEYWORDS,
    torchrl_attribute_error,
    torchrl_keywords,
)
from rbdata.errors import EmptyBufferError
from rbdata.samplers.base import BatchSampler, Sampler, check_batch_size
from rbdata.samplers.uniform import UniformSampler
from rbdata.storages.base import Storage
from rbdata.writers.base import Writer
from rbdata.writers.round_robin import RoundRobinWriter

__all__ = ["ClosedStorage", "ReplayBuffer", "apply_transform", "priority_of_batch"]


_CLOSED = "the buffer is closed (ReplayBuffer.close() was called)"


class ClosedStorage:
    """What ``rb.storage`` is once the buffer is closed: every use raises ``ValueError``.

    Every path of the buffer (``add``, ``extend``, ``sample``, ``len``, iteration,
    ``rb[index]``, checkpoints) reaches its storage first, so a closed buffer says so there,
    at no cost to an open one.
    """

    def __getattr__(self, name: str) -> NoReturn:
        raise ValueError(_CLOSED)

    def __len__(self) -> int:
        raise ValueError(_CLOSED)

    def __getitem__(self, index: Any) -> NoReturn:
        raise ValueError(_CLOSED)

    def __repr__(self) -> str:
        return "<closed>"


def priority_of_batch(batch: Any, priority_key: Any) -> tuple[Any, Any]:
    """``(batch["index"], batch[priority_key])`` of a sampled TensorDict (or dict) batch.

    Raises:
        TypeError: ``batch`` is no TensorDict or dict (a plain tensor has no index: sample
            with ``return_info=True``).
        ValueError: an entry is missing; the message names it.
    """
    if not isinstance(batch, (TensorDictBase, Mapping)):
        raise TypeError(
            f"update_priority(index, priority): priority is missing, and a "
            f"{type(batch).__name__} carries no index to update; plain-tensor batches have "
            "no 'index' entry: draw them with `batch, info = rb.sample(return_info=True)` "
            "and call rb.update_priority(info['index'], priority)"
        )
    found = []
    for key, role in (("index", "the slots ('index', as sampled)"), (priority_key, None)):
        value: Any = batch
        for part in (key,) if isinstance(key, str) else key:
            if not isinstance(value, (TensorDictBase, Mapping)) or part not in value.keys():
                what = role or f"the priorities (the buffer's priority_key {key!r})"
                raise ValueError(
                    f"update_priority(batch): the batch has no {key!r} entry for {what}; "
                    "set ReplayBuffer(priority_key=...) or call update_priority(index, priority)"
                )
            value = value[part]
        found.append(value.detach() if isinstance(value, torch.Tensor) else value)
    return found[0], found[1]


def apply_transform(transform: Callable[[Any], Any], batch: Any) -> Any:
    """``transform``'s ``on_sampled(batch)`` where it has one, else ``transform(batch)``.

    For a batch a storage's ``gather`` has just made (see :class:`ReplayBuffer`'s
    ``transform``).
    """
    on_sampled = getattr(transform, "on_sampled", None)
    return transform(batch) if on_sampled is None else on_sampled(batch)


class ReplayBuffer:
    """A replay buffer assembled from parts; it adds no data path of its own.

    ``sample`` is sampler indices → ``storage`` gather → ``transform``: the same cost as
    ``DataLoader(storage, batch_sampler=...)``. TensorDict batches carry an ``"index"`` entry
    with the storage slot of each item.

    Args:
        storage: where items live (:mod:`rbdata.storages`).
        sampler: which items to read; default :class:`~rbdata.samplers.UniformSampler`
            (with replacement). A sampler whose ``data_source`` is ``None`` is bound to
            ``storage``.
        writer: where items go; default :class:`~rbdata.writers.RoundRobinWriter`.
        transform: called on every sampled batch. A transform with an ``on_sampled(batch)``
            method gets that call instead, on the batch the storage's ``gather`` has just
            returned (nothing but the buffer has seen it): it may write into the tensors
            that gather made (:class:`~rbdata.HindsightRelabel` does, on tensor and memmap
            storages, whose gathers make new tensors; calling it never does).
        batch_size: default batch size of :meth:`sample` and of iteration.
        priority_key: the entry of a batch that :meth:`update_priority` reads the
            priorities from when given a whole batch (torchrl's default, ``"td_error"``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rbdata.storages import TensorStorage
        >>> rb = ReplayBuffer(storage=TensorStorage(1000), batch_size=4)
        >>> rb.extend(TensorDict({"observation": torch.randn(10, 3)}, batch_size=[10])).shape
        torch.Size([10])
        >>> batch = rb.sample()
        >>> batch.batch_size, batch["index"].shape
        (torch.Size([4]), torch.Size([4]))
    """

    @torchrl_keywords(BUFFER_KEYWORDS)
    def __init__(
        self,
        storage: Storage,
        sampler: Sampler | None = None,
        writer: Writer | None = None,
        transform: Callable[[Any], Any] | None = None,
        batch_size: int | None = None,
        *,
        priority_key: str | tuple[str, ...] = "td_error",
    ) -> None:
        if not isinstance(storage, Storage):
            raise TypeError(f"storage must be an rbdata Storage, got {type(storage).__name__}")
        # every argument is checked before the sampler is bound to the storage
        if writer is None:
            writer = RoundRobinWriter()
        elif not isinstance(writer, Writer) and not (
            callable(getattr(writer, "add", None)) and callable(getattr(writer, "extend", None))
        ):
            raise TypeError(
                "writer must be an rbdata Writer (or have add(storage, item) and "
                f"extend(storage, data) methods), got {type(writer).__name__}"
            )
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        batch_size = None if batch_size is None else check_batch_size(batch_size)
        if sampler is None:
            sampler = UniformSampler(storage)
        elif not callable(getattr(sampler, "sample", None)):
            raise TypeError(
                f"sampler must have a sample(batch_size) method, got {type(sampler).__name__}"
            )
        if isinstance(sampler, Sampler):
            sampler.attach(storage)
        elif getattr(sampler, "data_source", storage) is None:
            sampler.data_source = storage
        self.storage = storage
        self.sampler = sampler
        self.writer = writer
        self.transform = transform
        self.batch_size = batch_size
        self.priority_key = priority_key
        self._written = len(storage)  # write_count
        # rbdata's samplers draw in-range indices by construction: skip the range check.
        self._trusted = isinstance(sampler, Sampler) and sampler.data_source is storage
        self._update_priority = getattr(sampler, "update_priority", None)
        # only samplers that override on_write pay a call per add
        self._hooked = (
            isinstance(sampler, Sampler) and type(sampler).on_write is not Sampler.on_write
        )
        # samplers that validate writes are asked before the write (the writer calls
        # check_write between choosing the slots and writing); a writer without a ``check``
        # parameter gets the check after its write, as the only thing it allows
        checked = self._hooked and type(sampler).check_write is not Sampler.check_write
        self._check = sampler.check_write if checked else None
        self._pre_add = checked and _takes_check(writer.add)
        self._pre_extend = checked and _takes_check(writer.extend)
        # the storage's shared write counter as last seen here (None: it does not count);
        # writes by other processes are handed to the sampler on sample/len (see _sync)
        self._seen: int | None = storage.write_count if self._hooked else None
        self._own_seen = storage.own_writes  # this process's commits, as last seen here
        self._wants_data = bool(getattr(sampler, "on_write_reads_data", False))

    def __len__(self) -> int:
        if self._seen is not None:
            self._sync()
        return len(self.storage)

    # --- writes by other processes ---------------------------------------------------------
    def _sync(self) -> None:
        """Hand the items other processes wrote since the last look to the sampler.

        A storage shared between processes (a ``MemmapStorage`` other processes write)
        counts every commit in ``write_count``; the buffer remembers the last count it saw.
        When it moved, the new slots are the ``d`` slots of the ring that end at the shared
        ``next_slot`` (read together under the write lock, so they agree), or every slot if
        ``d`` is at least the capacity. The sampler's ``on_write`` gets them (the data is
        read only for samplers that index it, e.g. the slice sampler's end flags), so they
        become sampleable with the default priority.
        """
        storage, seen = self.storage, self._seen
        if seen is None or storage.write_count == seen:
            return
        if not storage.shared:  # writes of this process bypassing the buffer (storage.set)
            self._seen, self._own_seen = storage.write_count, storage.own_writes
            return
        with storage.write_lock():
            count, end, own = storage.write_count, storage.next_slot, storage.own_writes
        if count is not None:
            # this process's own writes that bypassed the buffer (storage.set) are not
            # other processes' items: the sampler is not told of them (as when unshared)
            self._catch_up(count - seen - (own - self._own_seen), end)
            self._seen, self._own_seen = count, own

    def _catch_up(self, d: int, end: int) -> None:
        """The ``d`` items of other processes whose writes ended at slot ``end``."""
        storage, capacity = self.storage, self.storage.capacity
        n = len(storage)
        if d <= 0 or n == 0:
            return
        if d >= min(capacity, n):
            slots = torch.arange(n) if n < capacity else (torch.arange(n) + end) % capacity
        else:
            slots = torch.arange(end - d, end).remainder_(capacity)
        data = storage.__getitems__(slots) if self._wants_data else None
        self.sampler.on_write(slots, data)

    def _after_write(self, first: int) -> None:
        """After a write of this process at slot ``first``: other writes just before it?"""
        storage = self.storage
        before, after = storage.last_write
        seen = self._seen
        if seen is None or after == seen:
            return
        own = storage.own_writes
        if before != seen and storage.shared:  # own bypassing writes are no one else's
            self._catch_up(before - seen - (own - (after - before) - self._own_seen), first)
        self._seen, self._own_seen = after, own

    # --- rb[index], write_count, close / with, torchrl's names -------------------------------
    def __getitem__(self, index: Any) -> Any:
        """``rb[index]``: the items at ``index`` as the storage gathers them, then the transform.

        ``index`` is anything ``storage[index]`` takes (an int, indices, a slice...): an int
        gives one item, anything else a batch (without an ``"index"`` entry: that is
        ``sample``'s).
        """
        batch = self.storage[index]
        transform = self.transform
        return batch if transform is None else transform(batch)

    @property
    def write_count(self) -> int:
        """Items written through this buffer by ``add`` and ``extend``, overwritten included.

        torchrl's ``rb.write_count``. It starts at the number of items the storage holds when
        the buffer is built or loaded, and :meth:`empty` sets it to 0. Items a writer drops
        (:class:`~rbdata.writers.MaxValueWriter`) are not counted.
        """
        return self._written

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return isinstance(self.storage, ClosedStorage)

    def close(self) -> None:
        """Close the storage (if it has ``close()``: memmap and Arrow storages) and the buffer.

        Idempotent. Afterwards every use of the buffer (``add``, ``extend``, ``sample``,
        ``len``, iteration, ``rb[index]``, ``dumps``) raises ``ValueError``; a storage on disk
        with an explicit ``path`` can be reopened (``MemmapStorage.open(path)``). ``with
        ReplayBuffer(...) as rb:`` closes on leaving the block.
        """
        storage = self.storage
        if isinstance(storage, ClosedStorage):
            return
        close_storage = getattr(storage, "close", None)
        if callable(close_storage):
            close_storage()
        self.storage = ClosedStorage()  # type: ignore[assignment]
        self._trusted = False  # sample() then asks the storage first, not the sampler

    def _check_open(self) -> None:
        """``ValueError`` if the buffer is closed (for paths that do not read the storage)."""
        if isinstance(self.storage, ClosedStorage):
            raise ValueError(_CLOSED)

    def __enter__(self) -> ReplayBuffer:
        """``with ReplayBuffer(...) as rb:`` gives the buffer; leaving the block closes it."""
        self._check_open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the buffer on leaving a ``with`` block (:meth:`close`)."""
        self.close()

    if not TYPE_CHECKING:  # torchrl's names: errors that name ours (unseen by type checkers)

        def __getattr__(self, name: str) -> NoReturn:
            """``rb.<torchrl name>``: an ``AttributeError`` that names rbdata's spelling."""
            raise torchrl_attribute_error(self, name, BUFFER_ATTRIBUTES)

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(storage={self.storage!r}, sampler={type(self.sampler).__name__}, "
            f"writer={type(self.writer).__name__}, batch_size={self.batch_size})"
        )

    def add(self, item: Any) -> int:
        """Add one item (a tensor, TensorDict or dict without batch dimension); return its slot.

        The slot is -1 if the writer dropped the item (:class:`~rbdata.writers.MaxValueWriter`).
        """
        check = self._check
        if check is None:
            index = self.writer.add(self.storage, item)
        elif self._pre_add:  # checked before anything is written
            index = self.writer.add(self.storage, item, check=check)
        else:
            index = self.writer.add(self.storage, item)
            if index >= 0:
                check(index, item)
        if index >= 0:  # -1: a writer (MaxValueWriter) dropped the item
            self._written += 1
            if self._hooked:
                if self._seen is not None:
                    self._after_write(index)
                self.sampler.on_write(index, item)
        return index

    def extend(self, data: Any) -> torch.Tensor:
        """Add a batch (leading dimension = items); return the slots as a ``LongTensor``.

        Everything is validated before anything is written, the sampler's
        :meth:`~rbdata.samplers.Sampler.check_write` included: a batch that raises leaves the
        storage, the writer and the sampler as they were.
        """
        check = self._check
        if check is None:
            index = self.writer.extend(self.storage, data)
        elif self._pre_extend:  # checked before anything is written
            index = self.writer.extend(self.storage, data, check=check)
        else:
            index = self.writer.extend(self.storage, data)
            check(index, data)
        self._written += len(index)
        if self._hooked:
            if self._seen is not None and index.numel():
                self._after_write(int(index[0]))
            self.sampler.on_write(index, data)
        return index

    def update_priority(self, index: Any, priority: Any = None) -> None:
        """Set the priority of the items at ``index`` (for a prioritized sampler).

        Accepts tensors, arrays, lists or scalars; see
        :meth:`~rbdata.samplers.PrioritizedSampler.update_priority`. Given a sampled
        TensorDict (or dict) batch alone, ``rb.update_priority(batch)`` reads its ``"index"``
        and its ``priority_key`` entry (torchrl's ``update_tensordict_priority``). A
        plain-tensor batch has no ``"index"``: take it from ``sample(return_info=True)``.

        Raises:
            TypeError: the sampler has no priorities.
            ~rbdata.errors.IndexOutOfRangeError: an index outside the filled items (an
                ``IndexError`` and a ``ValueError``, as :class:`~rbdata.MixedBuffer` raises it).
            ValueError: a NaN, infinite or negative priority (nothing is changed).
        """
        update = self._update_priority
        if update is None:
            raise TypeError(
                f"{type(self.sampler).__name__} has no priorities: use a PrioritizedSampler"
            )
        if priority is None:
            index, priority = priority_of_batch(index, self.priority_key)
        update(index, priority)

    def _batch_size(self, batch_size: int | None) -> int:
        if batch_size is not None:
            return check_batch_size(batch_size)
        if self.batch_size is None:
            raise ValueError("batch_size: pass sample(batch_size) or ReplayBuffer(batch_size=...)")
        return self.batch_size

    def _fetch(self, idx: torch.Tensor, extras: dict[str, torch.Tensor] | None) -> Any:
        if not self._trusted:
            idx = as_index_tensor(idx, len(self.storage), "buffer")
        extra = {"index": idx}
        if extras:
            extra.update(extras)
        batch = self.storage.gather(idx, extra)
        transform = self.transform
        return batch if transform is None else apply_transform(transform, batch)

    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """Draw one batch (default size: the buffer's ``batch_size``).

        TensorDict batches carry ``"index"`` and the sampler's extras (e.g. ``"weight"``);
        batches of plain tensors cannot. ``return_info=True`` returns ``(batch, info)`` for
        every kind of item, as torchrl does: ``info`` has ``"index"`` (for
        :meth:`update_priority`) and the extras (``"weight"`` for a prioritized sampler).
        """
        bs = self._batch_size(batch_size)
        if self._seen is not None:
            self._sync()
        if self._trusted:  # rbdata samplers raise EmptyBufferError themselves
            idx, extras = self.sampler.draw(bs)
            batch = self._fetch(idx, extras)
        else:
            if len(self.storage) == 0:
                raise EmptyBufferError("cannot sample: the buffer is empty (add or extend first)")
            idx, extras = as_index_tensor(self.sampler.sample(bs), len(self.storage), "buffer"), {}
            batch = self._fetch(idx, None)
        return (batch, {"index": idx, **extras}) if return_info else batch

    def __iter__(self) -> Iterator[Any]:
        """Batches of ``batch_size``: endless, or one epoch for epoch samplers."""
        bs = self._batch_size(None)
        if len(self.storage) == 0:
            raise EmptyBufferError("cannot iterate: the buffer is empty (add or extend first)")
        if isinstance(self.sampler, Sampler):
            for idx, extras in BatchSampler(self.sampler, bs).draws():
                yield self._fetch(idx, extras)
        else:
            while True:
                yield self._fetch(self.sampler.sample(bs), None)

    def empty(self) -> None:
        """Remove every item; the writer and the sampler start over."""
        self.storage.clear()
        self._written = 0
        self.writer.reset()
        reset = getattr(self.sampler, "reset", None)
        if reset is not None:
            reset()

    # --- checkpoints ------------------------------------------------------------------------
    def _components(self) -> tuple[Storage, Sampler, Writer, int | None]:
        self._check_open()
        if not isinstance(self.sampler, Sampler):
            raise TypeError(
                f"cannot checkpoint the sampler {type(self.sampler).__name__}: checkpoints "
                "need an rbdata Sampler"
            )
        return self.storage, self.sampler, self.writer, self.batch_size

    # --- dumps, load, state_dict, load_state_dict ------------------------------------------
    def dumps(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        """Write the whole buffer to directory ``path``, atomically and without pickle.

        The storage's items (raw memory-mapped arrays, or Arrow IPC files), the sampler's
        state (priority trees as raw arrays, generator state), the writer's state and the
        batch size are saved; the transform is not. A previous checkpoint at ``path`` stays
        live until the new one is complete, then is replaced in one atomic step: a process
        killed at any moment leaves one complete checkpoint. See ``docs/checkpoints.md``.

        Args:
            path: the checkpoint directory (created if needed).
            fsync: fsync every file and directory before the switch (default), so the
                checkpoint also survives a power loss. ``False`` does not wait for the disk
                writeback (for 1M transitions that wait is longer than writing the files)
                and keeps the guarantee for a killed process, not for a machine that loses
                power.

        Raises:
            TypeError: if a component cannot be saved without pickle (e.g. a
                :class:`~rbdata.storages.ListStorage` item of another type); nothing is
                written then.
            FileExistsError: if ``path`` holds files that are not a checkpoint's.
        """
        checkpoint.dump(*self._components(), path, fsync=fsync)

    def load(self, path: str | os.PathLike[str], *, verify: bool = False) -> None:
        """Load checkpoint ``path`` into this buffer (its components must match).

        The storage, sampler and writer classes and their configuration (capacity, priority
        exponents...) must equal the checkpoint's; the items are copied into this buffer's
        own storage. ``batch_size`` and ``transform`` are kept. ``rb.loads(path)`` does the
        same and returns ``rb``.

        Args:
            path: a directory written by :meth:`dumps`.
            verify: check every file against its recorded CRC-32 first (see :meth:`loads`).

        Raises:
            ValueError: if the components differ (nothing is changed then).
            rbdata.errors.CheckpointError: for a missing, tampered or foreign checkpoint.
        """
        self.load_components(checkpoint.load(path, verify=verify), str(path))

    def state_dict(self) -> dict[str, Any]:
        """The whole buffer as a dict for ``torch.save`` (small buffers).

        It holds tensors and plain values only: ``torch.load(..., weights_only=True)``
        reads it back. For large buffers prefer :meth:`dumps`, which writes whole arrays and
        loads lazily.
        """
        return checkpoint.state_dict(*self._components())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` into this buffer (same component checks as :meth:`load`)."""
        self.load_components(checkpoint.from_state_dict(state), "state")

    def load_components(self, parts: checkpoint.Components, source: str = "checkpoint") -> None:
        """Take the contents of loaded components (``rbdata.checkpoint.load``'s result).

        They must match this buffer's storage, sampler and writer (classes and
        configuration): ``ValueError`` (naming ``source`` and what differs) leaves the buffer
        as it was. What :meth:`load` and :meth:`load_state_dict` do once they have read the
        checkpoint; a mixture's checkpoint loads its buffers through it.
        """
        checkpoint.load_into(parts, *self._components()[:3], source)
        if self._seen is not None:  # the copied items are not other processes' writes
            self._seen, self._own_seen = self.storage.write_count, self.storage.own_writes
        self._written = len(self.storage)

    def _loads_into(
        self,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        *,
        verify: bool = False,
    ) -> ReplayBuffer:
        """``rb.loads(path)`` on a buffer: :meth:`load`, then ``rb`` (see :meth:`loads`)."""
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        self.load(path, verify=verify)
        if transform is not None:
            self.transform = transform
        return self

    @checkpoint.LoadsDescriptor.in_place(_loads_into)
    @classmethod
    def loads(
        cls,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        *,
        verify: bool = False,
    ) -> ReplayBuffer:
        """A new buffer from checkpoint ``path`` (on the class); on a buffer, load into it.

        ``ReplayBuffer.loads(path)`` builds a **new** buffer, without constructing one first:
        storage, sampler, writer and batch size come from the checkpoint's metadata.
        Memory-mapped data is mapped copy-on-write, not read: loading is fast whatever the
        size, and writes made afterwards stay in this process (the checkpoint never
        changes). Sampling continues exactly where the saved buffer was. Every field of the
        metadata, every file name and size is checked before anything is built.

        ``rb.loads(path)`` (called on a buffer: torchrl's spelling) loads **into** ``rb``
        and returns ``rb``: it is :meth:`load`. The components must match the checkpoint's
        (classes and configuration), or a ``ValueError`` says what differs and ``rb`` is
        left as it was; the items are copied into ``rb``'s own storage, so its files, its
        device and a ``DataLoader`` already reading ``rb.storage`` stay valid. Its
        ``batch_size`` is kept, and ``transform`` replaces its transform if given.

        Args:
            path: a directory written by :meth:`dumps`.
            transform: the buffer's transform (transforms are not saved).
            verify: check every file against the CRC-32 that :meth:`dumps` recorded (reads
                every byte once). ``False`` (default) keeps loading lazy.

        Returns:
            The new buffer, or ``rb`` itself when called on a buffer.

        Raises:
            rbdata.errors.CheckpointError: for a missing, tampered or foreign checkpoint,
                naming the file and the field; with ``verify=True`` also for a file whose
                bytes changed, and for a checkpoint written without checksums (by an rbdata
                older than ``verify``; load it with ``verify=False``).
            ValueError: called on a buffer whose components differ from the checkpoint's.

        Examples:
            >>> import tempfile
            >>> import torch
            >>> from rbdata.storages import TensorStorage
            >>> rb = ReplayBuffer(TensorStorage(100), batch_size=4)
            >>> rb.extend(torch.arange(10.0)).shape
            torch.Size([10])
            >>> path = tempfile.mkdtemp() + "/ckpt"
            >>> rb.dumps(path, fsync=False)
            >>> new = ReplayBuffer.loads(path)  # a new buffer
            >>> new is rb, len(new)
            (False, 10)
            >>> resumed = ReplayBuffer(TensorStorage(100), batch_size=4)
            >>> resumed.loads(path) is resumed, len(resumed)  # into this one
            (True, 10)
        """
        storage, sampler, writer, batch_size = checkpoint.load(path, verify=verify)
        return cls(storage, sampler, writer, transform=transform, batch_size=batch_size)

    @classmethod
    def from_state_dict(
        cls, state: dict[str, Any], transform: Callable[[Any], Any] | None = None
    ) -> ReplayBuffer:
        """Build a new buffer from a :meth:`state_dict`."""
        storage, sampler, writer, batch_size = checkpoint.from_state_dict(state)
        return cls(storage, sampler, writer, transform=transform, batch_size=batch_size)


def _takes_check(method: Any) -> bool:
    """Whether a writer method accepts ``check=`` (custom writers may predate it)."""
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return "check" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
