"""A :class:`~rbdata.storages.FrameStackStorage` dumped: written, checked, described.

A checkpoint's ``storage/`` is what ``FrameStackStorage(path=...)`` writes (``_format.py``):
``frames.json``, ``steps/`` (the steps dumped by their own storage's hook) and ``frames/``
with the frames of slots ``[0, high)`` (compressed: the live blobs packed, generation 0).
Restoring opens it copy-on-write (``FrameStackStorage.open``), so the checkpoint never changes.

- :func:`write_frames`: ``frames.json`` and the frame files of a dump, checksummed;
- :func:`check_dumped`: every field and file against the metadata, before anything is mapped;
- :func:`dump_meta`, :func:`dump_dir`: a storage's dump, from its parts (steps, pool);
- :func:`state_of`, :func:`frames_of`: a storage's state dict, and its frames read back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rbdata._core.atomic import fsync_dir
from rbdata._core.checksum import crc32, entry, file_entry
from rbdata._core.files import inside, open_nofollow
from rbdata._core.ids import new_id
from rbdata._core.layout import Layout
from rbdata.errors import CheckpointError
from rbdata.storages._persist import check_dumped_dir
from rbdata.storages.base import Codec, Storage
from rbdata.storages.frames._format import (
    FRAMES_DIR,
    HEADER,
    META_FILE,
    STEPS_DIR,
    FramesMeta,
    check_files,
    header,
    read_frames_meta,
    write_frames_meta,
)
from rbdata.storages.frames._pool import FramePool
from rbdata.storages.memmap import MemmapStorage

__all__ = [
    "check_dumped",
    "dump_dir",
    "dump_meta",
    "frames_of",
    "state_of",
    "write_frames",
]


def write_frames(
    directory: Path, meta: FramesMeta, data: np.ndarray, table: np.ndarray, fsync: bool
) -> dict[str, dict[str, int]]:
    """Write ``frames.json`` and the frame files (:meth:`FramePool.export`'s ``data``, ``table``).

    Returns the checksum entries of the files written (names relative to ``directory``).
    """
    folder = directory / FRAMES_DIR
    folder.mkdir()
    names = meta.files()  # none before the first write
    parts = {"frames": data, "log": data, "table": table}
    sums = {}
    for kind in names:
        array = parts[kind]
        head = header(kind, meta.ident, meta.generation)
        body = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        with open_nofollow(folder / names[kind], "xb") as f:
            f.write(head)
            f.write(body.data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        size = HEADER + body.nbytes
        sums[f"{FRAMES_DIR}/{names[kind]}"] = entry(size, size, crc32(body, crc32(head)))
    fsync_dir(folder, fsync)
    write_frames_meta(directory, meta, fsync)
    sums[META_FILE] = file_entry(directory / META_FILE)
    return sums


def check_dumped(
    cls: type[Storage], directory: Path, config: dict[str, Any], state: Any, meta_file: Path
) -> tuple[int, FramesMeta]:
    """Check what a dump wrote (``frames.json``, ``steps/``, the frame files); the capacity."""
    check_dumped_dir(cls.__name__, directory, state, META_FILE)
    try:
        meta = read_frames_meta(directory)
    except (OSError, ValueError) as err:
        raise CheckpointError(str(err)) from None
    file = directory / META_FILE
    if state.get("id") != meta.ident:
        raise CheckpointError(
            f"{file}: a storage directory of another checkpoint ({META_FILE}'s id "
            f"{meta.ident}, {meta_file.name} recorded {state.get('id')!r:.40}); the folder "
            "was swapped or replaced"
        )
    saved = {
        "capacity": meta.capacity,
        "stack": meta.stack,
        "key": list(meta.key),
        "codec": meta.codec,
    }
    for key, value in saved.items():
        if key in config and config[key] != value:
            raise CheckpointError(
                f"{file}: {key}={value!r:.60}, the checkpoint's storage config says "
                f"{config[key]!r:.60}"
            )
    steps = inside(directory, STEPS_DIR, "steps directory")
    MemmapStorage.check_dump(steps, {"max_size": meta.capacity}, state.get("steps"), meta_file)
    check_files(directory, meta, None)
    return meta.capacity, meta


# --- the storage's hooks, over its parts ------------------------------------------------------
def dump_dir(
    directory: Path,
    meta: FramesMeta,
    steps: Storage,
    pool: FramePool | None,
    codec: Codec,
    tensors: list[torch.Tensor],
    fsync: bool,
) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
    """Write a storage directory: ``frames.json`` (``meta``), the steps (their hook), the frames.

    Returns the state a checkpoint records and the checksum entries of the files written.
    """
    directory.mkdir()
    saved, steps_sums = steps.dump(directory / STEPS_DIR, codec, tensors, fsync)
    data, table = (np.zeros(0, np.uint8), np.zeros((0, 2), np.int64))
    if pool is not None:
        data, table = pool.export()
    sums = write_frames(directory, meta, data, table, fsync)
    sums.update({f"{STEPS_DIR}/{name}": rec for name, rec in steps_sums.items()})
    fsync_dir(directory, fsync)
    return {"dir": directory.name, "id": meta.ident, "steps": saved}, sums


def dump_meta(config: dict[str, Any], layout: Layout | None, pool: FramePool | None) -> FramesMeta:
    """``frames.json`` of a dump of a storage (its ``config()``): a new id, generation 0."""
    live = 0 if pool is None else pool.live
    data = 0 if pool is None else pool.data_bytes
    key = tuple(config["key"])
    spec = None if layout is None else layout.spec()
    return FramesMeta(
        new_id(), config["capacity"], config["stack"], key, config["codec"], spec, 0, live, data
    )


def state_of(
    steps: Storage, layout: Layout | None, pool: FramePool | None, codec: Codec
) -> dict[str, Any]:
    """A storage's state dict: the layout, the steps' state, the frames (``uint8`` tensors)."""
    state: dict[str, Any] = {"steps": steps.dump_state(codec)}
    state["layout"] = None if layout is None else layout.to_json()
    if pool is not None:
        data, table = pool.export()
        state["frames"] = torch.from_numpy(data.copy())
        state["table"] = torch.from_numpy(table.copy())
    return state


def frames_of(state: Any) -> tuple[Layout, np.ndarray, np.ndarray] | None:
    """The layout and the frames (``data``, ``table``) of :func:`state_of`; ``None``: no layout."""
    raw = state["layout"]
    if raw is None:
        return None
    layout = Layout.from_json(raw)
    data, table = state["frames"], state["table"]
    if data.dtype != torch.uint8 or table.dtype != torch.int64 or table.dim() != 2:
        raise ValueError("'frames' must be uint8 and 'table' int64 [slots, 2]")
    return layout, data.numpy(), table.numpy()
