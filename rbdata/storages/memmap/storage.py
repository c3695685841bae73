"""``MemmapStorage``: one memory-mapped file per leaf, shareable across processes, reopenable.

On disk, a storage directory holds:

- ``layout.json``: format name and version, capacity, keys, per-item shapes, dtypes, file names;
- one raw file per leaf (``capacity * item bytes``), its space reserved when it is created
  (``posix_fallocate``: a full disk is an ``OSError`` at the first extend, never a SIGBUS);
- ``header.bin``: the filled length and the slot after the last write (where a ring writer
  resumes), as a double record switched by one 8-byte store (see
  :mod:`rbdata.storages.memmap._header`);
- ``journal.bin``: the redo journal of the last write that overwrote live items.

Every write is atomic across a SIGKILL of the writing process: after :meth:`MemmapStorage.open`
each batch is wholly present or wholly absent, and every batch whose ``extend`` returned is
present. A write into free slots only (the first lap) writes the rows, then publishes the
header: killed before, the batch is absent. A write that overwrites live slots first writes the
new rows and their slots to the journal and commits it (a checksum stored last), then copies the
rows into the files, publishes the header and clears the journal; ``open`` replays a committed
journal (idempotent) and ignores an uncommitted one. This relies on the page cache outliving the
process; against power loss call :meth:`MemmapStorage.flush` (``msync``) after the writes that
must be durable. Only plain file names inside the directory are used, never symlinks.

Many processes, one storage. ``shared.bin`` holds the total-writes counter and is the write
lock (an exclusive ``flock``). A storage becomes *shared* when it is pickled (the sender and
the receiver), when the process forks (``os.register_at_fork``: parent and child), or by
:meth:`MemmapStorage.share`. Writers of a shared storage hold the lock across reserve + write
+ publish: the slots are taken from the header's ``next`` under the lock (not from a cursor
of this process), the layout written by another process is mapped first, and the counter is
raised after the header is published. So concurrent writers never lose, duplicate or tear an
item, and the shared length counts finished writes only. An unshared storage (one process)
takes no lock. Readers take no lock either, and never return a torn row (half old, half new)
of a slot another process overwrites meanwhile: ``versions.bin`` holds one sequence word per
slot, odd while a writer changes the slot, and a read re-reads the rows whose words moved
(``_versions.py``).

``MemmapStorage`` opens, pickles, closes and shares its directory itself; it holds the
objects that own the rest: its :class:`~rbdata.storages.memmap._header.Header`, a
:class:`~rbdata.storages.memmap._shared.Sharing` (``shared.bin``'s counter and lock, the
slots' version words) and a :class:`~rbdata.storages.memmap._writepath.WritePath` (the redo
journal, the packed row writer, this process's write counts: ``_writepath.py``).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rbdata._core.files import atomic_write_json, inside, storage_dir
from rbdata._core.holders import Holders
from rbdata._core.ids import new_id
from rbdata._core.layout import Layout
from rbdata._core.torchrl_names import MEMMAP_KEYWORDS, torchrl_keywords
from rbdata.errors import CheckpointError, ReadOnlyError
from rbdata.storages import _memory
from rbdata.storages._persist import check_config
from rbdata.storages._target import WriteTarget
from rbdata.storages.base import Prepared, SavedStorage, Storage
from rbdata.storages.memmap._directory import check_counts, check_meta, layout_meta
from rbdata.storages.memmap._header import Header
from rbdata.storages.memmap._journal import Journal, read_orphan
from rbdata.storages.memmap._journal_format import Plan
from rbdata.storages.memmap._meta import (
    HEADER_FILE,
    JOURNAL_FILE,
    LAYOUT_FILE,
    read_layout,
    storage_id,
)
from rbdata.storages.memmap._rawfile import DataFiles
from rbdata.storages.memmap._shared import SHARED_FILE, SharedState, Sharing
from rbdata.storages.memmap._versions import consistent_rows
from rbdata.storages.memmap._writepath import WritePath
from rbdata.storages.tensor import TensorStorage

__all__ = ["MemmapStorage"]

#: every open storage of this process (a fork shares them all; ``open`` adopts one)
LIVE: weakref.WeakSet[MemmapStorage] = weakref.WeakSet()


class MemmapStorage(TensorStorage):
    """Items in memory-mapped files, one per leaf, plus a JSON layout and a tiny header.

    Every write is atomic across a SIGKILL (see the module docstring). Many processes may
    write at once once the storage is shared (pickled, forked, or :meth:`share`): writers then
    serialise on a lock file and take their slots from the shared header.

    Args:
        max_size: capacity in items.
        path: directory for the files. ``None`` makes a temporary directory that is removed
            when the storage is closed or garbage-collected; an explicit path is kept. An
            explicit path that already holds files is refused: reopen it with
            :meth:`MemmapStorage.open`.

    Pickling (DataLoader workers, ``multiprocessing`` spawn) sends the path, not the data:
    the receiving process maps the same files, so its writes are visible to the sender.

    Examples:
        >>> import torch
        >>> storage = MemmapStorage(1000)
        >>> storage.set([0, 1, 2], torch.arange(6.0).view(3, 2))
        >>> reopened = MemmapStorage.open(storage.path)
        >>> len(reopened), reopened[2].tolist()
        (3, [4.0, 5.0])
        >>> storage.close()
    """

    kind = "memmap"
    marker_file = LAYOUT_FILE
    writes_rows = True  # see Storage.writes_rows (declared per class)
    _read_only = False  # opened read_only=True: every write refused (see open)

    @torchrl_keywords(MEMMAP_KEYWORDS)
    def __init__(self, max_size: int, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(max_size, device="cpu")
        root, self._finalizer = storage_dir(self, path, "rbdata-memmap-")
        self._path = root
        self._private = False
        self._id: str | None = new_id()  # layout.json's id, in every data file's trailer
        self._files = DataFiles(self.capacity, self._id, private=False)
        self._header = Header(root / HEADER_FILE, create=True, ident=self._id)
        # the shared file comes when the storage is shared
        self._sharing = Sharing(root, self.capacity, SharedState(None))
        self._writes = WritePath(root, self.capacity, self._header, self._sharing, private=False)
        self._shared = False
        self._holders: Holders | None = None
        atomic_write_json(root / LAYOUT_FILE, self._meta(None))
        self._holders = Holders(root, "MemmapStorage")  # a new directory: the one holder
        LIVE.add(self)

    # --- opening, closing, pickling ----------------------------------------------------------
    @classmethod
    def open(
        cls, path: str | os.PathLike[str], copy_on_write: bool = False, read_only: bool = False
    ) -> MemmapStorage:
        """Reopen an existing storage directory (e.g. after a restart or a crash).

        Everything read is validated first: every field of ``layout.json`` and of the header
        (length and next slot in range), the file names (plain names inside the directory,
        no symlinks) and the file sizes. A committed journal left by a killed writer is
        replayed, an uncommitted one ignored.

        Args:
            path: the storage directory.
            copy_on_write: map the files privately: reads come from the files, lazily;
                writes stay in this process's memory and never reach the files (how a
                checkpoint is loaded). Such a storage pickles its data, not its path.
                ``False`` (default): read/write, shared with every process that holds it.
            read_only: map the files as ``copy_on_write`` does (no file is opened for
                writing: a read-only file system, a shared dataset cache) and refuse every
                write (``ReadOnlyError``). Pickling sends the path: the receiver opens the
                files read-only too.

        Who holds the directory decides how it is written (``holders.bin``, see
        :mod:`rbdata._core.holders`): opened by no one else, this process is its one holder
        (no lock, its fastest path); held by processes that share it (a storage pickled,
        forked or :meth:`share`-d), this one joins them shared; held by a process that
        writes it unshared, the open is refused (``StorageInUseError``: call
        :meth:`share` there first, or send the storage object). A second open in the
        process that holds it shares the first.

        Raises:
            FileNotFoundError: no storage directory at ``path``.
            ValueError: naming the file and the field that is corrupt or out of range.
            StorageInUseError: another process holds the directory unshared.
        """
        root = Path(path)
        meta = read_layout(root)
        capacity, layout, files = check_meta(root, meta)
        storage = cls.__new__(cls)
        TensorStorage.__init__(storage, capacity, device="cpu")
        storage._finalizer = None
        storage._path = root
        storage._private = private = bool(copy_on_write or read_only)
        storage._read_only = bool(read_only)
        storage._id = storage_id(root, meta)
        storage._files = DataFiles(capacity, storage._id, private)
        storage._shared = False
        storage._holders = None
        if not private:  # alone, joining sharers, or refused (see MemmapStorage.open)
            storage._holders = Holders(root, "MemmapStorage", lambda: cls._adopt(root))
        try:  # a refusal below closes what was opened (the hold on the directory)
            storage._header = header = Header(
                inside(root, HEADER_FILE), create=False, private=private, ident=storage._id
            )
            shared = None if private else inside(root, SHARED_FILE)
            if shared is not None and not shared.exists():
                shared = None  # never shared yet: created by _become_shared
            storage._sharing = sharing = Sharing(root, capacity, SharedState(shared))
            storage._writes = WritePath(root, capacity, header, sharing, private)
            header.check(capacity, layout is not None)
            if layout is not None:
                storage._map_files(layout, files)
                storage._replay()
            if storage._holders is not None and storage._holders.shared:
                storage._become_shared()
        except BaseException:
            storage.close()
            raise
        LIVE.add(storage)
        return storage

    def _map_files(self, layout: Layout, files: list[Path]) -> None:
        """Map the leaves' files (sizes checked) and make them the storage's buffers."""
        buffers, mapped = self._files.map(layout, files)
        self._set_buffers(buffers, layout, mapped)
        self._layout = layout
        self._files.paths = files

    def _replay(self) -> None:
        """Replay a committed journal left by a writer that died (if no live process writes)."""
        file = self._path / JOURNAL_FILE
        layout = self._layout
        if layout is None or not (file.exists() or file.is_symlink()):
            return
        inside(self._path, JOURNAL_FILE)
        if self._private:
            orphan = read_orphan(file, layout, self.capacity)
            if orphan is not None:
                self._apply(*orphan)
            return
        journal = Journal(file, layout, self.capacity)
        try:
            journal.replay_if_orphaned(self._apply)
        finally:
            journal.close()

    def __getstate__(self) -> dict[str, Any]:
        """A shared storage sends its path, a private copy its data."""
        self._check_open()
        if self._read_only:  # nothing written here: the receiver opens the files read-only
            return {"path": str(self._path), "read_only": True}
        if not self._private:
            self._become_shared()  # the receiver may write while this process does
            return {"path": str(self._path)}
        # private writes are in this process only: send the data (like a TensorStorage)
        layout = None if self._layout is None else self._layout.to_json()
        return {
            "path": str(self._path),
            "capacity": self.capacity,
            "layout": layout,
            # the rows (each leaf's bytes once; shared memory for another process), taken
            # under the storage's move lock: no write of another thread is lost to the move
            "buffers": _memory.ship(self._tensors(), self._layout, self._move_lock),
            "header": [self._header.length, self._header.next],
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        """The same files mapped again, or a private copy rebuilt."""
        if "buffers" not in state:
            read_only = bool(state.get("read_only", False))
            other = type(self).open(state["path"], read_only=read_only)
            LIVE.discard(other)
            self.__dict__.update(other.__dict__)
            other.__dict__.clear()
            if not read_only:
                self._become_shared()
            LIVE.add(self)
            return
        TensorStorage.__init__(self, state["capacity"], device="cpu")
        self._finalizer, self._path, self._private = None, Path(state["path"]), True
        self._id = None  # a private copy writes no file
        self._files = DataFiles(self.capacity, None, private=True)
        length, nxt = state["header"]
        self._header = Header.private_copy(length, nxt, self._path / HEADER_FILE)
        self._sharing = Sharing(self._path, self.capacity, SharedState(None))
        self._writes = WritePath(self._path, self.capacity, self._header, self._sharing, True)
        self._shared = False
        if state["layout"] is not None:
            self._layout = Layout.from_json(state["layout"])
            self._set_buffers(_memory.received(state["buffers"]), self._layout)

    def flush(self) -> None:
        """Write the mapped pages back to disk (``msync``): durability against power loss.

        A SIGKILL of the process loses nothing that an ``extend`` wrote before it returned
        (the page cache outlives the process); a power loss can, unless ``flush`` ran since.
        A private copy (``open(..., copy_on_write=True)``, what a checkpoint loads) has
        nothing to flush: its writes never reach a file, and the files it was mapped from
        may be gone (a later ``dumps`` over the same checkpoint removes them).
        """
        self._check_open()
        if self._private:
            return
        self._files.flush()
        self._writes.flush()
        self._header.flush()

    def close(self) -> None:
        """Unmap the files; a temporary directory (``path=None``) is removed.

        Every other method of a closed storage raises ``ValueError``.
        """
        self._closed = True
        writes: WritePath | None = getattr(self, "_writes", None)
        if writes is not None:  # the packed row first, the journal with it
            writes.close()
        self._buffers = []
        self._np_buffers = None
        self._mapped = None
        self._guard = ()
        self._plain = False
        self._layout = None
        if getattr(self, "_header", None) is not None:
            self._header.close()
            self._header = None  # type: ignore[assignment]
        sharing: Sharing | None = getattr(self, "_sharing", None)
        if sharing is not None:  # the version words, then shared.bin
            sharing.close()
        if getattr(self, "_holders", None) is not None:
            self._holders.close()  # type: ignore[union-attr]
            self._holders = None
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()

    def _allocate(self, layout: Layout) -> None:
        """Create and map the files of the layout fixed by the first write, then layout.json."""
        if self._private:  # never create files in a directory opened copy-on-write
            TensorStorage._allocate(self, layout)
            return
        meta = self._meta(layout)
        files = [inside(self._path, name, "data file") for name in meta["files"]]
        try:
            with self._files.created(layout, files):  # removed again if the rest fails
                self._map_files(layout, files)
                atomic_write_json(self._path / LAYOUT_FILE, meta)
        except BaseException:
            self._buffers, self._np_buffers, self._layout = [], None, None
            self._mapped, self._guard = None, ()
            raise
        self._layout = None  # the base sets it once _allocate returned

    # --- persistence hooks (the whole-array dump is TensorStorage's: _persist.py) ------------
    @classmethod
    def restore(cls, saved: SavedStorage) -> MemmapStorage:
        """The dumped files mapped copy-on-write: lazy, and writes never reach them."""
        directory, config = saved.directory, saved.config
        storage = cls.open(directory, copy_on_write=True)
        try:
            check_counts(storage, directory)
        except CheckpointError:
            storage.close()
            raise
        check_config(storage, config)
        return storage

    @classmethod
    def empty_like(
        cls,
        src: Storage,
        path: str | os.PathLike[str] | None = None,
        block_rows: int | None = None,
    ) -> MemmapStorage:
        """A new storage of ``src``'s capacity at ``path``."""
        return cls(src.capacity, path=path)

    def config(self) -> dict[str, Any]:
        """``max_size`` (checkpoints carry the data; the path is chosen when loading)."""
        self._check_open()
        return {"max_size": self.capacity}

    def _meta(self, layout: Layout | None) -> dict[str, Any]:
        return layout_meta(self.capacity, layout, self._id)

    def _current_layout(self) -> Layout | None:
        if self._layout is None and not self._private:  # another process's first write?
            _, layout, files = check_meta(self._path, read_layout(self._path))
            if layout is not None:
                self._map_files(layout, files)
        return self._layout

    def __repr__(self) -> str:
        where = "private copy of " if self._private else "path="
        return f"{super().__repr__()[:-1]}, {where}{str(self._path)!r})"

    @property
    def path(self) -> Path:
        """The storage directory.

        For a private copy (``open(..., copy_on_write=True)``, what a checkpoint loads) the
        directory it was mapped from: its writes never go there, and the directory may have
        been removed since (a later ``dumps`` over the same checkpoint does; the copy keeps
        working). ``repr`` says ``private copy of ...``.
        """
        self._check_open()
        return self._path

    @property
    def buffers(self) -> list[torch.Tensor]:
        """The backing tensors in layout order (views of all ``capacity`` slots)."""
        self._check_open()
        return self._tensors()

    # --- sharing between processes -------------------------------------------------------
    def share(self) -> None:
        """Mark the storage as written by several processes at once (see the module doc).

        Pickling and forking do it by themselves; call it on a storage that another process
        reached with :meth:`open`. A copy-on-write storage is never shared.
        """
        self._check_open()
        self._become_shared()

    @staticmethod
    def _adopt(root: Path) -> bool:
        """Share this process's unshared holder of ``root``, if it has one (see ``open``)."""
        for storage in list(LIVE):
            if storage._closed or storage._private or storage._shared:
                continue
            with contextlib.suppress(OSError):
                if os.path.samefile(storage._path, root):
                    storage._become_shared()
                    return True
        return False

    @classmethod
    def _share_all(cls) -> None:
        """Before a fork: parent and child both may write, every open storage becomes shared."""
        for storage in list(LIVE):
            if not storage._closed and not storage._private:
                storage._become_shared()

    def _become_shared(self) -> None:
        """Join the holders as a sharer, map ``shared.bin`` and the slots' version words."""
        if self._private or self._shared:
            return
        if self._holders is not None:  # first: a later open joins shared, never refused
            self._holders.share()
        self._sharing.share()
        self._shared = True

    @contextlib.contextmanager
    def write_lock(self) -> Iterator[None]:
        """Hold the write lock of the directory: no other process writes meanwhile.

        Inside, ``len``, ``next_slot`` and the layout are current (a layout fixed by another
        process is mapped on entry). Writers of a shared storage hold it across reserve +
        write + publish; a reader may hold it to read rows no writer is changing.
        """
        self._check_open()
        with self._sharing.locked():
            if self._layout is None:
                self._current_layout()
            yield

    @property
    def shared(self) -> bool:
        """Whether writes take the shared write lock (see :meth:`share`)."""
        return self._shared

    @property
    def write_count(self) -> int:
        """Items committed so far by every process (monotonic; kept in ``shared.bin``)."""
        if self._closed:
            self._check_open()
        return self._sharing.state.writes

    @property
    def items_written(self) -> int:
        """:attr:`write_count` (every process's writes) + the items loaded by ``copy_from``."""
        return self.write_count + self._items_written

    @property
    def last_write(self) -> tuple[int, int]:
        """``write_count`` just before and just after this process's last commit."""
        return self._writes.last_write

    @property
    def own_writes(self) -> int:
        """Items this process committed through :meth:`commit` (every write while shared)."""
        return self._writes.own

    # --- hooks -----------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._closed:
            self._check_open()
        n = self._header.length
        if n and self._layout is None:
            self._current_layout()
        return n

    def _set_length(self, n: int) -> None:
        self._header.publish(n, self._header.next)

    @property
    def next_slot(self) -> int:
        """The slot after the last write, kept in the header; a ring writer resumes there."""
        self._check_open()
        return self._header.next

    def _set_next(self, slot: int) -> None:
        self._header.publish(self._header.length, slot)

    def clear(self) -> None:
        """Forget all items (one atomic header update; files and layout are kept)."""
        self._check_writable()
        self._header.publish(0, 0)

    def copy_from(self, src: Storage) -> None:
        """:meth:`TensorStorage.copy_from`; refused by a storage opened ``read_only``."""
        self._check_writable()
        super().copy_from(src)

    def _check_writable(self) -> None:
        self._check_open()
        if self._read_only:
            raise ReadOnlyError(
                f"MemmapStorage at {str(self._path)!r} was opened with read_only=True: it "
                "refuses writes; open it without read_only (or copy_on_write=True for "
                "writes that stay in this process); nothing was written"
            )

    # --- the write path (the journal's side: _writepath.py) -----------------------------------
    def commit(self, target: WriteTarget, prepared: Prepared) -> None:
        """Write prepared data where ``target`` says, atomically (see the module docstring).

        A shared storage takes its write lock around the write (a writer that reserved its
        slots holds it already: it nests), so a ``set`` of this process and another process's
        write never interleave, and the cursor it moves or keeps is the one every process sees.
        """
        self._check_writable()
        if not self._shared:
            self._commit(target, prepared)
            return
        with self.write_lock():
            self._commit(target, prepared)

    def _commit(self, target: WriteTarget, prepared: Prepared) -> None:
        if prepared.layout is not None:
            # a shared storage: fixed by another process since this one prepared the data?
            if (
                self._shared
                and self._layout is None
                and self._current_layout() not in (None, prepared.layout)
            ):
                raise ValueError(
                    "data: its layout differs from the layout another process gave the "
                    f"storage first ({self._layout}); nothing was written"
                )
            self._ensure_layout(prepared.layout)
        header = self._header
        length = len(self)
        new_length = max(length, target.top)
        new_next = target.next_slot(self.capacity, header.next)
        with self._sharing.marks(target):  # shared: readers re-read these slots meanwhile
            if target.touches(length) and not self._private:
                journal = self._ready_journal()
                self._writes.journaled(
                    journal,
                    self._views(),
                    target,
                    prepared.payload,
                    new_length,
                    new_next,
                    not self._shared,  # shared: another process may have written the journal
                    self._apply,
                )
            else:
                if target.item:
                    self._write_one(target.first, prepared.payload)
                else:
                    self._write(target, prepared.payload)
                header.publish(new_length, new_next)
        self._writes.count(target.n, own=True)  # counted after the header is published

    def add_fast(self, slot: int, item: Any, check: Any = None) -> bool:
        """:meth:`TensorStorage.add_fast`; a small layout's item packed and written at once.

        See ``rbdata/storages/memmap/_packed.py``: one ``struct`` call and one kernel instead
        of a numpy assignment per leaf, twice (journal and file) for an overwrite.
        """
        writes = self._writes
        row = writes.row
        if row is None or self._shared or self._closed:
            return TensorStorage.add_fast(self, slot, item, check)
        flat = row.read(item)
        if flat is None or not 0 <= slot < self._capacity:
            return False
        if check is not None:
            check(slot, item)
        writes.add_packed(row, flat, slot, self._ready_journal)
        return True

    def write_row(self, slot: int, values: list[Any]) -> bool:
        """:meth:`TensorStorage.write_row`, crash-atomic (journaled over a live slot).

        Under the storage's move lock, like TensorStorage's: a private copy's memory may be
        moved by a pickle for another process (shared memory) in another thread.
        """
        if self._shared or self._closed or self._read_only:
            return False
        with self._move_lock:  # no move between the views and the last byte (see _memory)
            arrays = self._views()
            if arrays is None:
                return False
            self._writes.write_row(arrays, slot, values, self._ready_journal)
        return True

    def write_rows(self, start: int, n: int, values: list[Any]) -> bool:
        """:meth:`TensorStorage.write_rows`, crash-atomic (journaled over live slots)."""
        if self._shared or self._np_buffers is None or self._closed or self._read_only:
            return False
        self._writes.write_rows(start, n, values, self._put_rows, self._ready_journal)
        return True

    def _ready_journal(self) -> Journal:
        """The journal, created on first use, with any transaction a dead writer left applied."""
        layout = self._layout
        assert layout is not None
        journal = self._writes.open_journal(layout)
        if journal.committed:  # left by a writer that died: finish it first
            transaction = journal.read()
            with self._sharing.marks(transaction[1]):
                self._apply(*transaction)
            journal.clear()
        return journal

    def _apply(
        self, kind: int, target: WriteTarget, rows: int, length: int, nxt: int, plan: Plan
    ) -> None:
        """Copy a journal transaction into the files, then publish its header."""
        del kind, rows
        self._writes.apply(self._views(), self._tensors(), target, length, nxt, plan)

    def _set_buffers(
        self,
        buffers: list[torch.Tensor],
        layout: Layout,
        mapped: list[_memory.Mapping | None] | None = None,
    ) -> None:
        super()._set_buffers(buffers, layout, mapped)
        unpacker = self._unpacker
        unpack_flat = None if unpacker is None else unpacker.unpack_flat
        self._writes.bind_row(layout, unpack_flat, self._np_buffers)

    def _rows(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """:meth:`TensorStorage._rows`; shared: no row torn by another process's write."""
        versions = self._sharing.versions
        if versions is None:
            return super()._rows(idx)
        return consistent_rows(versions, idx, super()._rows, self.write_lock)

    def _get(self, index: int) -> Any:
        if self._sharing.versions is None:
            return super()._get(index)
        layout = self._layout
        assert layout is not None  # len() > 0 implies a layout
        rows = self._rows(torch.tensor([index]))  # a consistent copy, not a view
        return layout.assemble([t[0] for t in rows], torch.Size(), self.device)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=MemmapStorage._share_all)
