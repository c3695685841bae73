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

import ctypes
import mmap
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rbdata._layout import Leaf

__all__ = [
    "ALIGN",
    "HUGE_MIN",
    "HUGE_PAGE",
    "Guard",
    "Mapping",
    "arena",
    "guard",
    "huge_block",
    "mapping",
    "moved",
    "rebind",
]

ALIGN = 64  #: bytes between the starts of two leaves in an arena (a cache line)
HUGE_PAGE = 2 << 20  #: bytes of an x86-64 / arm64 transparent huge page
#: the smallest arena put on huge pages: 4 KiB pages already reach a few MiB of random rows
#: from the TLB, and the block's alignment costs up to one huge page more (at most 1/8 here)
HUGE_MIN = 8 * HUGE_PAGE

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
    if total >= HUGE_MIN:
        block = huge_block(total)
    else:
        block = torch.zeros(max(total, 1), dtype=torch.uint8)
    return [
        block[start : start + size].view(leaf.dtype).view(capacity, *leaf.shape)
        for start, size, leaf in zip(starts, sizes, leaves, strict=True)
    ]


def huge_block(size: int) -> torch.Tensor:
    """A zeroed ``uint8`` tensor of ``size`` bytes, asked to be on transparent huge pages.

    The block starts on a :data:`HUGE_PAGE` boundary and its whole huge pages are advised
    ``MADV_HUGEPAGE`` before anything touches them, so that Linux backs them with 2 MiB
    pages where ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or
    ``madvise`` (the usual default). A sampled batch reads rows all over a large storage:
    with 4 KiB pages nearly every row is also a TLB miss (a page walk, dearer still in a
    virtual machine). Elsewhere, or where the kernel refuses, the advice does nothing and
    the block is ordinary memory. Torch owns the memory, up to one huge page more than
    ``size`` and all of it zeroed (a plain pickle of a view saves the whole memory: no stale
    bytes of the heap go with it), so pickling and ``share_memory_`` move it as any tensor's.

    Examples:
        >>> block = huge_block(3 << 20)
        >>> block.numel(), block.data_ptr() % HUGE_PAGE, int(block.sum())
        (3145728, 0, 0)
    """
    raw = torch.empty(size + HUGE_PAGE, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    block = raw[start : start + size]
    _advise_huge(block.data_ptr(), size - size % HUGE_PAGE)
    raw.zero_()  # after the advice: the first touch of each huge page
    return block


def _advise_huge(address: int, length: int) -> None:
    """``madvise(address, length, MADV_HUGEPAGE)`` on Linux; nothing elsewhere or on failure."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or length <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), ctypes.c_int(advice))
    except (OSError, AttributeError):  # no libc symbol: the advice is only advice
        return


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
    if len(buffers) != len(mapped):
        raise ValueError(f"{len(buffers)} buffers for {len(mapped)} mappings")
    any_moved = False
    for i, got in enumerate(mapped):  # no zip: this runs on every gather (~0.2 against 0.6 us)
        if got is not None and buffers[i].data_ptr() != got[1]:
            buf = buffers[i]
            buffers[i] = torch.from_numpy(got[0]).view(buf.dtype).view(buf.shape)
            any_moved = True
    return any_moved
