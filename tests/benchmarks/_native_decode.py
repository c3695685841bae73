"""Decode a batch of compressed frames in one native call: the GIL released once, both cores.

A Python loop over ``lz4.block.decompress`` pays ~1 us of interpreter work per frame (call,
``np.frombuffer``, the row copy) with the GIL held, about as much as the decode itself; two
Python threads then hand the GIL back and forth at every frame and end up slower than one.
Here a numba kernel loops over the batch (``prange``: numba's thread pool, GIL released)
and calls the C decoder directly through ``ctypes``:

- lz4: ``LZ4_decompress_safe`` as exported by the ``lz4`` package's own extension module
  (``lz4.block._block``: the same code that ``lz4.block.decompress`` runs);
- zstd: ``ZSTD_decompressDCtx`` of the system ``libzstd`` (``zstandard`` does not export its
  symbols), one decompression context per thread; ``None`` where no ``libzstd`` is found.

Compressed frames live back to back in one ``uint8`` arena with ``int64`` offsets (frame
``j`` is ``arena[offsets[j]:offsets[j + 1]]``), as a frame storage would keep them.
Benchmark support for ``bench_codecs.py`` (a prototype for the storage, not a library API).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["NativeBatch", "arena_of"]

Kernel = Callable[..., int]


def arena_of(blobs: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The compressed frames back to back, and their ``len + 1`` offsets."""
    offsets = np.zeros(len(blobs) + 1, np.int64)
    offsets[1:] = np.cumsum([len(b) for b in blobs])
    return np.frombuffer(b"".join(blobs), np.uint8), offsets


def _lz4_kernel() -> Kernel | None:
    try:
        import lz4.block._block as block
        import numba
    except ImportError:
        return None
    fn = ctypes.CDLL(block.__file__).LZ4_decompress_safe
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int

    @numba.njit(nogil=True, parallel=True)
    def decode(arena: Any, offsets: Any, idx: Any, out: Any, ctx: Any) -> int:
        bad = 0
        for i in numba.prange(idx.shape[0]):
            s, e = offsets[idx[i]], offsets[idx[i] + 1]
            if fn(arena[s:].ctypes.data, out[i].ctypes.data, e - s, out.shape[1]) != out.shape[1]:
                bad += 1
        return bad

    return decode


def _zstd_kernel() -> tuple[Kernel, np.ndarray] | None:
    path = ctypes.util.find_library("zstd")
    try:
        import numba
    except ImportError:
        return None
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    lib.ZSTD_createDCtx.restype = ctypes.c_void_p
    fn = lib.ZSTD_decompressDCtx
    fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_size_t
    contexts = np.array([lib.ZSTD_createDCtx() for _ in range(2)], np.uint64)  # kept: 2 x ~100 KB

    @numba.njit(nogil=True, parallel=True)
    def decode(arena: Any, offsets: Any, idx: Any, out: Any, ctx: Any) -> int:
        n, parts, bad = idx.shape[0], ctx.shape[0], 0
        for c in numba.prange(parts):  # one context per part: a DCtx is not thread-safe
            for i in range(c * n // parts, (c + 1) * n // parts):
                s, e = offsets[idx[i]], offsets[idx[i] + 1]
                got = fn(ctx[c], out[i].ctypes.data, out.shape[1], arena[s:].ctypes.data, e - s)
                if got != out.shape[1]:
                    bad += 1
        return bad

    return decode, contexts


class NativeBatch:
    """Frames compressed by one codec, decoded a batch at a time by a native kernel.

    Args:
        codec: ``"lz4"`` (lz4 block, no stored size) or ``"zstd"`` (zstd frames).
        blobs: the compressed frames.

    Raises:
        RuntimeError: if the kernel cannot be built here (no numba, no ``libzstd``).
    """

    def __init__(self, codec: str, blobs: Sequence[bytes]) -> None:
        if codec == "lz4":
            kernel, contexts = _lz4_kernel(), np.zeros(2, np.uint64)
        else:
            got = _zstd_kernel()
            kernel, contexts = got if got is not None else (None, np.zeros(0, np.uint64))
        if kernel is None:
            raise RuntimeError(f"no native {codec} decoder here (numba, or libzstd, missing)")
        self.kernel, self.contexts = kernel, contexts
        self.arena, self.offsets = arena_of(blobs)

    def decode(self, idx: np.ndarray, out: np.ndarray, threads: int) -> None:
        """Decode frames ``idx`` into the rows of ``out`` (``[len(idx), raw bytes]``)."""
        import numba

        numba.set_num_threads(threads)
        if self.kernel(self.arena, self.offsets, idx, out, self.contexts[:threads]):
            raise ValueError("a frame did not decode to its size (corrupt or mismatched)")
