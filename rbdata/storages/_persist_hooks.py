"""The persistence hooks of every storage, with their defaults: what a storage declares.

:class:`PersistenceHooks` is the private base of :class:`~rbdata.storages.Storage` that holds
its persistence contract (for implementers): :meth:`~rbdata.storages.Storage.dump`,
:meth:`~rbdata.storages.Storage.check_dump`, :meth:`~rbdata.storages.Storage.restore`,
:meth:`~rbdata.storages.Storage.dump_state` / :meth:`~rbdata.storages.Storage.from_state`,
:meth:`~rbdata.storages.Storage.describe`, the conversion hooks
(:attr:`~rbdata.storages.Storage.block_rows`, :meth:`~rbdata.storages.Storage.check_layout`,
:meth:`~rbdata.storages.Storage.empty_like`) and the class attributes that name a storage's
on-disk format. Checkpoints, ``rbdata inspect`` and :func:`~rbdata.storages.convert` call them
on a ``Storage`` and never look inside it. The defaults refuse, naming the class; a storage
class is checkpointable once it implements them. Only ``Storage`` derives from this class.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, final

import torch

from rbdata._core.layout import Layout
from rbdata.errors import CheckpointError
from rbdata.storages._codec import Codec
from rbdata.storages._describe import StorageInfo

if TYPE_CHECKING:
    from rbdata.storages.base import Storage

__all__ = ["PersistenceHooks", "SavedStorage"]


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


class PersistenceHooks:
    """The persistence hooks of :class:`~rbdata.storages.Storage` (its private base)."""

    #: The name of this class's on-disk directory format (``rbdata inspect``, dataset
    #: entries), for classes that own one; ``None`` otherwise.
    kind: ClassVar[str | None] = None
    #: The metadata file that marks a directory of :attr:`kind` (``None``: no format).
    marker_file: ClassVar[str | None] = None
    #: Whether :meth:`~rbdata.storages.Storage.dump` appends tensors of its own to the
    #: checkpoint's state tensors (for implementers; a checkpoint writes ``tensors.bin``
    #: beside the storage only when it does not).
    dump_adds_tensors: ClassVar[bool] = False

    # --- persistence (for implementers): checkpoints, state dicts, ``rbdata inspect`` -----
    # Each storage class owns how it is saved and read back; rbdata.checkpoint, ``rbdata
    # inspect`` and the converters call these hooks and never look inside a storage. The
    # defaults refuse: a storage class is checkpointable once it implements them.
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
