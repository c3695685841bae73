"""Low-level numba helpers of the CPU kernels (sum trees, the Arrow gather, the memmap writes).

numba is a core dependency: the CPU kernels have no fallback. Their torch references (where
there is one) are kept for equivalence tests and for other devices.

Kernels built on :func:`voidptr` read and write raw addresses: they must only ever receive
addresses, lengths and indices that Python code has already checked against the buffers
(the house rule "a numba kernel only ever sees indices and buffers already checked").
"""

from __future__ import annotations

from typing import Any

from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["fence", "voidptr"]


def _voidptr(typingctx: Any, address: Any) -> Any:  # pragma: no cover
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen


# An integer address as a ``void*``, for ``numba.carray`` inside njit functions: a
# ``.numpy()`` view per argument costs ~0.8 us and slows the kernel that follows.
voidptr: Any = intrinsic(_voidptr)


def _fence(typingctx: Any) -> Any:  # pragma: no cover
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.none(), codegen


# A full memory fence: no load or store moves across it, in the compiler or the CPU. The
# crash-atomic writes (a SIGKILL at any instruction) need program order between phases.
fence: Any = intrinsic(_fence)
