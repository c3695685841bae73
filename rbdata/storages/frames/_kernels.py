"""The numba kernels of a frame storage's writes: reference counts, the plan, one step.

Pure functions over the arrays of a :class:`~rbdata.storages.frames._pool.FramePool` and a
:class:`~rbdata.storages.frames._streams.StreamTracker` (their owners call them):

* ``acquire``, ``release``, ``settle``: the counts. ``count`` holds references per slot,
  ``free`` a stack of the free slots (``nfree`` deep); a slot goes on it when its count
  reaches 0.
* ``plan``: which frames of a write are new (see ``_streams.py``).
* ``admit_raw`` and :func:`admit_kernel`: the whole frames side of one step of one stream in
  one call (plan, take slots, store the new frames, take references, pin the next
  observation), the per-step path of ``add``: one call instead of five saves ~6 us a step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from rbdata._core.native import voidptr

__all__ = ["acquire", "admit_kernel", "admit_raw", "plan", "release", "settle"]


@numba.njit(nogil=True, cache=True, inline="always")
def _same(a: Any, b: Any) -> bool:
    """Whether two frames (1-D word arrays) are equal.

    Blocks of 64 words are OR-reduced (a fixed-length loop the compiler vectorises, ~3x a
    word-by-word loop), leaving at the first block that differs.
    """
    n, i = a.shape[0], 0
    while i + 64 <= n:
        diff = a[i] ^ b[i]
        for k in range(i + 1, i + 64):
            diff |= a[k] ^ b[k]
        if diff != 0:
            return False
        i += 64
    while i < n and a[i] == b[i]:
        i += 1
    return i == n


@numba.njit(nogil=True, cache=True, inline="always")
def _same_kept(obs: Any, source: Any, index: Any) -> bool:
    """Whether a stack ``[S, words]`` equals the kept one, frame ``k`` ``source[index[k]]``."""
    n, k = obs.shape[0], 0
    while k < n and _same(obs[k], source[index[k]]):
        k += 1
    return k == n


@numba.njit(nogil=True, cache=True)
def _same_stack(a: Any, b: Any) -> bool:
    n, k = a.shape[0], 0
    while k < n and _same(a[k], b[k]):
        k += 1
    return k == n


@numba.njit(nogil=True, cache=True)
def plan(obs: Any, nxt: Any, source: Any, index: Any, kept_refs: Any, n_kept: int, last: int,
         refs: Any, rows: Any) -> int:  # fmt: skip
    """Fill ``refs`` ``[n, 2, S]``: a stored slot, or ``-1 - k`` for the ``k``-th new frame.

    ``obs``, ``nxt``: ``[n, S, words]``. The tracker's kept stacks: stack ``j``'s frame ``k`` is
    ``source[index[j, k]]`` (``source`` ``[rows, words]``; see ``_streams.py``: the tracker's
    byte copies with a constant index, or the pool's raw frames indexed by the pinned slots),
    positions ``0..n_kept-1`` then, at ``last`` (``-1``: none), the last step's; ``kept_refs``
    ``[rows, S]``: their slots, which a found stack takes. ``rows[k]`` gets the ``k``-th new
    frame (``[2 * n * S, words]``). Returns the count.
    """
    new = 0
    for j in range(obs.shape[0]):
        found = False
        if j > 0 and _same_stack(obs[j], nxt[j - 1]):
            refs[j, 0, :] = refs[j - 1, 1, :]
            found = True
        if not found and j < n_kept and _same_kept(obs[j], source, index[j]):
            refs[j, 0, :] = kept_refs[j]
            found = True
        if not found and j == 0 and last >= 0 and _same_kept(obs[0], source, index[last]):
            refs[0, 0, :] = kept_refs[last]
            found = True
        if not found:
            new = _new_obs(obs[j], refs[j, 0], rows, new)
        new = _next_refs(obs[j], nxt[j], refs[j], rows, new)
    return new


@numba.njit(nogil=True, cache=True, inline="always")
def _new_obs(obs: Any, refs: Any, rows: Any, new: int) -> int:
    """Refs ``[S]`` of an observation stack found nowhere: its frames, a repeat stored once."""
    for k in range(obs.shape[0]):
        if k > 0 and _same(obs[k], obs[k - 1]):
            refs[k] = refs[k - 1]
        else:
            refs[k] = -1 - new
            rows[new] = obs[k]
            new += 1
    return new


@numba.njit(nogil=True, cache=True, inline="always")
def _next_refs(obs: Any, nxt: Any, refs: Any, rows: Any, new: int) -> int:
    """Refs ``refs[1]`` of a next stack: the observation's frames shifted, else new frames."""
    s = obs.shape[0]
    for k in range(s):
        if k + 1 < s and _same(nxt[k], obs[k + 1]):
            refs[1, k] = refs[0, k + 1]
        elif k > 0 and _same(nxt[k], nxt[k - 1]):
            refs[1, k] = refs[1, k - 1]
        else:
            refs[1, k] = -1 - new
            rows[new] = nxt[k]
            new += 1
    return new


@numba.njit(nogil=True, cache=True)
def acquire(count: Any, refs: Any) -> None:
    """Add one reference per entry of ``refs``."""
    for r in refs:
        count[r] += 1


@numba.njit(nogil=True, cache=True)
def release(count: Any, refs: Any, free: Any, nfree: int) -> int:
    """Drop one reference per entry of ``refs``; push the slots that reach 0; new ``nfree``."""
    for r in refs:
        c = count[r] - 1
        count[r] = c
        if c == 0:
            free[nfree] = r
            nfree += 1
    return nfree


@numba.njit(nogil=True, cache=True)
def settle(count: Any, refs: Any, fresh: Any, old: Any, free: Any, nfree: int) -> int:
    """Resolve placeholders, add a reference per entry of ``refs``, drop one per ``old``.

    A placeholder ``-1 - k`` in ``refs`` becomes ``fresh[k]`` (in place). Returns ``nfree``.
    """
    for i in range(refs.shape[0]):
        r = refs[i]
        if r < 0:
            r = fresh[-1 - r]
            refs[i] = r
        count[r] += 1
    return release(count, old, free, nfree)


@numba.njit(nogil=True, cache=True, inline="always")
def _room(count: Any, nfree: int, high: int, new: int) -> bool:
    """Whether ``new`` slots can be taken without growing the pool."""
    return new <= nfree + count.shape[0] - high


@numba.njit(nogil=True, cache=True, inline="always")
def _take(count: Any, free: Any, nfree: int, high: int) -> Any:
    """One free slot (the free stack's top, else a new one): ``(slot, nfree, high)``."""
    if nfree:
        return free[nfree - 1], nfree - 1, high
    return high, nfree, high + 1


@numba.njit(nogil=True, cache=True, inline="always")
def _drop(count: Any, free: Any, nfree: int, refs: Any, n: int, table: Any, live: int) -> Any:
    """:func:`release` of ``refs[:n]``, a freed blob's length leaving ``live``."""
    for i in range(n):
        r = refs[i]
        c = count[r] - 1
        count[r] = c
        if c == 0:
            free[nfree] = r
            nfree += 1
            if table.shape[0]:
                live -= table[r, 1]
    return nfree, live


@numba.njit(nogil=True, cache=True)
def _finish(refs: Any, old: Any, fresh: Any, count: Any, free: Any, nfree: int, kept_refs: Any,
            kept_count: int, table: Any, live: int) -> Any:  # fmt: skip
    """Take the step's references, pin its next observation, drop the overwritten step's.

    ``refs``, ``old``: the step's (see :func:`admit_raw`). ``refs``' placeholders are resolved;
    the next observation's slots become ``kept_refs[0]``, pinned before the pin they replace
    is dropped (``StreamTracker.keep``'s per-step case; a tracker that copies stacks copies the
    next observation itself); the refs in ``old`` are dropped last, so none of this step's
    slots was one they free. ``table`` (``[slots, 2]``, empty for raw frames): a freed slot's
    blob leaves ``live``. Returns ``(mark, nfree, live)``: ``nfree`` before ``old`` was dropped,
    for ``FramePool.undrop``.
    """
    flat = refs.reshape(-1)
    for i in range(flat.shape[0]):
        r = flat[i]
        if r < 0:
            r = fresh[-1 - r]
            flat[i] = r
        count[r] += 1
    s = refs.shape[2]
    pin = kept_refs[0].copy()
    for k in range(s):
        kept_refs[0, k] = refs[0, 1, k]
        count[refs[0, 1, k]] += 1
    nfree, live = _drop(count, free, nfree, pin, s if kept_count else 0, table, live)
    mark = nfree
    nfree, live = _drop(count, free, nfree, old, old.shape[0], table, live)
    return mark, nfree, live


@numba.njit(nogil=True, cache=True, inline="always")
def _words(step: Any, s: int, word: Any) -> Any:
    """``step`` as ``(obs, nxt, refs, old)`` (see :func:`admit_raw`).

    The stacks as ``[1, S, words]`` of ``word``'s dtype, the step's refs ``both[0:1]``, and
    ``old``: the overwritten step's refs, copied into ``both[1]``.
    """
    obs = step[0].reshape((1, s, -1)).view(word.dtype)
    nxt = step[1].reshape((1, s, -1)).view(word.dtype)
    both, stored = step[2], step[3].reshape(-1)
    old = both[1].reshape(-1)[: stored.shape[0]]
    for i in range(stored.shape[0]):
        old[i] = stored[i]
    return obs, nxt, both[0:1], old


@numba.njit(nogil=True, cache=True)
def admit_raw(step: Any, kept_refs: Any, kept_count: int, rows: Any, count: Any, free: Any,
              nfree: int, high: int, frames: Any) -> Any:  # fmt: skip
    """One step of one stream, raw frames: ``(new frames, mark, nfree, high)``.

    ``step``: ``(obs, nxt, both, stored)``: the stacks (C-contiguous ``[S, *frame]`` arrays
    of any dtype, read as ``[1, S, words]`` of ``frames``' word), ``both`` ``[2, 2, S]``
    int64 that gets the step's refs (``both[0]``) and a copy of ``stored`` (``both[1]``,
    flattened), the refs of the step it overwrites as stored (C-contiguous ``[2, S]``, or
    ``[0, S]``: none), dropped last.
    ``kept_refs``/``kept_count``: the tracker's (one stream, no last step), whose stack is
    compared where it is stored, ``frames[kept_refs[0]]`` (pinned: never freed nor reused;
    ``_streams.py``); ``rows`` ``[2 * S, words]`` scratch; ``frames`` ``[slots, words]`` the
    pool's. ``new == -1``: nothing changed (the pool must grow first: the general path does it).
    """
    obs, nxt, refs, old = _words(step, kept_refs.shape[1], frames)
    new = plan(obs, nxt, frames, kept_refs, kept_refs, kept_count, -1, refs, rows)
    if not _room(count, nfree, high, new):
        return -1, nfree, nfree, high
    fresh = np.empty(new, np.int64)
    for k in range(new):
        slot, nfree, high = _take(count, free, nfree, high)
        fresh[k] = slot
        frames[slot] = rows[k]
    table = np.empty((0, 2), np.int64)
    mark, nfree, _ = _finish(refs, old, fresh, count, free, nfree, kept_refs, kept_count, table, 0)
    return new, mark, nfree, high


_ADMIT: dict[int, tuple[Any, Callable[..., Any]]] = {}  # id -> (the function, its kernel)


def admit_kernel(compress: Any) -> Callable[..., Any]:
    """:func:`admit_raw` for a byte log, with ``compress`` (``LZ4_compress_default``'s ctypes).

    The kernel: ``(step, kept, kept_refs, kept_count, rows, count, free, nfree, high, log,
    table, head, live)`` -> ``(new frames, mark, nfree, high, head, live)`` (``kept``: the
    tracker's copies, compared and updated: a codec pool's tracker keeps copies); ``new == -1``
    (nothing changed) when the pool or the log lacks room for the worst case.
    """
    got = _ADMIT.get(id(compress))
    if got is None or got[0] is not compress:  # ctypes functions do not hash
        got = _ADMIT[id(compress)] = (compress, _build_admit(compress))
    return got[1]


def _build_admit(compress: Any) -> Callable[..., Any]:
    @numba.njit(nogil=True)
    def admit(step: Any, kept: Any, kept_refs: Any, kept_count: int, rows: Any, count: Any,
              free: Any, nfree: int, high: int, log: Any, table: Any, head: int,
              live: int) -> Any:  # fmt: skip
        s = kept.shape[1]
        obs, nxt, refs, old = _words(step, s, kept)
        index = np.arange(s).reshape((1, s))  # the tracker's copy of stream 0: kept[0]
        new = plan(obs, nxt, kept[0], index, kept_refs, kept_count, -1, refs, rows)
        size = rows.shape[1] * rows.itemsize
        bound = size + size // 255 + 16  # LZ4_compressBound
        if not _room(count, nfree, high, new) or head + new * bound > log.shape[0]:
            return -1, nfree, nfree, high, head, live
        fresh = np.empty(new, np.int64)
        src, dst = rows.ctypes.data, log.ctypes.data
        for k in range(new):
            slot, nfree, high = _take(count, free, nfree, high)
            fresh[k] = slot
            n = compress(voidptr(src + k * size), voidptr(dst + head), size, bound)
            table[slot, 0] = head
            table[slot, 1] = n
            head += n
            live += n
        kept[0] = nxt[0]  # a codec pool's tracker keeps copies (see _streams.py)
        mark, nfree, live = _finish(refs, old, fresh, count, free, nfree, kept_refs, kept_count,
                                    table, live)  # fmt: skip
        return new, mark, nfree, high, head, live

    return admit
