"""An :class:`~rbdata.storages.ArrowStorage` dropped without ``close()`` writes its rows out.

Between flushes an ArrowStorage keeps its newest rows in memory (the open chunks) and in its
redo journal (``_journal.bin``), which only :meth:`ArrowStorage.open` reads: pyarrow, polars
and duckdb see the chunk files alone. Python's buffered files flush when they are dropped;
so does a storage, through :func:`flush_when_dropped`: when it is garbage-collected (``del``,
the last reference gone) or still alive at interpreter exit, its open chunks are written
to their files, the metadata published and the journal removed — what ``flush()`` does,
without the fsync (a dropped Python file is not fsync'ed either; the page cache survives
the process). A SIGKILL runs no finalizer: the journal still covers it, and ``open``
replays it.

The finalizer cannot hold the storage (it would never be collected), so it holds the
storage's attribute dict, which holds everything a flush needs, and runs the flush on a bare
instance that shares that dict. (So no attribute may refer back to the storage itself: it
would keep the storage alive until exit. ``tests/test_arrow_dropped.py`` checks that ``del``
flushes.) Nothing is flushed:

- after ``close()`` (it flushed already), or for a temporary directory (``path=None``, and a
  checkpoint's private copy), which is removed instead;
- for a copy that does not own the writes (unpickled in another process, or opened with
  ``recover=False``: it has no journal), and in a forked child, which inherits the
  finalizer but not the ownership;
- when the directory is gone (removed with its journal: nothing is left to keep).

A flush that fails (a full disk, a directory removed under the storage) warns and loses
nothing: the rows are in the journal, and the next ``open`` replays it.
"""

from __future__ import annotations

import os
import warnings
import weakref
from typing import Any

__all__ = ["flush_when_dropped"]


def flush_when_dropped(storage: Any) -> weakref.finalize:
    """Flush ``storage`` (an ArrowStorage that owns a journal) when it is collected or at exit.

    Returns the finalizer: call ``detach()`` on it when the storage is closed.
    """
    return weakref.finalize(storage, _flush_dropped, type(storage), storage.__dict__)


def _flush_dropped(cls: type[Any], state: dict[str, Any]) -> None:
    """Write the open chunks of a storage whose attributes are ``state`` (see the module)."""
    if (
        state.get("_closed", True)
        or state.get("_finalizer") is not None  # a temporary directory: removed, not flushed
        or state.get("_journal") is None  # a reading copy: the owner writes
        or state.get("_owner_pid") != os.getpid()  # a forked child
        or not os.path.isdir(state.get("_path", ""))  # removed: journal and all
    ):
        return
    bare = object.__new__(cls)
    bare.__dict__ = state
    try:
        bare._sync(fsync=False)
    except Exception as err:  # a finalizer cannot raise: say it, the journal keeps the rows
        path = state.get("_path")
        warnings.warn(
            f"ArrowStorage at {str(path)!r} was dropped without close() and its rows could "
            f"not be written to the chunk files ({type(err).__name__}: {err}); they are in "
            "its journal: ArrowStorage.open(path) recovers them",
            RuntimeWarning,
            stacklevel=1,
        )
