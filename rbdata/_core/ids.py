"""Random ids that bind files to the storage or checkpoint they belong to.

A storage directory and a checkpoint each draw an id (:func:`new_id`); their files end with
a 32-byte trailer (:func:`id_trailer`): an 8-byte magic naming the kind of file, the 16-byte
id and an 8-byte index (a memmap leaf's position; 0 where there is one file of the kind).
Opening compares the trailer with the id the metadata names (:func:`read_trailer`), at O(1)
cost: a file swapped in from another storage or checkpoint is refused.
"""

from __future__ import annotations

import secrets

__all__ = ["TRAILER_BYTES", "id_trailer", "new_id", "read_trailer"]

TRAILER_BYTES = 32  #: magic (8 bytes), the id (16), the index (8, little-endian)


def new_id() -> str:
    """A new id: 128 random bits as 32 lowercase hex digits."""
    return secrets.token_hex(16)


def id_trailer(magic: bytes, ident: str, index: int = 0) -> bytes:
    """The trailer of a file of kind ``magic`` (8 bytes) with id ``ident`` at ``index``.

    Examples:
        >>> t = id_trailer(b"EXAMPLE1", "00" * 15 + "2a", 3)
        >>> len(t), read_trailer(t, b"EXAMPLE1")
        (32, ('0000000000000000000000000000002a', 3))
    """
    return magic + bytes.fromhex(ident) + index.to_bytes(8, "little")


def read_trailer(found: bytes, magic: bytes) -> tuple[str, int] | None:
    """The id and index of ``found`` if it is a trailer of kind ``magic``, else ``None``."""
    if len(found) != TRAILER_BYTES or found[:8] != magic:
        return None
    return found[8:24].hex(), int.from_bytes(found[24:], "little")
