"""A checkpoint's identity: a random 128-bit id bound to its directory and its files.

:func:`~rbdata.checkpoint.dump` draws the id, names the live directory ``ckpt-<id>``, records
it in ``checkpoint.json`` (``"id"``) and ends ``tensors.bin`` with a :func:`trailer` holding it;
the storage's files carry the storage directory's own id, which ``checkpoint.json`` records
in the storage's state. :func:`check_identity` compares them at every load, at O(1) cost (a
name and 32 bytes), so a ``checkpoint.json``, ``tensors.bin`` or whole ``ckpt-*`` directory
taken from another checkpoint is refused by default; ``verify=True`` adds the full
checksum pass. A checkpoint written before ids existed has no ``"id"`` and loads as before.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rbdata._core.files import open_nofollow
from rbdata._core.ids import TRAILER_BYTES, id_trailer, read_trailer
from rbdata.errors import CheckpointError

__all__ = ["check_identity", "check_trailer", "trailer"]

#: the kind of the trailer at the end of ``tensors.bin`` (:mod:`rbdata._core.ids`; index 0)
_MAGIC = b"RBDCKPT1"
_ID = re.compile(r"[0-9a-f]{32}")


def trailer(ident: str) -> bytes:
    """The last :data:`~rbdata._core.ids.TRAILER_BYTES` bytes of checkpoint ``ident``'s tensors."""
    return id_trailer(_MAGIC, ident)


def check_identity(live: Path, meta: dict[str, Any]) -> None:
    """Check that ``checkpoint.json`` is the one of directory ``live`` (its id names it).

    Raises:
        CheckpointError: if the directory or its ``checkpoint.json`` belongs to another
            checkpoint, or the id is corrupt. Nothing is checked for a checkpoint without an
            id (older rbdata).
    """
    if "id" not in meta:
        return
    file = live / "checkpoint.json"
    ident = meta["id"]
    if not isinstance(ident, str) or not _ID.fullmatch(ident):
        raise CheckpointError(f"{file}: field 'id' is {ident!r:.40}, expected 32 hex digits")
    if live.name != f"ckpt-{ident}":
        raise CheckpointError(
            f"{file}: the metadata of checkpoint ckpt-{ident}, found in {live.name}; the "
            "directory or its checkpoint.json was replaced by another checkpoint's"
        )


def check_trailer(meta: dict[str, Any], tensors: Path) -> None:
    """Check the id trailer of ``tensors`` (a plain file) against :func:`check_identity`'s id.

    Raises:
        CheckpointError: if ``tensors.bin`` belongs to another checkpoint or its trailer is
            corrupt.
    """
    if "id" not in meta:
        return
    ident = meta["id"]
    try:
        with open_nofollow(tensors, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            found = os.pread(f.fileno(), TRAILER_BYTES, max(0, size - TRAILER_BYTES))
    except OSError as err:
        raise CheckpointError(f"{tensors}: cannot be read ({err})") from err
    if found != trailer(ident):
        read = read_trailer(found, _MAGIC)
        other = None if read is None else read[0]
        why = f"holds the id of checkpoint ckpt-{other}" if other else "has no valid id trailer"
        raise CheckpointError(
            f"{tensors}: {why}, checkpoint.json says ckpt-{ident}; a file swapped in from "
            "another checkpoint, or corrupt"
        )
