"""The reference counts of a :class:`~rbdata.storages.frames._pool.FramePool`: numba kernels.

Pure functions over the pool's arrays: ``count`` (references per slot), ``free`` (a stack of
the free slots, ``nfree`` deep). A slot goes on the free stack when its count reaches 0.
"""

from __future__ import annotations

from typing import Any

import numba

__all__ = ["acquire", "release", "settle"]


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
