"""The Arrow storage: items as Arrow IPC chunks on disk, memory-mapped for reading.

- :mod:`~rbdata.storages.arrow.storage`: :class:`ArrowStorage`, the map-style dataset;
- ``_lifecycle``: opening, finalizing and closing the directory (metadata, dropped storages);
- ``_chunks``: the chunk cache (open chunks in memory, sealing to files, mapped writes);
- ``_gather``: the batch gather (one numba kernel over the chunks, ragged and string leaves);
- ``_journal``: the write journal of a storage being filled;
- ``_records``: the journal's records (a write as bytes, and back);
- ``_items``: converting items (ragged leaves, strings) to and from Arrow arrays;
- ``_checks``: the on-disk format checks (of ``open``, and of the persistence hooks);
- ``_persist``: the persistence hooks (checkpoint dump / restore, ``describe`` for
  ``rbdata inspect``, conversion).
"""

from rbdata.storages.arrow.storage import ArrowStorage

__all__ = ["ArrowStorage"]
