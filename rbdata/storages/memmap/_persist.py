"""How tensor storages are saved: as a :class:`MemmapStorage` directory, whole arrays.

- :func:`dump_tensors`: one raw file per leaf (the filled rows, then a sparse zero tail), the
  header and ``layout.json``, with the leaves' checksums summed from memory meanwhile;
- ``check_dump``: in ``_meta`` (torch-free), :func:`~rbdata.storages.memmap._meta.check_dumped`;
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
from rbdata._core.checked import read_json
from rbdata._core.checksum import entry, file_entry, submit_tensor_crc
from rbdata.errors import CheckpointError
from rbdata.storages.base import storage_kind
from rbdata.storages.memmap._directory import TensorSource, check_counts, write_directory
from rbdata.storages.memmap._meta import LAYOUT_FILE

__all__ = [
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
