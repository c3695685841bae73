"""Up-front checks of a checkpoint's storage: its own ``check_dump`` hook, before anything.

:func:`check_storage` hands the storage class its directory inside the checkpoint, its config
and state: the class reads its own metadata (``layout.json`` of a memmap directory,
``_rbdata.json`` of an Arrow one) and checks every field and every file it names against the
files actually present, before anything is mapped, copied or allocated. The storages' own
``open`` checks again what it reads (the header's counts, the Arrow buffers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rbdata.checkpoint._format import DIR
from rbdata.storages.base import Storage

__all__ = ["DIR", "check_storage"]


def check_storage(cls: type[Storage], config: dict[str, Any], state: Any, root: Path) -> Any:
    """Check a storage's metadata and files under checkpoint directory ``root``.

    Nothing is allocated or mapped: every count, size and name is checked against the
    metadata and the files actually present (plain files inside the directory, no symlink).
    Returns what :func:`~rbdata.checkpoint._storages.restore_storage` needs: the capacity
    first (see :meth:`Storage.check_dump <rbdata.storages.Storage.check_dump>`).
    """
    return cls.check_dump(root / DIR, config, state, root / "checkpoint.json")
