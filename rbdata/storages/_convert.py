"""Convert a storage between the on-disk formats (:class:`MemmapStorage`, :class:`ArrowStorage`).

:func:`convert` streams the source block by block: it reads at most ``chunk_size`` slots at a
time (one vectorised ``__getitems__``) and writes them to the same slots of the destination,
so memory holds one block, never the whole source. Slot order, the filled length and the
slot after the last write (:attr:`~rbdata.storages.Storage.next_slot`) are kept, so a ring
buffer over the converted storage continues where the source's writer was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, cast

from rbdata._core.layout import Layout
from rbdata.storages.arrow import ArrowStorage
from rbdata.storages.base import Storage, copy_rows, storage_kind, storage_kinds
from rbdata.storages.memmap import MemmapStorage
from rbdata.storages.tensor import TensorStorage

__all__ = ["convert"]

#: rows of a default block, and the bytes a default block may take (whichever is smaller)
_DEFAULT_ROWS = 1 << 16
_DEFAULT_BYTES = 1 << 28


def _destination_class(dst_kind: Any) -> type[Storage]:
    """The registered on-disk kind named ``dst_kind``, or a subclass of one."""
    kinds = storage_kinds()
    if isinstance(dst_kind, type):
        if any(issubclass(dst_kind, cls) for cls in kinds.values()):
            return dst_kind
    elif isinstance(dst_kind, str) and (cls := storage_kind(dst_kind)) is not None:
        return cls
    names = ", ".join(f"{kind!r}" for kind in kinds)
    classes = " or ".join(cls.__name__ for cls in kinds.values())
    raise ValueError(f"dst_kind must be {names}, {classes}, got {dst_kind!r}")


def _check_chunk_size(chunk_size: int | None) -> None:
    if chunk_size is None:
        return
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")


def _block_rows(chunk_size: int | None, src: Storage, dst: Storage, layout: Layout) -> int:
    if chunk_size is not None:
        return chunk_size
    # one destination chunk file per block, else one source chunk per block
    preferred = dst.block_rows or src.block_rows
    if preferred is not None:
        return preferred
    return max(1, min(_DEFAULT_ROWS, _DEFAULT_BYTES // max(1, layout.item_nbytes)))


def convert(
    src: Storage,
    dst_kind: str | type[MemmapStorage] | type[ArrowStorage],
    path: str | os.PathLike[str] | None = None,
    *,
    chunk_size: int | None = None,
) -> MemmapStorage | ArrowStorage:
    """Copy ``src`` into a new :class:`MemmapStorage` or :class:`ArrowStorage`, block by block.

    The destination has the source's capacity, layout, items (slot by slot), length and
    :attr:`~rbdata.storages.Storage.next_slot`. Reads take at most ``chunk_size`` slots at a
    time, so the source is never loaded whole; the destination is flushed at the end (the
    files of an :class:`ArrowStorage` are then plain Arrow, and :meth:`ArrowStorage.open`
    reopens them). The source is only read. An empty source gives an
    empty destination without a layout (its first write fixes one).

    Args:
        src: a :class:`TensorStorage` (CPU or CUDA), :class:`MemmapStorage` or
            :class:`ArrowStorage`.
        dst_kind: ``"memmap"`` or ``"arrow"`` (or the class, a subclass of either).
        path: directory of the destination; ``None`` makes a temporary directory that is
            removed when the destination is closed or garbage-collected. An explicit path
            must be empty or absent (see the storages).
        chunk_size: the most slots read and written at once. For an Arrow destination it
            is also the rows per chunk file. ``None``: the destination's chunk size for
            ``"arrow"``, else the source's chunk size for an Arrow source, else up to
            65536 slots (fewer for items over 4 KiB: a block is at most 256 MiB).

    Returns:
        The new storage, open read/write.

    Raises:
        TypeError: if ``src`` is not a tensor, memmap or Arrow storage, or if it holds a key
            the destination cannot store (strings or ragged tensors for ``"memmap"``, a dtype
            Arrow lacks for ``"arrow"``); nothing is created then.
        ValueError: for an unknown ``dst_kind`` or a bad ``chunk_size``.
        FileExistsError: if ``path`` already holds files.

    Examples:
        >>> import torch
        >>> from rbdata.storages import ArrowStorage, MemmapStorage, convert
        >>> src = MemmapStorage(6)
        >>> src.set(slice(0, 6), {"obs": torch.arange(12.0).view(6, 2)})
        >>> src.set(slice(0, 2), {"obs": -torch.ones(2, 2)})  # a ring writer wrapped around
        >>> arrow = convert(src, "arrow", chunk_size=4)
        >>> len(arrow), arrow.next_slot, arrow.chunk_size
        (6, 2, 4)
        >>> arrow[[0, 5]]["obs"].tolist()
        [[-1.0, -1.0], [10.0, 11.0]]
        >>> back = convert(arrow, "memmap")
        >>> torch.equal(back[:]["obs"], src[:]["obs"]), back.next_slot
        (True, 2)
        >>> ragged = ArrowStorage(4)
        >>> ragged.set(slice(0, 2), {"boxes": [torch.ones(2, 4), torch.ones(1, 4)]})
        >>> convert(ragged, "memmap")
        Traceback (most recent call last):
        ...
        TypeError: key 'boxes': MemmapStorage keeps fixed-shape tensors only, ...
        >>> for s in (src, arrow, back, ragged):
        ...     s.close()
    """
    if not isinstance(src, (TensorStorage, ArrowStorage)):
        raise TypeError(
            f"src must be a TensorStorage, MemmapStorage or ArrowStorage, got {type(src).__name__}"
        )
    cls = _destination_class(dst_kind)
    length, next_slot = len(src), src.next_slot
    layout = src.layout
    if layout is not None:  # refused before anything is created
        cls.check_layout(layout)
    _check_chunk_size(chunk_size)

    root = None if path is None else Path(path)
    existed = root is not None and root.exists()
    dst = cast("MemmapStorage | ArrowStorage", cls.empty_like(src, path, block_rows=chunk_size))
    try:
        if layout is not None and length:
            copy_rows(src, dst, length, _block_rows(chunk_size, src, dst, layout))
            if dst.layout != layout:  # pragma: no cover - the blocks keep the source's layout
                raise RuntimeError(f"converted layout {dst.layout} differs from {layout}")
        # the writes above filled slots [0, length): the length is the source's already
        dst._set_next(next_slot)
        dst.flush()
    except BaseException:
        with contextlib.suppress(Exception):
            dst.close()
        if root is not None:  # the path was empty or absent before: leave it so again
            if existed:
                for child in root.iterdir():
                    if child.is_dir():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
            else:
                shutil.rmtree(root, ignore_errors=True)
        raise
    return dst
