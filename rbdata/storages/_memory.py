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

A move is a copy, and a write made while torch copies lands in the block being left: it is
lost. So a storage that follows torch keeps one lock (:func:`move_lock`) that every write path
holds from its pointer check to its last byte, and pickling moves the memory itself under
that lock (:class:`Shipment`), before torch's reducers see it. A plain pickle (also
``copy.deepcopy``, ``cloudpickle``) moves nothing: it sends one copy of each leaf's bytes,
taken under the lock, and loads as one new arena.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from rbdata._core.layout import Layout, Leaf

__all__ = [
    "ALIGN",
    "HUGE_MIN",
    "HUGE_PAGE",
    "LAZY_MIN",
    "Guard",
    "Mapping",
    "Shipment",
    "arena",
    "bind",
    "guard",
    "huge_block",
    "lazy_block",
    "mapping",
    "move_lock",
    "moved",
    "rebind",
    "received",
    "share",
    "ship",
    "unpack_arena",
]

ALIGN = 64  #: bytes between the starts of two leaves in an arena (a cache line)
HUGE_PAGE = 2 << 20  #: bytes of an x86-64 / arm64 transparent huge page
#: the smallest arena put on huge pages: 4 KiB pages already reach a few MiB of random rows
#: from the TLB, and the block's alignment costs up to one huge page more (at most 1/8 here)
HUGE_MIN = 8 * HUGE_PAGE
#: the smallest arena on a :func:`lazy_block`: below it, zero-filling costs less than the
#: mapping and its page faults, and commits at most this much before the first write
LAZY_MIN = 1 << 20

Guard = tuple[tuple[torch.Tensor, int], ...]


