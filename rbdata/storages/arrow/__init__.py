"""The Arrow storage: items as Arrow IPC chunks on disk, memory-mapped for reading.

- :mod:`~rbdata.storages.arrow.storage`: :class:`ArrowStorage`, the map-style dataset, with
  its lifecycle (opening, replaying the journal, the metadata, flushing a dropped storage)
  and its persistence hooks in its class body;
- ``_chunks``: :class:`ChunkCache`, the chunks of a storage (open chunks in memory, sealing to
  files, mapped in-place writes) and the batch gather over them (one numba kernel);
- ``_journal``: :class:`Journal`, the redo journal of a storage being filled (a write's
  record as bytes, and back for the replay);
- ``_items``: converting items (ragged leaves, strings) to and from Arrow arrays, and
  :class:`Columns`, a layout's leaves as a chunk keeps them;
- ``_checks``: the on-disk format (file names) and its checks (of ``open``, and of the
  persistence hooks);
- ``_writer``: the one writer's hold on a directory;
- ``_persist``: the dump format behind the persistence hooks, as functions over paths and
  checkpoint state (the files to copy, a dump's checks, a restore's own directory);
- ``_meta``: ``_rbdata.json`` read and checked without torch (what ``open`` checks first),
  its file names, and ``describe`` for ``rbdata inspect``.

The name below is imported on first use: ``rbdata inspect`` imports ``_meta`` alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rbdata._core.lazy import lazy_names

if TYPE_CHECKING:
    from rbdata.storages.arrow.storage import ArrowStorage

__all__ = ["ArrowStorage"]


__getattr__, __dir__ = lazy_names(
    __name__, {"ArrowStorage": "rbdata.storages.arrow.storage"}, globals()
)
