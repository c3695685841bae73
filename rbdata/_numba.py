"""Low-level numba helpers shared by the CPU kernels (sum trees, the Arrow gather).

numba is a core dependency, but every user of this module checks :data:`HAS_NUMBA` so that a
broken numba install degrades to the torch reference paths instead of failing at import.

Kernels built on :func:`voidptr` read and write raw addresses: they must only ever receive
addresses, lengths and indices that Python code has already checked against the buffers
(the house rule "a numba kernel only ever sees indices and buffers already checked").
"""

from __future__ import annotations

from typing import Any

__all__ = ["HAS_NUMBA", "fence", "voidptr"]

try:  # pragma: no cover - exercised by whichever environment runs the tests
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    HAS_NUMBA = True
except ImportError:  # pragma: no cover
    HAS_NUMBA = False

voidptr: Any = None
fence: Any = None
if HAS_NUMBA:

    def _voidptr(typingctx: Any, address: Any) -> Any:  # pragma: no cover
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.inttoptr(args[0], cgutils.voidptr_t)

        return types.voidptr(address), codegen

    # An integer address as a ``void*``, for ``numba.carray`` inside njit functions: a
    # ``.numpy()`` view per argument costs ~0.8 us and slows the kernel that follows.
    voidptr = intrinsic(_voidptr)

    def _fence(typingctx: Any) -> Any:  # pragma: no cover
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            builder.fence("seq_cst")
            return context.get_dummy_value()

        return types.none(), codegen

    # A full memory fence: no load or store moves across it, in the compiler or the CPU. The
    # crash-atomic writes (a SIGKILL at any instruction) need program order between phases.
    fence = intrinsic(_fence)
