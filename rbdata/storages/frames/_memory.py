"""Where a :class:`~rbdata.storages.frames._pool.FramePool` keeps its arrays: :class:`FrameMemory`.

A pool holds raw frames (a tensor ``[slots, *frame]``) or a compressed byte log with a slot
table (``[slots, 2]`` int64: each slot's blob offset and length). It never allocates them
itself: it asks its *memory*, which makes, grows and compacts them.

* :class:`FrameMemory` (this module): process memory, the default. Zeroed memory is the
  kernel's zero pages (``calloc``), committed as frames land; growth copies; the log is
  compacted in place.
* :class:`~rbdata.storages.frames._files.FrameFiles`: the same arrays as files of a storage
  directory (``path=``), grown in place and compacted into a new generation of files.

Both have the same methods (:meth:`FrameMemory.frames`, :meth:`~FrameMemory.table`,
:meth:`~FrameMemory.log`, :meth:`~FrameMemory.compact`, :meth:`~FrameMemory.flush`,
:meth:`~FrameMemory.close`) and :attr:`~FrameMemory.compact_divisor`.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch

__all__ = ["FrameMemory", "pack", "take_rows", "zeros"]


def take_rows(frames: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``frames[index]`` as a new tensor; on the CPU by numpy, on one thread.

    ``torch.index_select`` of a batch of frames (~1 MB) takes torch's parallel path, which
    waits for a descheduled intra-op thread whenever another process keeps the cores busy
    (an env, a learner): 16 us quiet, ~2.6 ms median beside two busy processes on 2 cores.
    Numpy's copy stays at ~30 us.
    """
    if frames.device.type != "cpu" or index.device.type != "cpu" or frames.dtype == torch.bfloat16:
        return torch.index_select(frames, 0, index)
    return torch.from_numpy(frames.numpy()[index.numpy()])


def zeros(nbytes: int) -> np.ndarray:
    """Zeroed bytes committed as they are written (``calloc``: the kernel's zero pages)."""
    return np.zeros(max(nbytes, 1), np.uint8)


@numba.njit(nogil=True, cache=True)
def pack(src: Any, dst: Any, table: Any, order: Any, same: bool) -> int:
    """Copy the blobs of slots ``order`` (by ascending offset) to the start of ``dst``.

    ``table[s]`` (offset, length) is updated to the blob's new place; returns the bytes
    packed. ``same``: ``dst`` is ``src`` (compaction in place: a blob only moves down).
    """
    head = 0
    for s in order:
        start, n = table[s, 0], table[s, 1]
        if start != head or not same:
            dst[head : head + n] = src[start : start + n]  # memmove: head <= start
            table[s, 0] = head
        head += n
    return head


class FrameMemory:
    """A pool's arrays in process memory (see the module docstring).

    Args:
        frame_shape: one frame's shape.
        dtype: the frames' dtype.
        device: where raw frames live.
    """

    #: the log is compacted when at least ``1 / compact_divisor`` of it is dead, else grown
    compact_divisor = 16

    def __init__(
        self, frame_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> None:
        self.frame_shape = tuple(frame_shape)
        self.dtype = dtype
        self.device = device
        self.frame_bytes = int(np.prod(self.frame_shape, dtype=np.int64)) * dtype.itemsize

    def frames(self, old: torch.Tensor | None, slots: int, keep: int) -> torch.Tensor:
        """Raw frames ``[slots, *frame]`` holding the first ``keep`` rows of ``old``."""
        if self.device.type == "cpu":
            nbytes = slots * self.frame_bytes
            block = torch.from_numpy(zeros(nbytes)[:nbytes])
            new = block.view(self.dtype).view(slots, *self.frame_shape)
        else:
            new = torch.zeros((slots, *self.frame_shape), dtype=self.dtype, device=self.device)
        if old is not None and keep:
            new[:keep] = old[:keep]
        return new

    def table(self, old: np.ndarray | None, slots: int) -> np.ndarray:
        """A slot table ``[slots, 2]`` (int64 offset, length) holding ``old``'s rows."""
        new = np.zeros((slots, 2), np.int64)
        if old is not None:
            new[: old.shape[0]] = old
        return new

    def log(self, old: np.ndarray | None, size: int, keep: int) -> np.ndarray:
        """A byte log of ``size`` bytes holding the first ``keep`` bytes of ``old``."""
        new = zeros(size)
        if old is not None and keep:
            new[:keep] = old[:keep]
        return new

    def compact(
        self, log: np.ndarray, table: np.ndarray, order: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """The live blobs (slots ``order``, by offset) moved to the log's start, in place.

        Returns the log, the table (offsets updated) and the bytes now used.
        """
        return log, table, int(pack(log, log, table, order, True))

    def flush(self) -> None:
        """Nothing to write: the arrays are in memory."""

    def close(self) -> None:
        """Nothing to release (the arrays go with the pool)."""

    def for_copy(self) -> FrameMemory:
        """Where a copy of the pool (pickled) keeps its arrays: process memory."""
        return self
