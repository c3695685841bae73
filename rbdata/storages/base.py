"""The storage contract: a map-style :class:`torch.utils.data.Dataset` of fixed capacity.

The base class owns the public surface (indexing, ``__getitems__``, ``set``, validation and
index normalisation); subclasses implement five small hooks over validated, normalised input.
Writes are two-phase: :meth:`Storage.prepare` validates and converts the data (nothing is
touched), :meth:`Storage.commit` writes it. Writers use the two phases to learn the batch
size before choosing slots; ``set`` is both in one call.

A storage also owns its persistence: :meth:`Storage.dump`, :meth:`Storage.check_dump`,
:meth:`Storage.restore`, :meth:`Storage.dump_state` / :meth:`Storage.from_state`,
:meth:`Storage.copy_from` and :meth:`Storage.describe` are what checkpoints, ``rbdata
inspect`` and :func:`~rbdata.storages.convert` call (with :meth:`Storage.empty_like`,
:meth:`Storage.check_layout` and :attr:`Storage.block_rows`); they never look inside a
storage. The defaults refuse, naming the class. Where a write goes is a
:class:`WriteTarget` (``_target.py``), resolved once per write.
"""

from __future__ import annotations

import contextlib
import os
import sys
from abc import abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar, final

import torch
from torch.utils.data import Dataset

from rbdata._core.index import (
    IndexBatch,
    as_index_tensor,
    as_int_index,
    check_capacity,
    normalize_int,
)
from rbdata._core.layout import RAGGED, STRING, TENSOR, Layout
from rbdata._core.layout.keys import is_structured
from rbdata._core.layout.values import EMPTY_BATCH, stack_items
from rbdata.errors import CheckpointError
from rbdata.storages._codec import Codec
from rbdata.storages._collate import wrap_for_collate
from rbdata.storages._describe import StorageInfo
from rbdata.storages._prepared import Prepared
from rbdata.storages._target import WriteTarget
from rbdata.storages.kinds import DiskKind, disk_kind, disk_kinds, register_disk_kind

__all__ = [
    "Codec",
    "Prepared",
    "SavedStorage",
    "Storage",
    "WriteIndex",
    "WriteTarget",
    "copy_rows",
    "register_kind",
    "storage_kind",
    "storage_kinds",
]

#: Where a write goes: one slot, contiguous runs (a list of step-1 slices), or any indices.
WriteIndex = int | slice | list[slice] | Sequence[int] | torch.Tensor


@dataclass(frozen=True)
class SavedStorage:
    """What :meth:`~rbdata.storages.Storage.restore` rebuilds a storage from.

    One value instead of six arguments, so a storage class reads what it needs and the
    contract can grow without touching every implementation.

    Attributes:
        directory: the files :meth:`~rbdata.storages.Storage.dump` wrote (never written
            to: a restored storage maps them copy-on-write or copies them).
        config: the saved constructor arguments (``storage.config()``).
        state: the JSON state :meth:`~rbdata.storages.Storage.dump` returned.
        codec: decodes the values of ``state`` that are not JSON.
        tensors: the checkpoint's tensors, which ``codec`` decodes from.
        plan: what :meth:`~rbdata.storages.Storage.check_dump` returned (it ran first): a
            tuple whose first item is the capacity.
    """

    directory: Path
    config: dict[str, Any]
    state: Any
    codec: Codec
    tensors: list[torch.Tensor]
    plan: Any


_Self = TypeVar("_Self", bound="Storage")