def arena(capacity: int, leaves: Sequence[Leaf]) -> list[torch.Tensor]:
    """Zeroed CPU buffers ``[capacity, *leaf.shape]``, one per leaf, all views of one block.

    One block means one data pointer to watch (:func:`guard`), and one move for all leaves
    when torch shares the memory. A block of :data:`LAZY_MIN` bytes or more is
    :func:`lazy_block` memory (from :data:`HUGE_MIN` up, a :func:`huge_block`): its pages are
    committed as they are first written, so a storage of any capacity costs only the memory
    its items fill (a 100k-step buffer of Atari frame stacks is 5.3 GiB of address space,
    ~60 MB resident after its first 1,000 steps). The first write into a page pays for
    committing it, as the zero-fill did for every page at once: on a 2-core VM, 3-5 ms per
    2 MiB huge page, so the first lap of ``add``s of 56 KB pixel transitions took ~155 us
    each (31 us on 4 KiB pages), ~10 us once the ring had wrapped.

    Examples:
        >>> import torch
        >>> from rbdata._core.layout import Leaf
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
    elif total >= LAZY_MIN:
        block = lazy_block(total)
    else:
        block = torch.zeros(max(total, 1), dtype=torch.uint8)
    return [
        block[start : start + size].view(leaf.dtype).view(capacity, *leaf.shape)
        for start, size, leaf in zip(starts, sizes, leaves, strict=True)
    ]


def lazy_block(size: int) -> torch.Tensor:
    """A zeroed ``uint8`` tensor of ``size`` bytes whose pages are committed when first written.

    The memory is an anonymous private mapping: the kernel guarantees its pages read as
    zeros and backs each one only at its first write, so nothing is filled up front (a
    ``torch.zeros`` writes, hence commits, every byte at once). Private, so a fork shares it
    copy-on-write as it does the heap. The tensor owns the mapping (unmapped when its
    storage is freed); pickling and ``share_memory_`` move it as any CPU tensor's memory
    (:func:`share`), and a plain pickle of a view saves the whole mapping, zeros where
    nothing was written: never stale bytes of the heap. Where anonymous mappings are not
    available (not a Unix), the block is ``torch.zeros``.

    Examples:
        >>> block = lazy_block(3 << 20)
        >>> block.numel(), block.data_ptr() % 4096, int(block.sum())
        (3145728, 0, 0)
    """
    return _zero_pages(size)[0]


def huge_block(size: int) -> torch.Tensor:
    """A :func:`lazy_block` of ``size`` bytes, asked to be on transparent huge pages.

    The block starts on a :data:`HUGE_PAGE` boundary and its whole huge pages are advised
    ``MADV_HUGEPAGE`` before anything touches them, so that Linux backs them with 2 MiB
    pages where ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or
    ``madvise`` (the usual default). A sampled batch reads rows all over a large storage:
    with 4 KiB pages nearly every row is also a TLB miss (a page walk, dearer still in a
    virtual machine). Elsewhere, or where the kernel refuses, the advice does nothing and
    the block is ordinary memory. The mapping is up to one huge page longer than ``size``
    (address space only: pages nobody writes are never committed), and the first write
    into each huge page commits that page.

    Examples:
        >>> block = huge_block(3 << 20)
        >>> block.numel(), block.data_ptr() % HUGE_PAGE, int(block.sum())
        (3145728, 0, 0)
    """
    raw, pages = _zero_pages(size + HUGE_PAGE)
    start = -raw.data_ptr() % HUGE_PAGE
    length = size - size % HUGE_PAGE
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if pages is not None and advice is not None and length > 0:
        with contextlib.suppress(OSError, ValueError):  # refused (no THP): only advice
            pages.madvise(advice, start, length)
    return raw[start : start + size]


def _zero_pages(size: int) -> tuple[torch.Tensor, mmap.mmap | None]:
    """``size`` zero bytes as a tensor over a new private anonymous mapping, and the mapping.

    ``(torch.zeros(size), None)`` where no such mapping can be made.
    """
    flags = getattr(mmap, "MAP_PRIVATE", None)
    if flags is None or size <= 0:  # pragma: no cover - Windows (or nothing to map)
        return torch.zeros(max(size, 1), dtype=torch.uint8), None
    try:
        pages = mmap.mmap(-1, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError:  # pragma: no cover - e.g. a vm.max_map_count reached: ordinary memory
        return torch.zeros(size, dtype=torch.uint8), None
    # the tensor holds a reference to the mapping: it is unmapped with the tensor's storage
    return torch.frombuffer(pages, dtype=torch.uint8), pages


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


def bind(
    buffers: Sequence[torch.Tensor], mapped: Sequence[Mapping | None] | None
) -> tuple[list[np.ndarray[Any, Any]] | None, Guard]:
    """Numpy views of CPU ``buffers`` for the write paths, and the guard that watches them.

    ``mapped``: the file mappings under the buffers (:func:`mapping`; ``None``: torch's
    memory). Views of a mapping are views of the mapping itself, which the storage holds:
    nothing to watch. ``(None, ())``: no views (a GPU buffer, a dtype numpy lacks).

    Examples:
        >>> import torch
        >>> views, watch = bind([torch.zeros(3), torch.zeros(3, dtype=torch.int64)], None)
        >>> [v.dtype.name for v in views], len(watch)
        (['float32', 'int64'], 2)
    """
    try:
        views = [b.numpy() for b in buffers]  # refused off the CPU
    except (RuntimeError, TypeError):  # e.g. bfloat16 has no numpy dtype
        return None, ()
    if mapped is None:
        return views, guard(buffers)
    return [
        v if got is None else got[0].view(v.dtype).reshape(v.shape)
        for v, got in zip(views, mapped, strict=True)
    ], ()


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


def move_lock() -> threading.RLock:
    """The lock a storage's write paths and the moves of its memory both hold (see above).

    Re-entrant: a write path may call another (a ``copy_from`` that commits); uncontended,
    it costs about as much as the pointer check it protects (~0.1 us).
    """
    return threading.RLock()


def share(buffers: Sequence[torch.Tensor]) -> None:
    """Move every distinct block under ``buffers`` to shared memory (in place, as torch does).

    Call it holding the buffers' :func:`move_lock`. A block already shared stays where it
    is, so that only the first pickle for another process moves the memory.

    Examples:
        >>> import torch
        >>> bufs = arena(4, [Leaf("a", (2,), torch.float32), Leaf("b", (), torch.int64)])
        >>> share(bufs)
        >>> [b.is_shared() for b in bufs], len(guard(bufs))
        ([True, True], 1)
    """
    for t, _ in guard(buffers):
        block = t.untyped_storage()
        if not block.is_shared():
            block.share_memory_()


class Shipment:
    """A storage's CPU buffers on their way into a pickle, with the lock their writers hold.

    What a storage's ``__getstate__`` puts in place of its buffer list; unpickled, it is a
    list of tensors again:

    - ``ForkingPickler`` (spawn and forkserver workers, ``multiprocessing`` queues): every
      block is moved to shared memory here, under ``lock`` (no write lost to the copy), and
      the leaves travel as torch's shared-memory handles: the receiver shares the memory;
    - any other pickler (``pickle``, ``copy.deepcopy``, ``cloudpickle``): one copy of each
      leaf's own bytes, taken under ``lock``; :func:`unpack_arena` loads them into one arena.

    Args:
        buffers: the leaves' CPU buffers, contiguous, ``[capacity, *leaf.shape]`` each.
        leaves: the leaves, in the order of ``buffers``.
        lock: the storage's :func:`move_lock`.

    Examples:
        >>> import pickle, torch
        >>> leaves = [Leaf("a", (2,), torch.float32), Leaf("b", (), torch.int64)]
        >>> bufs = arena(3, leaves)
        >>> bufs[1][2] = 7
        >>> got = pickle.loads(pickle.dumps(Shipment(bufs, leaves, move_lock())))
        >>> got[1].tolist(), len(guard(got))
        ([0, 0, 7], 1)
    """

    __slots__ = ("buffers", "leaves", "lock")

    def __init__(
        self, buffers: list[torch.Tensor], leaves: Sequence[Leaf], lock: threading.RLock
    ) -> None:
        if len(buffers) != len(leaves):
            raise ValueError(f"buffers: one per leaf, got {len(buffers)} for {len(leaves)}")
        self.buffers = buffers
        self.leaves = tuple(leaves)
        self.lock = lock

    def __reduce__(self) -> tuple[Any, ...]:
        """Plain pickle: the leaves' bytes once, copied under the lock."""
        parts = [b.reshape(-1).view(torch.uint8) for b in self.buffers]
        with self.lock:
            data = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
        capacity = self.buffers[0].shape[0] if self.buffers else 0
        return (unpack_arena, (capacity, self.leaves, data.numpy()))

    def reduce_for_process(self) -> tuple[Any, ...]:
        """``ForkingPickler``: the blocks moved to shared memory under the lock, then sent."""
        with self.lock:
            share(self.buffers)
        return (list, (self.buffers,))


