"""Write a stream of row blocks into a new storage directory, with bounded memory.

A converter (D4RL, Minari) yields *blocks*: dicts from flat key tuples (``("next",
"reward")``) to arrays whose leading dimension is the block's rows, in file order. The first
block fixes the layout; every block is validated against it before it is written. Memory holds
one block at a time: a memmap storage is written front to back with plain file writes
(:class:`~rbdata.storages.DirectoryWriter`), an Arrow storage chunk by chunk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from rbdata._core.layout import Key, Layout
from rbdata.storages import DirectoryWriter
from rbdata.storages.arrow import ArrowStorage

__all__ = ["Block", "write_blocks"]

#: One block of rows: flat key tuples to arrays (or tensors) with the rows as leading dim.
Block = Mapping[Key, Any]


def _as_tensor(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if not value.flags.writeable:  # torch warns on read-only arrays (e.g. from Arrow)
            return torch.from_numpy(value.copy())
        return torch.from_numpy(np.ascontiguousarray(value))
    return value


def write_blocks(
    blocks: Iterable[Block],
    rows: int,
    path: Path,
    backend: str,
    *,
    desc: str = "converting",
    progress: bool = True,
) -> Layout:
    """Write ``rows`` rows from ``blocks`` into a new ``backend`` storage at ``path``.

    Args:
        blocks: the row blocks, in order; together exactly ``rows`` rows.
        rows: the number of rows (the storage's capacity).
        path: the new storage directory.
        backend: ``"memmap"`` or ``"arrow"``.
        desc: label of the progress bar.
        progress: show a progress bar (tqdm, on stderr).

    Returns:
        The layout of the rows.

    Raises:
        ValueError: the blocks do not add up to ``rows`` rows, or a block's keys, shapes or
            dtypes differ from the first block's.
    """
    if rows <= 0:
        raise ValueError(f"the dataset has no transitions ({rows} rows)")
    layout: Layout | None = None
    writer: DirectoryWriter | ArrowStorage | None = None
    written = 0
    bar = tqdm(total=rows, desc=desc, unit="rows", unit_scale=True, disable=not progress)
    try:
        for block in blocks:
            data = {key: _as_tensor(value) for key, value in block.items()}
            if layout is None:
                layout = Layout.from_data(data, batched=True)
                if backend == "memmap":
                    writer = DirectoryWriter(path, rows, layout)
                else:
                    writer = ArrowStorage(rows, path=path)
            tensors, n = layout.split(data, batched=True)
            if written + n > rows:
                raise ValueError(f"the converter gave more than the {rows} rows it announced")
            for t, leaf in zip(tensors, layout.leaves, strict=True):
                if t.dtype != leaf.dtype:  # split lets safe casts through: store exactly
                    raise ValueError(f"key {leaf.name}: dtype {t.dtype}, expected {leaf.dtype}")
            if isinstance(writer, DirectoryWriter):
                writer.write(tensors)
            elif writer is not None:
                writer.set(slice(written, written + n), data)
            written += n
            bar.update(n)
        if written != rows or writer is None or layout is None:
            raise ValueError(f"the converter gave {written} rows, announced {rows}")
        writer.close()
        writer = None
        return layout
    finally:
        bar.close()
        if writer is not None:  # failed midway: release the files, the caller removes them
            with contextlib.suppress(Exception):
                if isinstance(writer, DirectoryWriter):
                    writer.abort()
                else:
                    writer.abort()