class Storage(Dataset[Any]):
    """Base class of all storages: a fixed-capacity, map-style dataset of items.

    Args:
        max_size: capacity in items.
        device: where the data lives (``None`` for CPU).

    **For implementers.** Besides the private write hooks (``_allocate``, ``_write``,
    ``_write_one``, ``_get``), a storage implements the calls that the buffer, the writers
    and the SB3 adapter make on their hot paths. They skip the public surface's checks, so
    their callers pass in-range, normalised arguments:

    * :meth:`gather` (abstract): the items at in-range slots as one batch; every batched
      read (``__getitems__``, ``ReplayBuffer.sample``) ends here.
    * :meth:`add_fast` and :meth:`extend_fast`: the per-step write of a ring writer, which
      may decline (``False`` / ``None``) and leave the item to :meth:`prepare` and
      :meth:`commit`. The defaults always decline.
    * :meth:`write_row` and :meth:`write_rows`: leaves already checked and converted
      (numpy rows of the layout's dtypes) written at a slot or at ring slots; the SB3
      adapter writes its steps with them. The defaults decline (``False``). A class whose
      row writes always write (given a CPU, unshared storage) says so with
      :attr:`writes_rows`.

    These are called directly, without a wrapper, so an override is the fast path itself.
    The public surface that checks and normalises (``__getitem__``, ``__getitems__``,
    :meth:`set`, :attr:`capacity`, :attr:`device`, :attr:`layout`) is final
    (``typing.final``, checked by mypy), and so is every member that no storage overrides:
    a storage changes behaviour through its hooks only.
    """

    #: Set by ``close()`` of storages that can be closed; every public method then raises.
    _closed: bool = False
    #: Whether :meth:`~rbdata.storages.Storage.write_row` and
    #: :meth:`~rbdata.storages.Storage.write_rows` write this class's items (for
    #: implementers): a caller holding checked, converted rows (the SB3 adapter) may then
    #: write a CPU, unshared storage with them instead of
    #: :meth:`~rbdata.storages.Storage.prepare` and :meth:`~rbdata.storages.Storage.commit`.
    #: Declared by each class for itself, never inherited (a subclass may do more per item
    #: in ``commit``): ``False`` unless the class's own body sets it.
    writes_rows: ClassVar[bool] = False
    _items_written = 0  # see items_written; every write path adds to it

    @final
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "writes_rows" not in cls.__dict__:
            cls.writes_rows = False  # not inherited: see writes_rows

    def __init__(self, max_size: int, device: torch.device | str | None = None) -> None:
        self._capacity = check_capacity(max_size)
        self._device = torch.device("cpu") if device is None else torch.device(device)
        self._layout: Layout | None = None
        self._length = 0
        self._next = 0

    @final
    def _check_open(self) -> None:
        """Raise ``ValueError`` if the storage was closed (before anything is touched)."""
        if self._closed:
            raise ValueError(f"the storage is closed ({type(self).__name__}.close() was called)")

    # --- public surface ------------------------------------------------------------------
    @final
    @property
    def capacity(self) -> int:
        """Maximum number of items."""
        return self._capacity

    @final
    @property
    def device(self) -> torch.device:
        """Device of the stored tensors."""
        return self._device

    @final
    @property
    def layout(self) -> Layout | None:
        """Keys, per-item shapes and dtypes, fixed by the first write (``None`` before it)."""
        return self._layout

    def __len__(self) -> int:
        if self._closed:
            self._check_open()
        return self._length

    @property
    def next_slot(self) -> int:
        """Where a ring writer resumes (0 first); :meth:`set`: see WriteTarget.at_positions."""
        return self._next

    # --- sharing between processes (MemmapStorage; see docs/distributed.md) ---------------
    @property
    def shared(self) -> bool:
        """Whether other processes may write this storage at the same time.

        Writers then reserve their slots under :meth:`write_lock`. ``False`` for in-process
        storages.
        """
        return False

    def write_lock(self) -> contextlib.AbstractContextManager[Any]:
        """A context that excludes every other process's writes (a no-op when not shared)."""
        return contextlib.nullcontext()

    @property
    def write_count(self) -> int | None:
        """Items committed so far by every process (``None`` if the storage does not count)."""
        return None

    @property
    def items_written(self) -> int:
        """The count of items written so far, overwritten ones included (it only grows).

        Readers that index the items (:class:`~rbdata.transforms.EpisodeIndex`) see every
        write of this process by comparing two values (one of a whole multiple of the capacity
        included); a shared storage also counts other processes' (its :attr:`write_count`).
        """
        return self._items_written

    @property
    def last_write(self) -> tuple[int, int]:
        """``write_count`` just before and just after this process's last commit."""
        return (0, 0)

    @property
    def own_writes(self) -> int:
        """Items this process committed through :meth:`commit` (``0`` if not counted).

        With :attr:`write_count`, what tells a buffer its own writes that bypassed it
        (``storage.set``) from other processes' on a shared storage.
        """
        return 0

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(len={len(self)}, capacity={self.capacity}, layout={self._layout})"

    @final
    def __getitem__(self, index: Any) -> Any:
        """The item at an integer ``index``, else the batch of items at ``index``.

        An integer is an ``int``, a numpy integer or a 0-d integer tensor or array; anything
        else goes to :meth:`__getitems__`.
        """
        self._check_open()
        i = as_int_index(index)
        if i is not None:
            return self._get(normalize_int(i, len(self)))
        return self.__getitems__(index)

    @final
    def __getitems__(self, indices: Any) -> Any:
        """Return the items at ``indices`` as one batch, gathered in one vectorised read.

        An :class:`~rbdata._core.index.IndexBatch` (what rbdata's ``BatchSampler`` yields) adds
        ``"index"`` and the sampler's extras (e.g. ``"weight"``) to TensorDict batches.
        A batch on its way into ``DataLoader``'s ``default_collate`` passes it untouched
        (:func:`rbdata.storages.wrap_for_collate`).
        """
        self._check_open()
        if type(indices) is IndexBatch:
            idx = as_index_tensor(indices.tensor, len(self))
            batch = self.gather(idx, {"index": idx, **indices.extras})
        else:
            batch = self.gather(as_index_tensor(indices, len(self)), None)
        return wrap_for_collate(batch, sys._getframe(1))

    @final
    def as_dataset(self: _Self) -> _Self:
        """The storage as a map-style :class:`torch.utils.data.Dataset`: the storage itself.

        Every storage already is a map-style dataset (``len``, ``storage[i]``) whose
        ``__getitems__`` gathers a whole batch of a ``DataLoader`` in one vectorised read.
        The method keeps torchrl's spelling (``rb.storage.as_dataset()``) for code ported
        from it; a batch comes out of ``DataLoader`` as one TensorDict (or tensor) with the
        collate function :func:`~rbdata.storages.tensordict_collate` or the default one.

        Returns:
            This storage (``storage.as_dataset() is storage``).

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torch.utils.data import DataLoader
            >>> from rbdata import TensorStorage, tensordict_collate
            >>> storage = TensorStorage(100)
            >>> storage.set(slice(0, 10), TensorDict({"t": torch.arange(10)}, batch_size=[10]))
            >>> dataset = storage.as_dataset()
            >>> dataset is storage
            True
            >>> loader = DataLoader(
            ...     dataset, batch_size=4, shuffle=True, collate_fn=tensordict_collate
            ... )
            >>> [batch.batch_size[0] for batch in loader]
            [4, 4, 2]
            >>> sorted(torch.cat([batch["t"] for batch in loader]).tolist()) == list(range(10))
            True
        """
        self._check_open()
        return self

    @final
    def set(self, index: WriteIndex, data: Any) -> None:
        """Write ``data`` at ``index``: one item at an int, else a batch (leading dim = count).

        Slots run over the whole capacity (a write past ``len`` grows the storage), but
        negative indices count from ``len`` like a Python list's: ``set(-1, x)`` replaces
        the last item, and a slice with a negative bound is resolved against ``len``.
        Everything is validated before anything is written.

        Raises:
            IndexError: a slot outside ``[-len, capacity)``.
            ValueError, TypeError: bad data (see :meth:`prepare`); nothing is written.
        """
        self._check_open()
        i = as_int_index(index)
        if i is not None:
            prepared = self.prepare(data, batched=False)
            if i < 0:  # like a Python list: from the end of the items, not of the capacity
                slot = normalize_int(i, len(self), "storage", "length")
            else:
                slot = normalize_int(i, self.capacity, "storage", "capacity")
            self.commit(WriteTarget.one(slot).at_positions(), prepared)
            return
        prepared = self.prepare(data, batched=True)
        self.commit(WriteTarget.for_set(index, prepared.n, self.capacity, len(self)), prepared)

    def config(self) -> dict[str, Any]:
        """Constructor arguments that rebuild an empty storage like this one (checkpoints)."""
        return {"max_size": self.capacity}

    def clear(self) -> None:
        """Forget all items (the layout and the allocated memory are kept)."""
        self._check_open()
        self._set_length(0)
        self._set_next(0)

    def copy_from(self, src: Storage) -> None:
        """Make this storage hold exactly what ``src`` (same class and capacity) holds.

        Slot by slot, with the same length and next slot; what this storage held is gone.
        The default copies the rows through :meth:`set`, :attr:`block_rows` of ``src`` at a
        time (65536 if it has no preference).
        """
        n = len(src)
        self.clear()
        copy_rows(src, self, n, src.block_rows or 1 << 16)
        self._set_length(n)
        self._set_next(src.next_slot)

    def flush(self) -> None:
        """Write every item to the storage's files, durably (nothing to do in memory)."""
        self._check_open()

    # --- two-phase writes ----------------------------------------------------------------
    def prepare(self, data: Any, batched: bool) -> Prepared:
        """Validate ``data`` against the layout (inferring it on the first write).

        Everything that can fail happens here, so that :meth:`commit` cannot fail half-way:
        the payload is detached from autograd, dense, on :meth:`!_payload_device`, and holds
        values the layout's dtypes keep (narrowing casts are checked value by value; the
        write casts while it copies, which cannot fail then).

        Raises:
            ValueError: bad keys, shapes or values (see :meth:`!Layout.split`), or an empty
                list of items.
            TypeError: data of the wrong kind or dtype.
        """
        self._check_open()
        layout = self._current_layout()
        if batched and isinstance(data, (list, tuple)):
            if not data:
                raise ValueError(EMPTY_BATCH)
            if is_structured(data[0]):
                data = stack_items(data)
        if layout is None:
            layout = self._infer_layout(data, batched)
        tensors, n = layout.split(data, batched, self._payload_device(), self._densify)
        return Prepared(tensors, n, layout, batched)

    def commit(self, target: WriteTarget, prepared: Prepared) -> None:
        """Write prepared data where ``target`` says (one item, runs of slots, or slots)."""
        self._check_open()
        if prepared.layout is not None:
            self._ensure_layout(prepared.layout)
        if target.item:
            self._write_one(target.first, prepared.payload)
        else:
            self._write(target, prepared.payload)
        self._items_written += target.n
        if target.top > len(self):
            self._set_length(target.top)
        self._set_next(target.next_slot(self.capacity, self.next_slot))

    @final
    def _ensure_layout(self, layout: Layout) -> None:
        """Allocate for ``layout`` and fix it, unless a layout is fixed already."""
        if self._layout is None:
            self._allocate(layout)
            self._layout = layout

    def _current_layout(self) -> Layout | None:
        return self._layout

    #: Whether ``prepare`` turns sparse leaves dense (``False``: it refuses them).
    _densify = True

    def _payload_device(self) -> torch.device | None:
        """Where ``prepare`` puts the leaves: the storage's device (``None``: anywhere)."""
        return self._device

    def _infer_layout(self, data: Any, batched: bool) -> Layout:
        """The layout a first write gives (fixed-shape tensor leaves; storages may widen it)."""
        return Layout.from_data(data, batched)

    def _set_length(self, n: int) -> None:
        self._length = n

    def _set_next(self, slot: int) -> None:
        self._next = slot

    # --- hooks ---------------------------------------------------------------------------
    @abstractmethod
    def _allocate(self, layout: Layout) -> None:
        """Allocate memory for ``capacity`` items of ``layout`` (called on the first write)."""

    @abstractmethod
    def _write(self, target: WriteTarget, payload: list[Any]) -> None:
        """Write a validated batch where ``target`` says (contiguous runs, or slots)."""

    @abstractmethod
    def _write_one(self, index: int, payload: list[Any]) -> None:
        """Write one validated item to slot ``index``."""

    @abstractmethod
    def _get(self, index: int) -> Any:
        """Return the item at in-range ``index``."""

    # --- for implementers: the hot-path calls of buffers, writers and the SB3 adapter -----
    def add_fast(self, slot: int, item: Any, check: Any = None) -> bool:
        """The per-step path of writers: write one item at ``slot`` (in ``[0, capacity)``).

        Storages with numpy views of their buffers take an item whose leaves already match
        the layout (see ``rbdata/storages/_unpack.py``): ``check(slot, item)``, if given,
        runs before anything is written. ``False``: nothing was done, the item goes through
        :meth:`prepare` and :meth:`commit` (which validate, convert and raise). A
        :attr:`shared` storage always says ``False``: its writers take slots under the lock.
        """
        del slot, item, check
        return False

    def extend_fast(self, start: int, data: Any, check: Any = None) -> torch.Tensor | None:
        """:meth:`add_fast` for a batch written at ring slots ``start, start + 1, ...``.

        Returns the slots written (a ``LongTensor``), or ``None``: nothing was done.
        """
        del start, data, check
        return None

    def write_row(self, slot: int, values: list[Any]) -> bool:
        """Write one checked item at ``slot`` (in ``[0, capacity)``), one value per leaf.

        ``values``: one value per leaf in layout order that a numpy row assignment stores
        exactly (see ``rbdata/storages/_unpack.py``). ``False``: nothing was written (the
        default; a storage without numpy views of its memory always says so).
        """
        del slot, values
        return False

    def write_rows(self, start: int, n: int, values: list[Any]) -> bool:
        """Write ``n`` checked rows per leaf at the ring slots ``start, start + 1, ...``.

        ``values``: one numpy array (or tensor view) per leaf in layout order, of the leaf's
        dtype and shape ``[n, *item_shape]``; ``n`` at most the capacity. ``False``: nothing
        was written (the default).
        """
        del start, n, values
        return False

    @abstractmethod
    def gather(self, idx: torch.Tensor, extra: dict[str, torch.Tensor] | None) -> Any:
        """Return the items at in-range ``idx`` (a ``LongTensor``) as one batch.

        ``extra``: per-item tensors (``"index"``, a sampler's ``"weight"``) that
        TensorDict batches carry as entries; other batches ignore it. The caller has checked
        ``idx`` against ``len``.
        """

    # --- persistence hooks (for implementers): checkpoints, state dicts, ``rbdata inspect`` --
    # Each storage class owns how it is saved and read back; rbdata.checkpoint, ``rbdata
    # inspect`` and the converters call these hooks and never look inside a storage. The
    # defaults refuse: a storage class is checkpointable once it implements them.

    #: The name of this class's on-disk directory format (``rbdata inspect``, dataset
    #: entries), for classes that own one; ``None`` otherwise.
    kind: ClassVar[str | None] = None
    #: The metadata file that marks a directory of :attr:`kind` (``None``: no format).
    marker_file: ClassVar[str | None] = None
    #: Whether :meth:`~rbdata.storages.Storage.dump` appends tensors of its own to the
    #: checkpoint's state tensors (for implementers; a checkpoint writes ``tensors.bin``
    #: beside the storage only when it does not).
    dump_adds_tensors: ClassVar[bool] = False

    def dump(
        self, directory: Path, codec: Codec, tensors: list[torch.Tensor], fsync: bool = True
    ) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
        """Save this storage into a checkpoint: files under ``directory``, or a JSON state.

        Args:
            directory: where the storage's files go (not created yet; a storage that keeps
                its data in the returned state creates nothing).
            codec: encodes values that are not JSON (tensors go to ``tensors``).
            tensors: the checkpoint's tensor list (saved with it).
            fsync: fsync every file written.

        Returns:
            The JSON state that :meth:`check_dump` and :meth:`restore` read back, and the
            checksum entries of the files written (names relative to ``directory``).

        Raises:
            TypeError: if this class cannot be checkpointed.
        """
        raise self._not_persisted()

    @classmethod
    def check_dump(
        cls, directory: Path, config: dict[str, Any], state: Any, meta_file: Path
    ) -> Any:
        """Check what :meth:`dump` wrote before anything is allocated, mapped or copied.

        Every count, size and file name is checked against the metadata and the files
        present (plain files inside ``directory``, no symlink). ``meta_file`` (the
        checkpoint's metadata file) starts the messages about fields of ``config`` and
        ``state``.

        Returns:
            A plan for :meth:`restore`: a tuple whose first item is the capacity.

        Raises:
            rbdata.errors.CheckpointError: naming the file and the field that is wrong.
        """
        raise CheckpointError(f"no restore rule for storage class {cls.__name__}")

    @classmethod
    def restore(cls, saved: SavedStorage) -> Storage:
        """Rebuild a storage saved by :meth:`dump` (after :meth:`check_dump` returned a plan).

        ``saved`` (:class:`~rbdata.storages.SavedStorage`) holds the directory, the saved
        config and state, the codec and tensors to decode the state with, and
        :meth:`check_dump`'s plan. The new storage never writes into the directory: it maps it
        copy-on-write or copies it.

        Raises:
            rbdata.errors.CheckpointError: if the data contradicts the metadata.
        """
        raise CheckpointError(f"no restore rule for storage class {cls.__name__}")

    def dump_state(self, codec: Codec) -> dict[str, Any]:
        """This storage as tensors and plain values (``torch.load(weights_only=True)``-able).

        What :meth:`from_state` rebuilds it from (``ReplayBuffer.state_dict``).
        """
        raise self._not_persisted()

    @classmethod
    def from_state(cls, config: dict[str, Any], state: Any, codec: Codec) -> Storage:
        """Rebuild a storage from :meth:`dump_state` (in memory, or a directory of its own)."""
        raise CheckpointError(f"no restore rule for storage class {cls.__name__}")

    # --- conversion between on-disk formats (for implementers; see convert) -------------
    @property
    def block_rows(self) -> int | None:
        """The rows a bulk copy should read or write at once (``None``: no preference)."""
        return None

    @classmethod
    def check_layout(cls, layout: Layout) -> None:
        """Refuse, before anything is created, a layout this class cannot store.

        Raises:
            TypeError: naming the key and what it holds (the default accepts any layout).
        """

    @classmethod
    def empty_like(
        cls, src: Storage, path: str | os.PathLike[str] | None = None, block_rows: int | None = None
    ) -> Storage:
        """A new, empty storage of this class to copy ``src`` into (its capacity, at ``path``).

        Options of ``src`` that this class shares are kept (an Arrow storage's chunk size
        and ragged keys); ``block_rows``, if given, is the rows per chunk of the new storage.

        Raises:
            TypeError: if this class cannot be a copy's destination.
        """
        raise TypeError(f"{cls.__name__} cannot be made from another storage")

    @classmethod
    def describe(
        cls,
        directory: Path,
        config: dict[str, Any] | None = None,
        state: Any = None,
        meta_file: Path | None = None,
    ) -> tuple[StorageInfo, list[str]]:
        """What a dumped storage holds, from its metadata only (``rbdata inspect``).

        Data files are never opened or mapped, only their sizes taken; no symlink is
        followed; nothing is written.

        Args:
            directory: the storage's directory (a storage directory of :attr:`kind`, or
                the directory that :meth:`dump` wrote).
            config: the constructor config saved with a checkpoint, if any.
            state: the state that :meth:`dump` returned, if any.
            meta_file: the checkpoint's metadata file, for messages.

        Returns:
            The summary, and the problems found (missing or mis-sized files) that do not
            stop the metadata from being read.

        Raises:
            ValueError: if the metadata itself is unreadable or corrupt (a
                :class:`~rbdata.errors.CheckpointError` for a checkpoint's).
        """
        raise CheckpointError(f"no description rule for storage class {cls.__name__}")

    @final
    @classmethod
    def _not_persisted(cls) -> TypeError:
        return TypeError(
            f"cannot checkpoint a {cls.__name__}: checkpoints know TensorStorage, "
            "MemmapStorage, ArrowStorage, ListStorage and FrameStackStorage (and their "
            "subclasses)"
        )


