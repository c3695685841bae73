"""Per-frame compression of a :class:`~rbdata.storages.FrameStackStorage`: :class:`FrameCodec`.

Frames are compressed one by one by the codec's own library (``lz4`` or ``zstandard``, the
``rbdata[pixels]`` extra), so any tool of that library reads them:

* ``"lz4"``: LZ4 *block* format (``lz4.block.compress(store_size=False)``);
* ``"zstd"`` (``("zstd", level)``, level 3 by default): one zstd frame each, content size
  included.

A batch is decoded in one ``numba`` call per thread, never frame by frame from Python: the
kernel calls the library's own C decoder (``LZ4_decompress_safe``, ``ZSTD_decompressDCtx``,
both exported by the wheels' extension modules) for each frame with the GIL released, and two
threads take half of the frames each when the batch is large enough to pay for the hand-over.
The decoders are the *safe* ones (they never read or write outside the bounds they are
given), and the kernel checks every blob's bounds against the stored bytes first: a damaged
blob raises ``ValueError``, it cannot crash the process. Where a wheel does not export the
decoder, the batch falls back to the library's Python API frame by frame (correct, slower).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numba
import numpy as np

from rbdata._core.native import voidptr
from rbdata._core.shown import shown
from rbdata.storages.frames._format import CODECS

__all__ = ["CODECS", "FrameCodec", "decode_threads"]

#: The codec names a ``FrameStackStorage`` takes.
_ZSTD_DEFAULT_LEVEL = 3
# frames per thread below which one thread decodes the whole batch (handing half of it over
# costs ~20 us: an lz4 decode takes ~0.5 us a frame, a zstd one ~2.5 us)
_SPLIT_MIN = {"lz4": 512, "zstd": 48}


def _c_function(path: str | None, name: str, restype: Any, argtypes: list[Any]) -> Any:
    """The C function ``name`` exported by the shared library at ``path``, or ``None``."""
    if path is None:
        return None
    try:
        fn = getattr(ctypes.CDLL(path), name)
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype, fn.argtypes = restype, argtypes
    return fn


def _lz4_kernel(fn: Any) -> Callable[..., int]:
    @numba.njit(nogil=True)
    def decode(src: Any, offsets: Any, lengths: Any, out: Any, ctx: int, first: int, last: int,
               size: int) -> int:  # fmt: skip
        n_src, a, b = src.shape[0], src.ctypes.data, out.ctypes.data
        for i in range(first, last):
            start, length = offsets[i], lengths[i]
            if start < 0 or length <= 0 or start + length > n_src:
                return i
            if fn(voidptr(a + start), voidptr(b + i * size), length, size) != size:
                return i
        return -1

    return decode


def _zstd_kernel(fn: Any) -> Callable[..., int]:
    @numba.njit(nogil=True)
    def decode(src: Any, offsets: Any, lengths: Any, out: Any, ctx: int, first: int, last: int,
               size: int) -> int:  # fmt: skip
        n_src, a, b = src.shape[0], src.ctypes.data, out.ctypes.data
        for i in range(first, last):
            start, length = offsets[i], lengths[i]
            if start < 0 or length <= 0 or start + length > n_src:
                return i
            if fn(voidptr(ctx), voidptr(b + i * size), size, voidptr(a + start), length) != size:
                return i
        return -1

    return decode


_KERNELS: dict[str, tuple[Any, Any]] = {}  # name -> (kernel or None, library module)
_KERNELS_LOCK = threading.Lock()


def _kernel(name: str) -> tuple[Any, Any]:
    """The batch decoder of codec ``name`` (``None`` where the wheel exports no decoder)."""
    with _KERNELS_LOCK:
        if name not in _KERNELS:
            _KERNELS[name] = _build_kernel(name)
        return _KERNELS[name]


def _build_kernel(name: str) -> tuple[Any, Any]:
    c_int, c_void_p, c_size_t = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
    if name == "lz4":
        import lz4.block
        from lz4.block import _block

        fn = _c_function(
            _block.__file__, "LZ4_decompress_safe", c_int, [c_void_p, c_void_p, c_int, c_int]
        )
        return (None if fn is None else _lz4_kernel(fn)), lz4.block
    import zstandard

    lib = _zstd_library()
    args = [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t]
    fn = None if lib is None else _c_function(lib, "ZSTD_decompressDCtx", c_size_t, args)
    return (None if fn is None else _zstd_kernel(fn)), zstandard


@functools.cache  # one per process: the per-step kernel is compiled for it once
def _compress_c() -> Any:
    """The lz4 wheel's ``LZ4_compress_default`` (ctypes), or ``None`` where it is not exported."""
    from lz4.block import _block

    c_int, c_void_p = ctypes.c_int, ctypes.c_void_p
    args = [c_void_p, c_void_p, c_int, c_int]
    return _c_function(_block.__file__, "LZ4_compress_default", c_int, args)


