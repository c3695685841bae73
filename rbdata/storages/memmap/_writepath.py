"""The crash-atomic write path of a :class:`~rbdata.storages.MemmapStorage`: :class:`WritePath`.

A write into free slots only writes the rows, then publishes the header. A write over live
slots goes through the redo journal (``journal.bin``): the new rows and their slots are
written to it and committed (a checksum stored last), then copied into the files, the header
published and the journal cleared (see ``memmap/storage.py``). :class:`WritePath` owns that
journal (created on first use), the packed row writer of a small layout's per-step ``add``
(``_packed.py``) and this process's write counts; the storage hands it the rows to write
(its numpy views and tensors) and the steps that touch its buffers (``apply``, ``ready``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rbdata._core.files import inside
from rbdata._core.index import ring_runs
from rbdata._core.layout import Layout
from rbdata.storages._target import WriteTarget
from rbdata.storages._unpack import numpy_views
from rbdata.storages.memmap._header import Header
from rbdata.storages.memmap._journal import Journal
from rbdata.storages.memmap._journal_format import Plan
from rbdata.storages.memmap._meta import JOURNAL_FILE
from rbdata.storages.memmap._packed import PackedRow
from rbdata.storages.memmap._shared import Sharing

__all__ = ["WritePath"]

#: the storage's step that copies a journal transaction into its files (``MemmapStorage._apply``)
Apply = Callable[[int, WriteTarget, int, int, int, Plan], None]
#: the storage's step that readies the journal, a dead writer's transaction applied first
Ready = Callable[[], Journal]


class WritePath:
    """The journaled writes of a storage: its redo journal, packed row and write counts.

    Args:
        root: the storage directory (``journal.bin`` is created there on first use).
        capacity: the storage's capacity in items.
        header: the storage's header, published after every write.
        sharing: the storage's :class:`~rbdata.storages.memmap._shared.Sharing` (the counter).
        private: a copy-on-write storage: its writes never reach a file (no journal).

    Attributes:
        journal: the redo journal, ``None`` until the first overwrite of a live slot.
        row: the packed row writer of a small layout's per-step ``add`` (``None``: none).
        last_write: ``write_count`` just before and just after this process's last write.
        own: the items this process committed through ``commit``.
    """

    def __init__(
        self, root: Path, capacity: int, header: Header, sharing: Sharing, private: bool
    ) -> None:
        self.journal: Journal | None = None
        self.row: PackedRow | None = None
        self.last_write = (0, 0)
        self.own = 0
        self._root = root
        self._capacity = capacity
        self._header = header
        self._sharing = sharing
        self._private = private

    def bind_row(self, layout: Layout, unpack_flat: Any, arrays: list[np.ndarray] | None) -> None:
        """The packed row writer of ``layout`` over ``arrays`` (``None``: the rows unpacked)."""
        self.row = None
        if unpack_flat is not None and not self._private:
            self.row = PackedRow.for_storage(
                layout,
                unpack_flat,
                arrays,
                self._header.address(),
                self._sharing.state.local_counter(),
            )

    def open_journal(self, layout: Layout) -> Journal:
        """The journal, created (and locked shared) on first use; nothing applied."""
        journal = self.journal
        if journal is None:
            file = inside(self._root, JOURNAL_FILE)
            journal = self.journal = Journal(file, layout, self._capacity)
            journal.lock_shared()
        return journal

    def count(self, n: int, own: bool = False) -> None:
        """Count ``n`` items written (``own``: through ``commit``) after the header is published."""
        before = self._sharing.count(n)
        self.last_write = (before, before + n)
        if own:
            self.own += n

    def add_packed(self, row: PackedRow, flat: Any, slot: int, ready: Ready) -> None:
        """A packed item at ``slot`` through the journal's payload (scratch if uncommitted)."""
        journal = self.journal
        before = -1 if journal is None else journal.write_packed(row, flat, slot)
        if before < 0:  # first use, or a transaction to finish first
            before = ready().write_packed(row, flat, slot)
            assert before >= 0, "the journal is empty after _ready_journal"
        self.last_write = (before, before + 1)

    def write_row(self, arrays: list[Any], slot: int, values: list[Any], ready: Ready) -> None:
        """One item's values at ``slot``: journaled over a live slot, else written directly."""
        header = self._header
        length = header.length
        top = slot + 1
        new_length = top if top > length else length
        nxt = top if top < self._capacity else 0
        if slot < length and not self._private:  # an overwrite: through the journal
            journal = self.journal
            if journal is None or not journal.write_one(
                arrays, values, slot, new_length, nxt, header
            ):  # the first one (or after a failed write): lay the one-item plan out
                journal = ready()
                journal.begin(0, [slot, top], 1, new_length, nxt)
                written = journal.write_one(arrays, values, slot, new_length, nxt, header)
                assert written, "the one-item plan exists and nothing is committed"
        else:
            for arr, value in zip(arrays, values, strict=True):
                arr[slot] = value
            header.publish(new_length, nxt)
        self.count(1)

    def write_rows(
        self,
        start: int,
        n: int,
        values: list[Any],
        put_rows: Callable[[int, int, list[Any]], Any],
        ready: Ready,
    ) -> None:
        """``n`` rows per leaf at the ring slots from ``start`` (``put_rows`` stores them)."""
        header, cap = self._header, self._capacity
        length = header.length
        end = start + n
        new_length = max(length, min(end, cap))
        nxt = end % cap
        live = start < length or (end > cap and length > 0)
        if live and not self._private:  # overwrites: through the journal
            journal = self.journal
            if journal is None or journal.committed:
                journal = ready()
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
            put_rows(start, n, values)  # the rows the journal holds
            header.publish(new_length, nxt)
            journal.clear()
        else:
            put_rows(start, n, values)
            header.publish(new_length, nxt)
        self.count(n)

    def journaled(
        self,
        journal: Journal,
        arrays: list[np.ndarray] | None,
        target: WriteTarget,
        payload: list[Any],
        length: int,
        nxt: int,
        own: bool,
        apply: Apply,
    ) -> None:
        """A prepared write over live slots: journaled, committed, applied, cleared.

        ``own``: no other process may have written the journal (the storage is unshared).
        """
        one = target.item
        if one and arrays is not None:  # one item (add): the numpy path
            values = numpy_views(payload)
            if values is not None and journal.write_one(
                arrays, values, target.first, length, nxt, self._header, own=own
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
        apply(kind, target, target.n, length, nxt, plan)
        journal.clear()

    def apply(
        self,
        arrays: list[np.ndarray] | None,
        buffers: list[torch.Tensor],
        target: WriteTarget,
        length: int,
        nxt: int,
        plan: Plan,
    ) -> None:
        """Copy a journal transaction into ``arrays`` / ``buffers``, then publish its header."""
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
        self._header.publish(length, nxt)

    def flush(self) -> None:
        """``msync`` of the journal, if there is one."""
        if self.journal is not None:
            self.journal.flush()

    def close(self) -> None:
        """Drop the packed row and close the journal."""
        self.row = None
        if self.journal is not None:
            self.journal.close()
            self.journal = None
