"""Memory that can move under a storage: one arena per storage, and the guard that notices.

The per-step write paths keep numpy views (and numba kernels raw addresses) of the storage's
buffers: a numpy row assignment costs about half of torch's ``buf[i] = t``. But torch can move
a CPU tensor's memory behind such a view, in place, without telling anyone:

- pickling through ``multiprocessing`` (``ForkingPickler``: a spawn or forkserver
  ``DataLoader`` worker, a ``multiprocessing.Queue``) and ``share_memory_()`` copy the storage
  into new shared memory and free the old block: a view of the old block then writes into freed
  memory (heap corruption) and the write is lost to every reader;
- the same happens to a file-backed tensor (``torch.from_numpy`` of a mapping): torch copies
  it into shared memory, and the file no longer receives torch's writes.

Two rules keep every cached view valid:

1. **Views follow torch** for tensors torch allocated (:class:`~rbdata.storages.TensorStorage`,
   copy-on-write storages after a pickle): :func:`guard` records the data pointer of one
   tensor per distinct block of memory, and the write paths compare it before using a view
   (about 80 ns per block). :func:`arena` puts all of a storage's leaves in one block, so the
   whole check is one comparison; after a move the views are rebuilt on the new block, which
   is then the shared one other processes see.
2. **Torch follows the file** for mapped storages (:class:`~rbdata.storages.MemmapStorage`):
   the storage holds the mapping's numpy array itself, so its numpy views and the kernels'
   addresses stay valid until ``close``; the torch tensors are re-bound to the mapping by the
   torch paths (gathers, torch writes, ``buffers``) when :func:`moved` says they left it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rbdata._layout import Leaf

__all__ = ["ALIGN", "Guard", "Mapping", "arena", "guard", "mapping", "moved", "rebind"]

ALIGN = 64  #: bytes between the starts of two leaves in an arena (a cache line)

Guard = tuple[tuple[torch.Tensor, int], ...]


def arena(capacity: int, leaves: Sequence[Leaf]) -> list[torch.Tensor]:
    """Zeroed CPU buffers ``[capacity, *leaf.shape]``, one per leaf, all views of one block.

    One block means one data pointer to watch (:func:`guard`), and one move for all leaves
    when torch shares the memory.

    Examples:
        >>> import torch
        >>> from rbdata._layout import Leaf
        >>> leaves = [Leaf("a", (2,), torch.float32), Leaf("b", (), torch.bool)]
        >>> bufs = arena(5, leaves)
        >>> [tuple(b.shape) for b in bufs], len(guard(bufs))
        ([(5, 2), (5,)], 1)
    """
    sizes = [capacity * leaf.numel * leaf.dtype.itemsize for leaf in leaves]
    starts, total = [], 0
    for size in sizes:
        starts.append(total)
        total += -(-size // ALIGN) * ALIGN
    block = torch.zeros(max(total, 1), dtype=torch.uint8)
    return [
        block[start : start + size].view(leaf.dtype).view(capacity, *leaf.shape)
        for start, size, leaf in zip(starts, sizes, leaves, strict=True)
    ]


def guard(tensors: Sequence[torch.Tensor]) -> Guard:
    """One ``(tensor, data_ptr)`` per distinct block of memory under ``tensors``.

    A block is watched through the first tensor found on it; empty tensors have nothing
    to watch.
    """
    seen: dict[int, torch.Tensor] = {}
    for t in tensors:
        block = t.untyped_storage()
        if block.nbytes():
            seen.setdefault(block.data_ptr(), t)
    return tuple((t, t.data_ptr()) for t in seen.values())


def moved(watch: Guard) -> bool:
    """Whether torch moved any block since :func:`guard` looked (a pickle, ``share_memory_``).

    Examples:
        >>> import io, torch
        >>> from multiprocessing.reduction import ForkingPickler
        >>> t = torch.zeros(4)
        >>> watch = guard([t])
        >>> moved(watch)
        False
        >>> ForkingPickler(io.BytesIO()).dump(t)  # torch moves it to shared memory
        >>> moved(watch)
        True
    """
    return any(t.data_ptr() != ptr for t, ptr in watch)


Mapping = tuple[np.ndarray[Any, Any], int]


def mapping(raw: np.ndarray[Any, Any]) -> Mapping:
    """``raw`` (a ``uint8`` numpy array over a file mapping) and its address, for :func:`rebind`."""
    return raw, int(raw.__array_interface__["data"][0])


def rebind(buffers: list[torch.Tensor], mapped: Sequence[Mapping | None]) -> bool:
    """Point every tensor of ``buffers`` that left its mapping back at it (in place).

    ``mapped[i]``: leaf ``i``'s :func:`mapping` (``None``: an empty leaf, nothing mapped).
    What a move copied elsewhere is left to whoever holds it. Returns whether any moved.
    """
    any_moved = False
    for i, (buf, got) in enumerate(zip(buffers, mapped, strict=True)):
        if got is not None and buf.data_ptr() != got[1]:
            buffers[i] = torch.from_numpy(got[0]).view(buf.dtype).view(buf.shape)
            any_moved = True
    return any_moved
