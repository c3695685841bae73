"""The one writer process of an :class:`~rbdata.storages.ArrowStorage` directory.

An ArrowStorage has one writer: its journal and its open chunks are in that process alone.
:class:`WriterHold` is that process's hold on the directory (``_holders.bin``, see
:mod:`rbdata._core.holders`): a second writer — another process, or another storage object of
this one — is refused with :class:`~rbdata.errors.StorageInUseError`, while reading copies
(pickled, ``open(path, recover=False)``) take no hold.

It also knows whether copies read the chunk files (:attr:`WriterHold.readers`): once the
storage is pickled or the process forks, the copies map the files, so the writer stops
changing a chunk file in place (a row there could be read half old, half new) and rewrites
the chunk whole, then replaces the file, which leaves a copy's mapping as it was.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

from rbdata._core.holders import Holders

__all__ = ["HOLDERS_FILE", "ONE_WRITER", "WriterHold"]

#: who holds the directory: a name ``pyarrow.dataset`` skips, like the storage's own files
HOLDERS_FILE = "_holders.bin"
#: the refusal's advice when a second writer opens an ArrowStorage
ONE_WRITER = (
    "An ArrowStorage has one writer process: close it there first, or send that storage "
    "object to this process (a pickled copy reads it), or use a MemmapStorage, which many "
    "processes may write at once"
)


class WriterHold:
    """This process's hold on an Arrow storage directory, as its one writer.

    Args:
        root: the storage directory.

    Raises:
        StorageInUseError: another process, or another object here, writes the directory.
    """

    def __init__(self, root: Path) -> None:
        self._holders: Holders | None = Holders(
            root, "ArrowStorage", advice=ONE_WRITER, name=HOLDERS_FILE
        )
        #: whether copies in other processes may map the chunk files (pickled, forked)
        self.readers = False
        _LIVE.add(self)

    def close(self) -> None:
        """Drop the hold: another process may then open the directory for writing."""
        holders, self._holders = self._holders, None
        if holders is not None:
            holders.close()


_LIVE: weakref.WeakSet[WriterHold] = weakref.WeakSet()


def _before_fork() -> None:
    """A forked child maps every chunk file its parent maps: it reads them."""
    for hold in list(_LIVE):
        hold.readers = True


def _in_child() -> None:
    """A forked child writes none of its parent's storages: its descriptors of the holds go.

    The parent's hold stays (a ``flock`` lives while any descriptor of it is open).
    """
    for hold in list(_LIVE):
        hold.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_in_child)
