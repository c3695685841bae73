"""``MemmapStorage``: one memory-mapped file per leaf, shareable across processes, reopenable.

On disk, a storage directory holds:

- ``layout.json``: format name and version, capacity, keys, per-item shapes, dtypes, file names;
- one raw file per leaf (``capacity * item bytes``), its space reserved when it is created
  (``posix_fallocate``: a full disk is an ``OSError`` at the first extend, never a SIGBUS);
- ``header.bin``: the filled length and the slot after the last write (where a ring writer
  resumes), as a double record switched by one 8-byte store (see
  :mod:`rbdata.storages.memmap._journal`);
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
(``rbdata/storages/_versions.py``).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rbdata._files import (
    atomic_write_json,
    inside,
    storage_dir,
)
from rbdata._index import ring_runs
from rbdata._layout import Layout
from rbdata.storages import _memory
from rbdata.storages._unpack import numpy_views
from rbdata.storages.base import Prepared
from rbdata.storages.memmap._directory import (
    HEADER_FILE,
    JOURNAL_FILE,
    LAYOUT_FILE,
    bad_field,
    check_meta,
    layout_meta,
    read_layout,
)
from rbdata.storages.memmap._journal import (
    Header,
    Journal,
    Plan,
    create_file,
    map_file,
    read_orphan,
)
from rbdata.storages.memmap._packed import PackedRow
from rbdata.storages.memmap._persist import MemmapFiles
from rbdata.storages.memmap._shared import SharedState
from rbdata.storages.memmap._versions import VERSIONS_FILE, SlotVersions, consistent_rows
from rbdata.storages.tensor import TensorStorage

__all__ = ["MemmapStorage"]

SHARED_FILE = "shared.bin"
_LIVE: weakref.WeakSet[MemmapStorage] = weakref.WeakSet()


def _mark_shared_before_fork() -> None:
    """Parent and child of a fork both may write: every open storage becomes shared."""
    for storage in list(_LIVE):
        if not storage._closed and not storage._private:
            storage._become_shared()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_mark_shared_before_fork)


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

    def __init__(self, max_size: int, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(max_size, device="cpu")
        root, self._finalizer = storage_dir(self, path, "rbdata-memmap-")
        self._path = root
        self._private = False
        self._journal: Journal | None = None
        self._data_files: list[Path] = []
        self._header = Header(root / HEADER_FILE, create=True)
        self._state = SharedState(None)  # the file comes when the storage is shared
        self._shared = False
        self._last_write = (0, 0)
        atomic_write_json(root / LAYOUT_FILE, self._meta(None))
        _LIVE.add(self)

    # --- opening, closing, pickling --------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], copy_on_write: bool = False) -> MemmapStorage:
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
                ``False`` (default): read/write, shared with every process that opens it.

        Raises:
            FileNotFoundError: no storage directory at ``path``.
            ValueError: naming the file and the field that is corrupt or out of range.
        """
        root = Path(path)
        meta = read_layout(root)
        capacity, layout, files = check_meta(root, meta)
        self = cls.__new__(cls)
        TensorStorage.__init__(self, capacity, device="cpu")
        self._finalizer = None
        self._path = root
        self._private = bool(copy_on_write)
        self._journal = None
        self._data_files = []
        self._shared = False
        self._last_write = (0, 0)
        self._state = None  # type: ignore[assignment]
        self._header = header = Header(
            inside(root, HEADER_FILE), create=False, private=self._private
        )
        try:
            shared = None if self._private else inside(root, SHARED_FILE)
            if shared is not None and not shared.exists():
                shared = None  # never shared yet: created by _become_shared
            self._state = SharedState(shared)
            self._check_header(*header.first, layout)
            if layout is not None:
                self._map_files(layout, files)
                self._replay()
        except BaseException:
            self.close()
            raise
        _LIVE.add(self)
        return self

    def _check_header(self, length: int, nxt: int, layout: Layout | None) -> None:
        file, cap = self._path / HEADER_FILE, self.capacity
        if not 0 <= length <= cap:
            raise bad_field(file, "length", length, f"in [0, {cap}] (the capacity)")
        if not 0 <= nxt < cap:
            raise bad_field(file, "next", nxt, f"in [0, {cap})")
        if nxt > length:
            raise bad_field(file, "next", nxt, f"at most the length {length}")
        if layout is None and length:
            raise bad_field(file, "length", length, "0: layout.json has no layout")

    def _map_files(self, layout: Layout, files: list[Path]) -> None:
        buffers, mapped = [], []
        for file, leaf in zip(files, layout.leaves, strict=True):
            expected = self.capacity * leaf.numel * leaf.dtype.itemsize
            shape = (self.capacity, *leaf.shape)
            buf, raw = map_file(file, leaf.dtype, shape, expected, self._private, leaf.name)
            buffers.append(buf)
            mapped.append(None if raw is None else _memory.mapping(raw))
        self._set_buffers(buffers, layout, mapped)
        self._layout = layout
        self._data_files = files

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

    def config(self) -> dict[str, Any]:
        """``max_size`` (checkpoints carry the data; the path is chosen when loading)."""
        self._check_open()
        return {"max_size": self.capacity}

    def _meta(self, layout: Layout | None) -> dict[str, Any]:
        return layout_meta(self.capacity, layout)

    def _current_layout(self) -> Layout | None:
        if self._layout is None and not self._private:  # another process's first write?
            _, layout, files = check_meta(self._path, read_layout(self._path))
            if layout is not None:
                self._map_files(layout, files)
        return self._layout

    def __getstate__(self) -> dict[str, Any]:
        self._check_open()
        if not self._private:
            self._become_shared()  # the receiver may write while this process does
            return {"path": str(self._path)}
        # private writes are in this process only: send the data (like a TensorStorage)
        layout = None if self._layout is None else self._layout.to_json()
        return {
            "path": str(self._path),
            "capacity": self.capacity,
            "layout": layout,
            "buffers": self._tensors(),  # the mapping's current rows (see _memory)
            "header": [self._header.length, self._header.next],
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "buffers" not in state:
            other = type(self).open(state["path"])
            _LIVE.discard(other)
            self.__dict__.update(other.__dict__)
            other.__dict__.clear()
            self._become_shared()
            _LIVE.add(self)
            return
        TensorStorage.__init__(self, state["capacity"], device="cpu")
        self._finalizer, self._path, self._private = None, Path(state["path"]), True
        self._journal, self._data_files = None, []
        length, nxt = state["header"]
        self._header = Header.private_copy(length, nxt, self._path / HEADER_FILE)
        self._state, self._shared, self._last_write = SharedState(None), False, (0, 0)
        if state["layout"] is not None:
            self._layout = Layout.from_json(state["layout"])
            self._set_buffers(state["buffers"], self._layout)

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
        for file in self._data_files:
            fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                os.fsync(fd)  # the page cache of a MAP_SHARED mapping is the file's
            finally:
                os.close(fd)
        if self._journal is not None:
            self._journal.flush()
        self._header.flush()

    def close(self) -> None:
        """Unmap the files; a temporary directory (``path=None``) is removed.

        Every other method of a closed storage raises ``ValueError``.
        """
        self._closed = True
        self._row = None
        self._buffers = []
        self._np_buffers = None
        self._mapped = None
        self._guard = ()
        self._plain = False
        self._layout = None
        if getattr(self, "_journal", None) is not None:
            self._journal.close()  # type: ignore[union-attr]
            self._journal = None
        if getattr(self, "_header", None) is not None:
            self._header.close()
            self._header = None  # type: ignore[assignment]
        if self._versions is not None:
            self._versions.close()
            self._versions = None
        if getattr(self, "_state", None) is not None:
            self._state.close()
            self._state = None  # type: ignore[assignment]
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()

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

    def _become_shared(self) -> None:
        if self._private or self._shared:
            return
        if self._state.path is None:  # map shared.bin, seeded with this process's count
            state = SharedState(inside(self._path, SHARED_FILE), seed=self._state.writes)
            self._state.close()
            self._state = state
        self._versions = SlotVersions(inside(self._path, VERSIONS_FILE), self.capacity)
        self._shared = True

    @property
    def shared(self) -> bool:
        """Whether writes take the shared write lock (see :meth:`share`)."""
        return self._shared

    @contextlib.contextmanager
    def write_lock(self) -> Iterator[None]:
        """Hold the write lock of the directory: no other process writes meanwhile.

        Inside, ``len``, ``next_slot`` and the layout are current (a layout fixed by another
        process is mapped on entry). Writers of a shared storage hold it across reserve +
        write + publish; a reader may hold it to read rows no writer is changing.
        """
        self._check_open()
        state = self._state
        outer = self._lock_depth == 0  # nested (a reader's fallback inside a locked read)
        if outer:
            state.lock()
        self._lock_depth += 1
        try:
            if self._layout is None:
                self._current_layout()
            yield
        finally:
            self._lock_depth -= 1
            if outer:
                state.unlock()

    @property
    def write_count(self) -> int:
        """Items committed so far by every process (monotonic; kept in ``shared.bin``)."""
        if self._closed:
            self._check_open()
        return self._state.writes

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
        self._check_open()
        self._header.publish(0, 0)

    def commit(self, index: int | list[slice] | torch.Tensor, prepared: Prepared) -> None:
        """Write prepared data at a normalised index, atomically (see the module docstring)."""
        self._check_open()
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
        if isinstance(index, int):
            top = last = index + 1
            live = index < length
            rows = 1
        elif isinstance(index, list):
            top = max((run.stop for run in index), default=0)
            last = index[-1].stop if index else header.next
            live = any(run.start < min(run.stop, length) for run in index)
            rows = sum(run.stop - run.start for run in index)
        else:
            rows = count = index.numel()
            top = int(index.max()) + 1 if count else 0
            last = int(index[-1]) + 1 if count else header.next
            live = bool(count) and int(index.min()) < length
        new_length, new_next = max(length, top), last % self.capacity
        with self._marks(index):  # shared: readers re-read these slots meanwhile
            if live and not self._private:
                self._journaled(index, prepared.payload, new_length, new_next)
            else:
                if isinstance(index, int):
                    self._write_one(index, prepared.payload)
                else:
                    self._write(index, prepared.payload)
                header.publish(new_length, new_next)
        before = self._state.count(rows)  # counted after the header is published
        self._last_write = (before, before + rows)
        self._own += rows

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

    def _marks(
        self, index: int | list[slice] | torch.Tensor
    ) -> contextlib.AbstractContextManager[Any]:
        """The version marks of a write of ``index`` (shared storages; else nothing)."""
        versions = self._versions if self._shared else None
        return contextlib.nullcontext() if versions is None else versions.writing(index)

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

    def add_fast(self, slot: int, item: Any, check: Any = None) -> bool:
        """:meth:`TensorStorage.add_fast`; a small layout's item packed and written at once.

        See ``rbdata/storages/_packed.py``: one ``struct`` call and one kernel instead of a
        numpy assignment per leaf, twice (journal and file) for an overwrite.
        """
        row = self._row
        if row is None or self._shared or self._closed:
            return super().add_fast(slot, item, check)
        flat = row.read(item)
        if flat is None or not 0 <= slot < self._capacity:
            return False
        if check is not None:
            check(slot, item)
        journal = self._journal  # the packed item goes to its payload (scratch if uncommitted)
        before = -1 if journal is None else journal.write_packed(row, flat, slot)
        if before < 0:  # first use, or a transaction to finish first
            before = self._ready_journal().write_packed(row, flat, slot)
            assert before >= 0, "the journal is empty after _ready_journal"
        self._last_write = (before, before + 1)
        return True

    def write_row(self, slot: int, values: list[Any]) -> bool:
        """:meth:`TensorStorage.write_row`, crash-atomic (journaled over a live slot)."""
        arrays = self._views()
        if self._shared or arrays is None or self._closed:
            return False
        header = self._header
        length = header.length
        top = slot + 1
        new_length = top if top > length else length
        nxt = top if top < self._capacity else 0
        if slot < length and not self._private:  # an overwrite: through the journal
            journal = self._journal
            if journal is None or not journal.write_one(
                arrays, values, slot, new_length, nxt, header
            ):  # the first one (or after a failed write): lay the one-item plan out
                journal = self._ready_journal()
                journal.begin(0, [slot, top], 1, new_length, nxt)
                written = journal.write_one(arrays, values, slot, new_length, nxt, header)
                assert written, "the one-item plan exists and nothing is committed"
        else:
            for arr, value in zip(arrays, values, strict=True):
                arr[slot] = value
            header.publish(new_length, nxt)
        before = self._state.count(1)
        self._last_write = (before, before + 1)
        return True

    def write_rows(self, start: int, n: int, values: list[Any]) -> bool:
        """:meth:`TensorStorage.write_rows`, crash-atomic (journaled over live slots)."""
        if self._shared or self._np_buffers is None or self._closed:
            return False
        header, cap = self._header, self._capacity
        length = header.length
        end = start + n
        new_length = max(length, min(end, cap))
        nxt = end % cap
        live = start < length or (end > cap and length > 0)
        if live and not self._private:  # overwrites: through the journal
            journal = self._journal
            if journal is None or journal.committed:
                journal = self._ready_journal()
            plan = journal.begin_run(start, end, new_length, nxt, own=True) if end <= cap else None
            slots: list[int] = []
            if plan is None:  # the first batch of n rows, or one that wraps (two runs)
                slots = [v for run in ring_runs(start, n, cap) for v in (run.start, run.stop)]
                plan = journal.begin(0, slots, n, new_length, nxt)
            for nview, value in zip(plan.nviews, values, strict=True):
                nview[...] = value  # type: ignore[index]
            if slots:
                journal.commit(plan, len(slots))
            else:
                journal.commit_run()
            self._put_rows(start, n, values)  # the rows the journal holds
            header.publish(new_length, nxt)
            journal.clear()
        else:
            self._put_rows(start, n, values)
            header.publish(new_length, nxt)
        before = self._state.count(n)
        self._last_write = (before, before + n)
        return True

    def _ready_journal(self) -> Journal:
        """The journal, created on first use, with any transaction a dead writer left applied."""
        journal = self._journal
        if journal is None:
            layout = self._layout
            assert layout is not None
            file = inside(self._path, JOURNAL_FILE)
            journal = self._journal = Journal(file, layout, self.capacity)
            journal.lock_shared()
        if journal.committed:  # left by a writer that died: finish it first
            transaction = journal.read()
            with self._marks(transaction[1]):
                self._apply(*transaction)
            journal.clear()
        return journal

    def _journaled(
        self, index: int | list[slice] | torch.Tensor, payload: list[Any], length: int, nxt: int
    ) -> None:
        journal = self._ready_journal()
        arrays = self._views()
        if type(index) is int and arrays is not None:  # one item (add): the numpy path
            values = numpy_views(payload)
            own = not self._shared  # shared: another process may have written the journal
            if values is not None and journal.write_one(
                arrays, values, index, length, nxt, self._header, own=own
            ):
                return
        slots: list[int] | torch.Tensor
        target: list[slice] | torch.Tensor
        if isinstance(index, int):
            kind, rows, slots, target = 0, 1, [index, index + 1], [slice(index, index + 1)]
        elif isinstance(index, list):
            kind, rows, target = 0, sum(run.stop - run.start for run in index), index
            slots = [v for run in index for v in (run.start, run.stop)]
        else:
            kind, rows, slots, target = 1, int(index.numel()), index.to(torch.int64), index
        plan = journal.begin(kind, slots, rows, length, nxt)
        one = isinstance(index, int)
        for tview, nview, t in zip(plan.tviews, plan.nviews, payload, strict=True):
            # casts, densifies, moves: may raise, nothing is committed yet
            if nview is not None and type(t) is torch.Tensor and not t.requires_grad:
                try:
                    nview[0 if one else ...] = t.numpy()
                    continue
                except (RuntimeError, TypeError):  # conj bit, CUDA, ...: the torch path
                    pass
            with torch.no_grad():
                tview.copy_(t.unsqueeze(0) if one else t)
        journal.commit(plan, len(slots))
        self._apply(kind, target, rows, length, nxt, plan)
        journal.clear()

    def _apply(
        self,
        kind: int,
        index: list[slice] | torch.Tensor,
        rows: int,
        length: int,
        nxt: int,
        plan: Plan,
    ) -> None:
        """Copy a journal transaction into the files, then publish its header."""
        del kind, rows
        arrays = self._views()
        buffers = self._tensors()
        if isinstance(index, list):
            offset = 0
            for run in index:
                start, stop = run.start, run.stop
                end = offset + stop - start
                if arrays is not None and plan.numpy:
                    for arr, nview in zip(arrays, plan.nviews, strict=True):
                        arr[start:stop] = nview[offset:end]  # type: ignore[index]
                else:
                    for buf, tview in zip(buffers, plan.tviews, strict=True):
                        buf[start:stop].copy_(tview[offset:end])
                offset = end
        else:
            for buf, tview in zip(buffers, plan.tviews, strict=True):
                buf.index_copy_(0, index, tview)
        self._header.publish(length, nxt)

    def _allocate(self, layout: Layout) -> None:
        if self._private:  # never create files in a directory opened copy-on-write
            TensorStorage._allocate(self, layout)
            return
        meta = self._meta(layout)
        files = [inside(self._path, name, "data file") for name in meta["files"]]
        made: list[Path] = []
        try:
            for file, leaf in zip(files, layout.leaves, strict=True):
                made.append(file)
                create_file(file, self.capacity * leaf.numel * leaf.dtype.itemsize)
            self._map_files(layout, files)
            atomic_write_json(self._path / LAYOUT_FILE, meta)
        except BaseException:
            self._buffers, self._np_buffers, self._layout = [], None, None
            self._mapped, self._guard = None, ()
            for file in made:
                with contextlib.suppress(OSError):
                    file.unlink()
            raise
        self._layout = None  # the base sets it once _allocate returned