ForkingPickler.register(Shipment, Shipment.reduce_for_process)


def ship(
    buffers: list[torch.Tensor], layout: Layout | None, lock: threading.RLock
) -> list[torch.Tensor] | Shipment:
    """What a storage pickles for ``buffers``: CPU ones as a :class:`Shipment`, others as is.

    A GPU storage's buffers travel as torch sends them (CUDA handles for another process).
    """
    if layout is None or not buffers or not all(b.is_cpu for b in buffers):
        return buffers
    return Shipment(buffers, layout.leaves, lock)


def received(buffers: list[torch.Tensor] | Shipment) -> list[torch.Tensor]:
    """The buffers a storage unpickled: a pickle gives a list, ``copy.copy`` the Shipment."""
    return buffers.buffers if isinstance(buffers, Shipment) else buffers


def unpack_arena(
    capacity: int, leaves: Sequence[Leaf], data: np.ndarray[Any, Any]
) -> list[torch.Tensor]:
    """A new :func:`arena` for ``leaves``, filled from the leaves' bytes back to back.

    Raises:
        ValueError: if ``data`` is not the size the leaves take.
    """
    buffers = arena(capacity, leaves)
    sizes = [b.numel() * b.element_size() for b in buffers]
    if data.dtype != np.uint8 or data.shape != (sum(sizes),):
        raise ValueError(
            f"data: {sum(sizes)} bytes for {capacity} items of {len(leaves)} leaves, "
            f"got {data.dtype} {data.shape}"
        )
    start = 0
    for buf, size in zip(buffers, sizes, strict=True):
        if size:
            buf.reshape(-1).view(torch.uint8).numpy()[:] = data[start : start + size]
        start += size
    return buffers