def _zstd_library() -> str | None:
    """The path of a ``zstandard`` extension module that exports libzstd's symbols, if any.

    The wheels' ``_cffi`` module does (``backend_c`` hides them); it is only loaded with
    ``ctypes`` here, never imported (that would need ``cffi``).
    """
    for name in ("zstandard._cffi", "zstandard.backend_c"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        path = None if spec is None else spec.origin
        if _c_function(path, "ZSTD_createDCtx", ctypes.c_void_p, []) is not None:
            return path
    return None


class _Contexts:
    """libzstd decompression contexts, one per concurrent decode, freed with the codec."""

    def __init__(self, module: str) -> None:
        self._create = _c_function(module, "ZSTD_createDCtx", ctypes.c_void_p, [])
        self._free = _c_function(module, "ZSTD_freeDCtx", ctypes.c_size_t, [ctypes.c_void_p])
        self._idle: list[int] = []
        self._all: list[int] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def take(self) -> int:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the contexts are copies, keep them
                self._pid = os.getpid()
            if self._idle:
                return self._idle.pop()
        ctx = self._create()
        if not ctx:
            raise MemoryError("zstd: cannot create a decompression context")
        with self._lock:
            self._all.append(ctx)
        return int(ctx)

    def give(self, ctx: int) -> None:
        with self._lock:
            self._idle.append(ctx)

    def __del__(self) -> None:
        free = getattr(self, "_free", None)
        for ctx in getattr(self, "_all", ()):
            if free is not None:
                free(ctx)


_POOL: tuple[int, ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """One helper thread per process (a forked child makes its own: threads do not fork)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="rbdata-frames"))
        return _POOL[1]


def decode_threads() -> int:
    """Threads a batch decode uses: 2 where the process may run on 2 CPUs or more, else 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return 2 if cpus >= 2 else 1


class FrameCodec:
    """One codec and its settings: compress a frame, decode a batch of frames.

    Args:
        spec: ``"lz4"``, ``"zstd"`` or ``("zstd", level)`` (level in ``[-7, 22]``).

    Raises:
        ValueError: an unknown codec or level.
        ImportError: the codec's library is missing (``pip install 'rbdata[pixels]'``).

    Examples:
        >>> codec = FrameCodec(("zstd", 1))
        >>> codec.name, codec.level, codec.spec()
        ('zstd', 1, ['zstd', 1])
        >>> frames = np.arange(2 * 64, dtype=np.uint8).reshape(2, 64) // 8
        >>> blobs = [codec.compress(f) for f in frames]
        >>> src = np.frombuffer(b"".join(blobs), np.uint8)
        >>> lengths = np.array([len(b) for b in blobs])
        >>> out = np.empty((2, 64), np.uint8)
        >>> codec.decode_into(src, np.array([0, lengths[0]]), lengths, out)
        >>> bool((out == frames).all())
        True
    """

    def __init__(self, spec: str | Sequence[Any]) -> None:
        name, level = (spec, None) if isinstance(spec, str) else _pair(spec)
        if name not in CODECS:
            raise ValueError(
                f"codec must be None, 'lz4', 'zstd' or ('zstd', level), got {shown(spec)}"
            )
        if name == "zstd":
            level = _ZSTD_DEFAULT_LEVEL if level is None else level
            if type(level) is not int or not -7 <= level <= 22:
                raise ValueError(f"codec: a zstd level is an int in [-7, 22], got {shown(level)}")
        elif level is not None:
            raise ValueError(f"codec: lz4 takes no level, got {shown(level)}")
        self.name: str = name
        self.level: int | None = level
        self.threads = decode_threads()
        try:
            self._kernel, self._lib = _kernel(name)
        except ImportError as exc:
            raise ImportError(
                f"codec {name!r} needs the {exc.name} package: pip install 'rbdata[pixels]'"
            ) from exc
        self._contexts: _Contexts | None = None
        self._cctx: Any = None
        #: ``LZ4_compress_default`` of the lz4 wheel (ctypes; ``None``: zstd, or not exported),
        #: for the per-step write kernel (``_kernels.admit_kernel``)
        self.compress_c: Any = _compress_c() if name == "lz4" else None
        if name == "zstd":
            self._cctx = self._lib.ZstdCompressor(level=level, write_content_size=True)
            lib = _zstd_library()
            if self._kernel is not None and lib is not None:
                self._contexts = _Contexts(lib)

    def spec(self) -> str | list[Any]:
        """The codec as its constructor takes it (JSON-able)."""
        return self.name if self.level is None else [self.name, self.level]

    def __repr__(self) -> str:
        return f"FrameCodec({self.spec()!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        spec = state["spec"]
        self.__init__(spec if isinstance(spec, str) else tuple(spec))  # type: ignore[misc]

    def compress(self, frame: np.ndarray) -> bytes:
        """One frame's bytes compressed (``frame`` C-contiguous)."""
        if self.name == "lz4":
            return bytes(self._lib.compress(frame, store_size=False))
        return bytes(self._cctx.compress(frame))

    def decode_places(
        self,
        src: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        places: np.ndarray,
        size: int,
    ) -> np.ndarray:
        """The frames of slots ``places`` (any repeats) as ``uint8`` rows of ``size`` bytes.

        ``offsets[s]``/``lengths[s]``: slot ``s``'s blob in ``src``. lz4 decodes a frame about
        as fast as a copy of it: every place is decoded straight into its row (one pass over
        the memory). zstd decodes each distinct slot once, then copies the rows into place.

        Raises:
            ValueError: a blob is damaged.
        """
        if self.name == "lz4":
            out = np.empty((places.shape[0], size), np.uint8)
            self.decode_into(src, offsets[places], lengths[places], out)
            return out
        slots, inverse = np.unique(places, return_inverse=True)
        decoded = np.empty((slots.shape[0], size), np.uint8)
        self.decode_into(src, offsets[slots], lengths[slots], decoded)
        return decoded[inverse.reshape(-1)]

    def decode_into(
        self, src: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, out: np.ndarray
    ) -> None:
        """Decode the blobs at ``offsets``/``lengths`` of ``src`` into the rows of ``out``.

        ``src``: ``uint8`` bytes; ``offsets``, ``lengths``: ``int64``, one per row of ``out``
        (``uint8``, C-contiguous, ``[n, frame_bytes]``).

        Raises:
            ValueError: a blob is damaged (outside ``src``, or not one row's bytes).
        """
        n, size = out.shape[0], out.shape[1]
        if not n:
            return
        if self._kernel is None:
            self._decode_python(src, offsets, lengths, out)
            return
        flat = out.reshape(-1)
        if self.threads > 1 and n >= 2 * _SPLIT_MIN[self.name]:
            half = n // 2
            future = _pool().submit(self._run, src, offsets, lengths, flat, half, n, size)
            bad = self._run(src, offsets, lengths, flat, 0, half, size)
            other = future.result()
            bad = other if bad < 0 else bad
        else:
            bad = self._run(src, offsets, lengths, flat, 0, n, size)
        if bad >= 0:
            raise ValueError(
                f"frame blob {bad} of {n} is damaged: it does not decode to {size} bytes "
                f"({self.name})"
            )

    def _run(self, src: Any, offsets: Any, lengths: Any, flat: Any, first: int, last: int,
             size: int) -> int:  # fmt: skip
        contexts = self._contexts
        if contexts is None:
            return int(self._kernel(src, offsets, lengths, flat, 0, first, last, size))
        ctx = contexts.take()
        try:
            return int(self._kernel(src, offsets, lengths, flat, ctx, first, last, size))
        finally:
            contexts.give(ctx)

    def _decode_python(
        self, src: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, out: np.ndarray
    ) -> None:
        size, lib = out.shape[1], self._lib
        for i, (start, length) in enumerate(zip(offsets.tolist(), lengths.tolist(), strict=True)):
            if start < 0 or length <= 0 or start + length > src.shape[0]:
                raise ValueError(f"frame blob {i} lies outside the stored bytes ({self.name})")
            blob = src[start : start + length].tobytes()
            try:
                data = (
                    lib.decompress(blob, uncompressed_size=size)
                    if self.name == "lz4"
                    else lib.ZstdDecompressor().decompress(blob, max_output_size=size)
                )
            except Exception as exc:  # the libraries raise their own error types
                raise ValueError(f"frame blob {i} is damaged ({self.name}): {exc}") from exc
            if len(data) != size:
                raise ValueError(f"frame blob {i} is damaged: {len(data)} bytes, not {size}")
            out[i] = np.frombuffer(data, np.uint8)


def _pair(spec: Sequence[Any]) -> tuple[Any, Any]:
    try:
        name, level = spec
    except (TypeError, ValueError):
        raise ValueError(
            f"codec must be None, 'lz4', 'zstd' or ('zstd', level), got {shown(spec)}"
        ) from None
    return name, level
