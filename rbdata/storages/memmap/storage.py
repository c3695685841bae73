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

``MemmapStorage`` itself is a thin composition: the mechanisms live beside it in this package
and are bound as its methods (``_lifecycle.py``: open, pickle, flush, close; ``_sharing.py``:
becoming shared, the write lock; ``_writes.py``: commits and journal transactions).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch

from rbdata._files import atomic_write_json, storage_dir
from rbdata._holders import Holders
from rbdata._ids import new_id
from rbdata._layout import Layout
from rbdata._torchrl_names import MEMMAP_KEYWORDS, torchrl_keywords
from rbdata.errors import ReadOnlyError
from rbdata.storages import _memory
from rbdata.storages.base import Storage
from rbdata.storages.memmap import _lifecycle, _sharing, _writes
from rbdata.storages.memmap._directory import (
    HEADER_FILE,
    LAYOUT_FILE,
    check_meta,
    layout_meta,
    read_layout,
)
from rbdata.storages.memmap._header import Header
from rbdata.storages.memmap._journal import Journal
from rbdata.storages.memmap._packed import PackedRow
from rbdata.storages.memmap._persist import MemmapFiles
from rbdata.storages.memmap._shared import SharedState
from rbdata.storages.memmap._sharing import LIVE
from rbdata.storages.memmap._versions import SlotVersions, consistent_rows

__all__ = ["MemmapStorage"]


class MemmapStorage(MemmapFiles):
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

    writes_rows = True  # see Storage.writes_rows (declared per class)
    _row: PackedRow | None = None  # the packed per-step add of a small layout (see add_fast)
    _versions: SlotVersions | None = None  # per-slot sequence words once shared (_versions.py)
    _lock_depth = 0  # write_lock nesting in this process (the flock is taken once)
    _own = 0  # items this process committed through commit (see own_writes)
    _read_only = False  # opened read_only=True: every write refused (see open)

    @torchrl_keywords(MEMMAP_KEYWORDS)
    def __init__(self, max_size: int, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(max_size, device="cpu")
        root, self._finalizer = storage_dir(self, path, "rbdata-memmap-")
        self._path = root
        self._private = False
        self._id: str | None = new_id()  # layout.json's id, in every data file's trailer
        self._journal: Journal | None = None
        self._data_files: list[Path] = []
        self._header = Header(root / HEADER_FILE, create=True, ident=self._id)
        self._state = SharedState(None)  # the file comes when the storage is shared
        self._shared = False
        self._last_write = (0, 0)
        self._holders: Holders | None = None
        atomic_write_json(root / LAYOUT_FILE, self._meta(None))
        self._holders = Holders(root, "MemmapStorage")  # a new directory: the one holder
        LIVE.add(self)

    # --- opening, closing, pickling (the mechanisms: _lifecycle.py) -----------------------
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
        :mod:`rbdata._holders`): opened by no one else, this process is its one holder
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
        return _lifecycle.open_dir(cls, path, copy_on_write, read_only)

    _check_header = _lifecycle.check_header
    _map_files = _lifecycle.map_files
    _replay = _lifecycle.replay
    __getstate__ = _lifecycle.get_state
    __setstate__ = _lifecycle.set_state
    flush = _lifecycle.flush
    close = _lifecycle.close
    _allocate = _lifecycle.allocate

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

    _become_shared = _sharing.become_shared
    write_lock = _sharing.write_lock
    _marks = _sharing.marks

    @property
    def shared(self) -> bool:
        """Whether writes take the shared write lock (see :meth:`share`)."""
        return self._shared

    @property
    def write_count(self) -> int:
        """Items committed so far by every process (monotonic; kept in ``shared.bin``)."""
        if self._closed:
            self._check_open()
        return self._state.writes

    @property
    def items_written(self) -> int:
        """:attr:`write_count` (every process's writes) + the items loaded by ``copy_from``."""
        return self.write_count + self._items_written

    @property
    def last_write(self) -> tuple[int, int]:
        """``write_count`` just before and just after this process's last commit."""
        return self._last_write

    @property
    def own_writes(self) -> int:
        """Items this process committed through :meth:`commit` (every write while shared)."""
        return self._own

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

    # --- the write path (bound from _writes.py: no extra call on add / extend) -------------
    commit = _writes.commit
    add_fast = _writes.add_fast
    write_row = _writes.write_row
    write_rows = _writes.write_rows
    _ready_journal = _writes.ready_journal
    _journaled = _writes.journaled
    _apply = _writes.apply

    def _set_buffers(
        self,
        buffers: list[torch.Tensor],
        layout: Layout,
        mapped: list[_memory.Mapping | None] | None = None,
    ) -> None:
        super()._set_buffers(buffers, layout, mapped)
        self._row = None
        unpacker = self._unpacker
        if unpacker is not None and not self._private:
            self._row = PackedRow.for_storage(
                layout,
                unpacker.unpack_flat,
                self._np_buffers,
                self._header.address(),
                self._state.local_counter(),
            )

    def _rows(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """:meth:`TensorStorage._rows`; shared: no row torn by another process's write."""
        versions = self._versions
        if versions is None:
            return super()._rows(idx)
        return consistent_rows(versions, idx, super()._rows, self.write_lock)

    def _get(self, index: int) -> Any:
        if self._versions is None:
            return super()._get(index)
        layout = self._layout
        assert layout is not None  # len() > 0 implies a layout
        rows = self._rows(torch.tensor([index]))  # a consistent copy, not a view
        return layout.assemble([t[0] for t in rows], torch.Size(), self.device)