def _block(layout: Layout, batch: Any) -> Any:
    """A gathered batch as write input: variable leaves as lists, keys as flat tuples."""
    if layout.kind == TENSOR:
        return batch
    block: dict[tuple[str, ...], Any] = {}
    for leaf in layout.leaves:
        value = batch.get(leaf.key)
        if leaf.kind == RAGGED:  # a jagged nested tensor: one tensor per item
            value = list(value.unbind())
        elif leaf.kind == STRING:  # a NonTensorStack of str
            value = list(value.tolist())
        block[leaf.key] = value
    return block


def copy_rows(src: Storage, dst: Storage, length: int, rows: int) -> None:
    """Write slots ``[0, length)`` of ``src`` to the same slots of ``dst``, ``rows`` at a time."""
    layout = src.layout
    if layout is None:
        return
    for start in range(0, length, rows):
        stop = min(start + rows, length)
        batch = src.__getitems__(torch.arange(start, stop))
        dst.set(slice(start, stop), _block(layout, batch))


_S = TypeVar("_S", bound="type[Storage]")


def register_kind(cls: _S) -> _S:
    """Register a storage class under its ``kind`` (a class decorator).

    The built-in kinds are in :mod:`rbdata.storages.kinds` already (by location, so that
    ``rbdata inspect`` imports no torch); a class registered here is described by its own
    :meth:`Storage.describe`.
    """
    kind = cls.kind
    if kind is None or cls.marker_file is None:
        raise TypeError(f"{cls.__name__} names no kind and marker file")
    where = f"{cls.__module__}:{cls.__qualname__}"
    register_disk_kind(DiskKind(kind, cls.marker_file, where, f"{where}.describe"))
    return cls


def _storage_class(entry: DiskKind) -> type[Storage]:
    cls = entry.load_class()
    if not (isinstance(cls, type) and issubclass(cls, Storage)):
        raise TypeError(f"storage kind {entry.kind!r}: {entry.storage_class} is no Storage")
    return cls


def storage_kinds() -> dict[str, type[Storage]]:
    """The registered kinds: kind name to storage class (``"memmap"``, ``"arrow"``)."""
    return {name: _storage_class(entry) for name, entry in disk_kinds().items()}


def storage_kind(kind: str | None = None, names: Collection[str] = ()) -> type[Storage] | None:
    """The class registered as ``kind``, or else the first whose marker file is in ``names``.

    ``names`` are the entries of a directory (nothing is read or followed). ``None`` if no
    registered class matches.
    """
    entry = disk_kind(kind, names)
    return None if entry is None else _storage_class(entry)
