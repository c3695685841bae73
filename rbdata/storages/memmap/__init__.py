"""The memory-mapped storage: one file per leaf, a journal for torn writes, shared across processes.

- :mod:`~rbdata.storages.memmap.storage`: :class:`MemmapStorage`, the map-style dataset:
  opening (validated, a committed journal replayed), pickling, closing, becoming shared;
- ``_directory``: the on-disk layout (``meta.json``, one ``.bin`` per leaf) and its writer;
- ``_writepath``: ``WritePath``, the crash-atomic write path (the journal's transactions, the
  per-step fast paths, this process's write counts);
- ``_header``: ``header.bin``, the double record published after every write;
- ``_journal``: the redo journal that makes a killed write replayable
  (``_journal_format``: its on-disk format);
- ``_rawfile``: opening, creating and mapping the raw files (no symlinks);
- ``_packed``: the numba row writer of the per-step ``add``;
- ``_shared``: the state shared by the processes of a shared storage (``SharedState``) and a
  storage's side of it (``Sharing``: the counter, the write lock, the slots' versions);
- ``_versions``: the per-slot seqlock words that let readers detect a torn row;
- ``_persist``: the persistence hooks of the tensor storages (checkpoint dump / restore as a
  memmap directory);
- ``_meta``: ``layout.json`` and ``header.bin`` read and checked without torch (what ``open``
  checks first, and ``describe`` for ``rbdata inspect``).

The names below are imported on first use: ``rbdata inspect`` imports ``_meta`` alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rbdata._core.lazy import lazy_names

if TYPE_CHECKING:
    from rbdata.storages.memmap._directory import DirectoryWriter
    from rbdata.storages.memmap.storage import MemmapStorage

__all__ = ["DirectoryWriter", "MemmapStorage"]

_LAZY = {
    "DirectoryWriter": "rbdata.storages.memmap._directory",
    "MemmapStorage": "rbdata.storages.memmap.storage",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
