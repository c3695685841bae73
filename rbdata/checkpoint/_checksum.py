"""Per-file checksums of a checkpoint: computed while writing, checked by ``verify=True``.

``checkpoint.json`` holds ``"checksums": {"algorithm": "crc32", "files": {name: entry}}``
with one entry per file of the checkpoint (``"tensors.bin"``, ``"storage/<file>"``): its
``size`` in bytes, the number of leading bytes ``covered`` by the checksum, and their
``crc32``. ``covered`` is the whole file, except for the leaf files of a tensor storage that
is not full: there it is the rows that hold items (the sparse zero tail past the length is
never read as data; it is overwritten before it becomes readable).

CRC-32 (zlib, as in zip and PNG) is computed at several GB/s and releases the GIL, so the
leaves of a tensor storage are summed from memory in threads while they are being written.
It detects accidental corruption (every burst up to 32 bits, all but 2**-32 of the rest); it
is not a defence against someone who can also rewrite ``checkpoint.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rbdata._core.checksum import (
    ALGORITHM,
    copy_with_crc,
    crc32_combine,
    crc_blocks,
    crc_of_open,
    entry,
    file_entry,
    submit_tensor_crc,
    tensor_crc,
)
from rbdata._core.files import open_nofollow
from rbdata.checkpoint._validate import check_int, get_dict, get_int, plain_file
from rbdata.errors import CheckpointError

__all__ = [
    "ALGORITHM",
    "SMALL_FILE",
    "add_tails",
    "copy_with_crc",
    "crc32_combine",
    "crc_blocks",
    "entry",
    "file_entry",
    "submit_tensor_crc",
    "tensor_crc",
    "verify",
]


#: files up to this size are checked at every load, not only with ``verify=True``: the
#: headers and metadata of a storage (``header.bin``, ``layout.json``, ``_rbdata.json``...)
SMALL_FILE = 1 << 16
#: the most components of a file name in the checksum table (``storage/steps/leaf-000.bin``)
_DEPTH = 4


def _tail_crc(path: Path, covered: int) -> int:
    """The CRC-32 of the last :data:`SMALL_FILE` covered bytes of ``path`` (O(1))."""
    with open_nofollow(path, "rb") as f:
        f.seek(covered - SMALL_FILE)
        return crc_of_open(f, SMALL_FILE)


def add_tails(root: Path, files: dict[str, dict[str, int]]) -> None:
    """Add ``"tail"`` to the entries of files larger than :data:`SMALL_FILE`.

    The CRC-32 of the last :data:`SMALL_FILE` bytes the checksum covers, read back from the
    page cache right after the dump: a default load compares it (64 KiB a file), so a large
    file whose end differs (an Arrow chunk of another checkpoint) is refused without
    ``verify=True``.
    """
    for name, rec in files.items():
        if rec["size"] > SMALL_FILE and rec["covered"] >= SMALL_FILE:
            rec["tail"] = _tail_crc(root / name, rec["covered"])


def verify(live: Path, meta: dict[str, Any], meta_file: Path, max_size: int | None = None) -> None:
    """Check every file of checkpoint directory ``live`` against its recorded checksum.

    With ``max_size``, only the files the checkpoint recorded as at most that large are
    read (what a default load checks, at a cost that does not grow with the data); every
    file's size is still compared.

    Raises:
        CheckpointError: naming the first file that is missing, of another size or whose
            bytes differ; or if the checkpoint records no checksums (written by an rbdata
            older than ``verify``).
    """
    if "checksums" not in meta:
        raise CheckpointError(
            f"{meta_file}: this checkpoint has no checksums (written by an older rbdata), so "
            "verify=True cannot check it; load it with verify=False, or dumps it again"
        )
    table = get_dict(meta, "checksums", meta_file, "")
    if table.get("algorithm") != ALGORITHM:
        raise CheckpointError(
            f"{meta_file}: field 'checksums.algorithm' is {table.get('algorithm')!r:.40}, "
            f"expected {ALGORITHM!r}"
        )
    files = get_dict(table, "files", meta_file, "checksums")
    for name, rec in files.items():
        parts = name.split("/")  # storage/ may hold directories (a frame storage's steps/)
        if len(parts) > _DEPTH or (len(parts) > 1 and parts[0] != "storage"):
            raise CheckpointError(f"{meta_file}: field 'checksums.files': bad name {name!r:.80}")
        where = f"checksums.files.{name}"
        size = get_int(rec, "size", meta_file, where)
        covered = get_int(rec, "covered", meta_file, where, 0, size)
        expected = check_int(rec.get(ALGORITHM), meta_file, f"{where}.{ALGORITHM}", 0, 2**32 - 1)
        path = live
        for part in parts:  # each component a plain name, no symlink
            if part in ("", ".", "..") or "\\" in part or "\0" in part:
                raise CheckpointError(f"{meta_file}: field 'checksums.files': bad name {name!r}")
            path = path / part
            if path.is_symlink():
                raise CheckpointError(f"{path}: a symlink; checkpoint files may not be symlinks")
        actual = plain_file(path, "checksum table").st_size
        if actual != size:
            raise CheckpointError(
                f"{path}: {actual} bytes, the checkpoint recorded {size}; the file is corrupt"
            )
        if max_size is not None and size > max_size:
            tail = rec.get("tail")  # absent before tails, or for a short covered part
            if tail is not None and _tail_crc(path, covered) != tail:
                raise CheckpointError(
                    f"{path}: the checksum of its last {SMALL_FILE} bytes differs from the "
                    "one the checkpoint recorded; a file of another checkpoint, or corrupt"
                )
            continue
        with open_nofollow(path, "rb") as f:
            crc = crc_of_open(f, covered)
        if crc != expected:
            raise CheckpointError(
                f"{path}: checksum mismatch ({ALGORITHM} {crc:08x}, the checkpoint recorded "
                f"{expected:08x}); the file is corrupt"
            )
