"""The write path of a :class:`~rbdata.storages.MemmapStorage`: commits and the redo journal.

:class:`~rbdata.storages.MemmapStorage` binds these functions as its methods (no extra call
on the per-step ``add`` or a batch ``extend``):

- :func:`commit`: a prepared write, into free slots directly, over live ones journaled;
- :func:`add_fast`, :func:`write_row`, :func:`write_rows`: the per-step and contiguous-run
  fast paths of the writers, crash-atomic (journaled over a live slot);
- :func:`ready_journal`, :func:`journaled`, :func:`apply`: the journal created on first use
  (finishing a dead writer's transaction), a transaction written and committed, then copied
  into the files and published (also how ``open`` replays one).

Every function calls the storage's other steps through its methods (``storage._apply``,
``storage._put_rows``...), so a subclass or a test may replace one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from rbdata._files import inside
from rbdata._index import ring_runs
from rbdata.storages._target import WriteTarget
from rbdata.storages._unpack import numpy_views
from rbdata.storages.base import Prepared
from rbdata.storages.memmap._directory import JOURNAL_FILE
from rbdata.storages.memmap._journal import Journal
from rbdata.storages.memmap._journal_format import Plan
from rbdata.storages.tensor import TensorStorage

if TYPE_CHECKING:
    from rbdata.storages.memmap.storage import MemmapStorage

__all__ = [
    "add_fast",
    "apply",
    "commit",
    "journaled",
    "ready_journal",
    "write_row",
    "write_rows",
]


def commit(storage: MemmapStorage, target: WriteTarget, prepared: Prepared) -> None:
    """Write prepared data where ``target`` says, atomically (see ``memmap/storage.py``).

    A shared storage takes its write lock around the write (a writer that reserved its
    slots holds it already: it nests), so a ``set`` of this process and another process's
    write never interleave, and the cursor it moves or keeps is the one every process sees.
    """
    storage._check_writable()
    if not storage._shared:
        _commit(storage, target, prepared)
        return
    with storage.write_lock():
        _commit(storage, target, prepared)


def _commit(storage: MemmapStorage, target: WriteTarget, prepared: Prepared) -> None:
    if prepared.layout is not None:
        # a shared storage: fixed by another process since this one prepared the data?
        if (
            storage._shared
            and storage._layout is None
            and storage._current_layout() not in (None, prepared.layout)
        ):
            raise ValueError(
                "data: its layout differs from the layout another process gave the "
                f"storage first ({storage._layout}); nothing was written"
            )
        storage._ensure_layout(prepared.layout)
    header = storage._header
    length = len(storage)
    rows = target.n
    new_length = max(length, target.top)
    new_next = target.next_slot(storage.capacity, header.next)
    live = target.touches(length)
    with storage._marks(target):  # shared: readers re-read these slots meanwhile
        if live and not storage._private:
            storage._journaled(target, prepared.payload, new_length, new_next)
        else:
            if target.item:
                storage._write_one(target.first, prepared.payload)
            else:
                storage._write(target, prepared.payload)
            header.publish(new_length, new_next)
    before = storage._state.count(rows)  # counted after the header is published
    storage._last_write = (before, before + rows)
    storage._own += rows


def add_fast(storage: MemmapStorage, slot: int, item: Any, check: Any = None) -> bool:
    """:meth:`TensorStorage.add_fast`; a small layout's item packed and written at once.

    See ``rbdata/storages/memmap/_packed.py``: one ``struct`` call and one kernel instead of a
    numpy assignment per leaf, twice (journal and file) for an overwrite.
    """
    row = storage._row
    if row is None or storage._shared or storage._closed:
        return TensorStorage.add_fast(storage, slot, item, check)
    flat = row.read(item)
    if flat is None or not 0 <= slot < storage._capacity:
        return False
    if check is not None:
        check(slot, item)
    journal = storage._journal  # the packed item goes to its payload (scratch if uncommitted)
    before = -1 if journal is None else journal.write_packed(row, flat, slot)
    if before < 0:  # first use, or a transaction to finish first
        before = storage._ready_journal().write_packed(row, flat, slot)
        assert before >= 0, "the journal is empty after _ready_journal"
    storage._last_write = (before, before + 1)
    return True


def write_row(storage: MemmapStorage, slot: int, values: list[Any]) -> bool:
    """:meth:`TensorStorage.write_row`, crash-atomic (journaled over a live slot).

    Under the storage's move lock, like TensorStorage's: a private copy's memory may be moved
    by a pickle for another process (shared memory) in another thread.
    """
    if storage._shared or storage._closed or storage._read_only:
        return False
    with storage._move_lock:  # no move between the views and the last byte (see _memory)
        arrays = storage._views()
        if arrays is None:
            return False
        _write_row(storage, arrays, slot, values)
    return True


def _write_row(storage: MemmapStorage, arrays: list[Any], slot: int, values: list[Any]) -> None:
    header = storage._header
    length = header.length
    top = slot + 1
    new_length = top if top > length else length
    nxt = top if top < storage._capacity else 0
    if slot < length and not storage._private:  # an overwrite: through the journal
        journal = storage._journal
        if journal is None or not journal.write_one(
            arrays, values, slot, new_length, nxt, header
        ):  # the first one (or after a failed write): lay the one-item plan out
            journal = storage._ready_journal()
            journal.begin(0, [slot, top], 1, new_length, nxt)
            written = journal.write_one(arrays, values, slot, new_length, nxt, header)
            assert written, "the one-item plan exists and nothing is committed"
    else:
        for arr, value in zip(arrays, values, strict=True):
            arr[slot] = value
        header.publish(new_length, nxt)
    before = storage._state.count(1)
    storage._last_write = (before, before + 1)


def write_rows(storage: MemmapStorage, start: int, n: int, values: list[Any]) -> bool:
    """:meth:`TensorStorage.write_rows`, crash-atomic (journaled over live slots)."""
    if storage._shared or storage._np_buffers is None or storage._closed or storage._read_only:
        return False
    header, cap = storage._header, storage._capacity
    length = header.length
    end = start + n
    new_length = max(length, min(end, cap))
    nxt = end % cap
    live = start < length or (end > cap and length > 0)
    if live and not storage._private:  # overwrites: through the journal
        journal = storage._journal
        if journal is None or journal.committed:
            journal = storage._ready_journal()
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
        storage._put_rows(start, n, values)  # the rows the journal holds
        header.publish(new_length, nxt)
        journal.clear()
    else:
        storage._put_rows(start, n, values)
        header.publish(new_length, nxt)
    before = storage._state.count(n)
    storage._last_write = (before, before + n)
    return True


def ready_journal(storage: MemmapStorage) -> Journal:
    """The journal, created on first use, with any transaction a dead writer left applied."""
    journal = storage._journal
    if journal is None:
        layout = storage._layout
        assert layout is not None
        file = inside(storage._path, JOURNAL_FILE)
        journal = storage._journal = Journal(file, layout, storage.capacity)
        journal.lock_shared()
    if journal.committed:  # left by a writer that died: finish it first
        transaction = journal.read()
        with storage._marks(transaction[1]):
            storage._apply(*transaction)
        journal.clear()
    return journal


def journaled(
    storage: MemmapStorage, target: WriteTarget, payload: list[Any], length: int, nxt: int
) -> None:
    journal = storage._ready_journal()
    arrays = storage._views()
    one = target.item
    if one and arrays is not None:  # one item (add): the numpy path
        values = numpy_views(payload)
        own = not storage._shared  # shared: another process may have written the journal
        if values is not None and journal.write_one(
            arrays, values, target.first, length, nxt, storage._header, own=own
        ):
            return
    slots: list[int] | torch.Tensor
    if target.runs is not None:
        kind, slots = 0, target.bounds()
    else:
        kind, slots = 1, target.slots().to(torch.int64)
    plan = journal.begin(kind, slots, target.n, length, nxt)
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
    storage._apply(kind, target, target.n, length, nxt, plan)
    journal.clear()


def apply(
    storage: MemmapStorage,
    kind: int,
    target: WriteTarget,
    rows: int,
    length: int,
    nxt: int,
    plan: Plan,
) -> None:
    """Copy a journal transaction into the files, then publish its header."""
    del kind, rows
    arrays = storage._views()
    buffers = storage._tensors()
    runs = target.runs
    if runs is not None:
        offset = 0
        for run in runs:
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
        index = target.slots()
        for buf, tview in zip(buffers, plan.tviews, strict=True):
            buf.index_copy_(0, index, tview)
    storage._header.publish(length, nxt)
