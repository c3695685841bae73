"""Low-level numba helpers of the CPU kernels (sum trees, the Arrow gather, the memmap writes).

numba is a core dependency: the CPU kernels have no fallback. Their torch references (where
there is one) are kept for equivalence tests and for other devices.

Kernels built on :func:`voidptr` read and write raw addresses: they must only ever receive
addresses, lengths and indices that Python code has already checked against the buffers
(the house rule "a numba kernel only ever sees indices and buffers already checked").
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["fence", "prefetch", "voidptr"]


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


def _prefetch(typingctx: Any, address: Any) -> Any:  # pragma: no cover
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32, i32, i32]),
            "llvm.prefetch.p0i8",
        )
        pointer = builder.inttoptr(args[0], cgutils.voidptr_t)
        # read (0), keep in every cache level (3), data (1)
        builder.call(fn, [pointer, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.none(address), codegen


# A hint to bring the cache line at an integer address in (LLVM's ``llvm.prefetch``): never
# faults, even on an unmapped address, and changes nothing but timing. A kernel that knows
# where its next random reads are issues them early, so that the misses overlap.
prefetch: Any = intrinsic(_prefetch)
