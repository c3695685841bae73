"""How tensor storages are saved: as a :class:`MemmapStorage` directory, whole arrays.

- :func:`dump_tensors`: one raw file per leaf (the filled rows, then a sparse zero tail), the
  header and ``layout.json``, with the leaves' checksums summed from memory meanwhile;
- :func:`check_dumped`: the metadata and every file it names, before anything is mapped;
- :func:`open_dumped`: the files mapped copy-on-write by a :class:`MemmapStorage` (lazy;
  writes never reach them), for ``TensorStorage.restore``;
- ``describe``: in ``_meta`` (torch-free), :func:`~rbdata.storages.memmap._meta.describe_dir`.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rbdata._core.atomic import fsync_dir
from rbdata._core.checked import plain_file, read_json
from rbdata._core.checksum import entry, file_entry, submit_tensor_crc
from rbdata._core.ids import TRAILER_BYTES
from rbdata.errors import CheckpointError
from rbdata.storages._persist import check_dumped_dir, check_max_size
from rbdata.storages.base import Storage, storage_kind
from rbdata.storages.memmap._directory import (
    HEADER_FILE,
    LAYOUT_FILE,
    TensorSource,
    check_counts,
    check_meta,
    read_layout,
    storage_id,
    write_directory,
)

__all__ = [
    "check_dumped",
    "dump_tensors",
    "open_dumped",
]


def dump_tensors(
    storage: TensorSource, out: Path, fsync: bool
) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
    """``write_directory``, with the leaves' checksums summed from memory meanwhile."""
    n = len(storage)
    buffers = storage.buffers if storage.layout is not None else []
    # the CRC releases the GIL: the sums run while write_directory copies and fsyncs
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = [submit_tensor_crc(pool, buf, n) for buf in buffers]
        write_directory(storage, out, fsync)
        crcs = [result() for result in results]
    meta = read_json(out / LAYOUT_FILE, "storage")
    names = meta.get("files", []) if buffers else []
    sums: dict[str, dict[str, int]] = {}
    for name, buf, crc in zip(names, buffers, crcs, strict=True):
        row = math.prod(buf.shape[1:]) * buf.element_size()
        sums[name] = entry((out / name).stat().st_size, n * row, crc)
    for file in sorted(out.iterdir()):  # header, layout and anything else: small, read back
        if file.name not in sums:
            sums[file.name] = file_entry(file)
    fsync_dir(out, fsync)
    # the directory's id in the checkpoint's manifest: another storage/ is refused at load
    return {"dir": out.name, "id": meta["id"]}, sums


def check_dumped(
    cls: type[Storage], src: Path, config: dict[str, Any], state: Any
) -> tuple[int, list[str]]:
    """Check the metadata and files of a dumped directory; return the capacity."""
    check_dumped_dir(cls, src, state, LAYOUT_FILE)
    # layout.json is MemmapStorage's own format: its reader checks every field and file name
    file = src / LAYOUT_FILE
    try:
        meta = read_layout(src)
        capacity, layout, leaves = check_meta(src, meta)
        ident = storage_id(src, meta)
    except (OSError, ValueError) as err:
        raise CheckpointError(str(err)) from None
    saved = state.get("id")  # absent from checkpoints written before storage ids
    if saved is not None and saved != ident:
        raise CheckpointError(
            f"{src}: a storage directory of another checkpoint (layout.json's id {ident}, "
            f"checkpoint.json recorded {saved!r:.40}); the folder was swapped or replaced"
        )
    check_max_size(config, capacity, file)
    extra = TRAILER_BYTES if ident is not None else 0
    for leaf, path in zip(layout.leaves if layout else (), leaves, strict=True):
        row = leaf.numel * leaf.dtype.itemsize
        size = plain_file(path, "storage").st_size
        if size != capacity * row + extra:
            with_id = f" + a {extra}-byte id trailer" if extra else ""
            raise CheckpointError(
                f"{path}: {size} bytes on disk, expected {capacity * row + extra} ({capacity} "
                f"x {row} bytes{with_id}); truncated or corrupt"
            )
    # the header's format belongs to MemmapStorage: its counts are checked once it is open
    plain_file(src / HEADER_FILE, "storage")
    return capacity, []


def open_dumped(src: Path) -> Any:
    """The dumped directory opened copy-on-write (lazy; writes never reach it), counts checked.

    By the registered ``"memmap"`` kind (:class:`~rbdata.storages.MemmapStorage`), found
    through the kinds registry: this module is the tensor storages' format, which
    ``TensorStorage`` (the memmap storage's base) uses without importing its subclass.
    """
    memmap: Any = storage_kind("memmap")
    mapped = memmap.open(src, copy_on_write=True)
    try:
        check_counts(mapped, src)
    except CheckpointError:
        mapped.close()
        raise
    return mapped
