"""Fused Triton kernels for the device trees: a draw in one kernel, an update in two.

The kernels themselves; :mod:`rbdata.samplers._trees.triton_ops` launches them.

The trees are those of :mod:`rbdata.samplers._trees.sumtree` (8-ary, level by level in one 1-D
tensor, with the block-min tree beside the sum tree) and the results are those of
:mod:`rbdata.samplers._trees.torch_ops`, the batched torch reference, which needs about a hundred
small launches per call where these need one to three:

- **draw** (:func:`draw`): one program per block of uniforms. Each lane scales its uniform by
  the root (stratified: ``(i + u) / n`` first), descends every level (the 8 children's
  float64 *sequential* prefix sums, the same compares as the numba kernel), then weighs the
  slot ``(v / v_min) ** -beta``. A tree whose total is not positive is recorded for a later
  error, never waited for.
- **update** (:func:`update`), last write wins, no sort, no ``unique``, no host wait:

  1. *check*: each lane validates its item (index in the filled range, finite, ``>= 0``, its
     value ``(p + eps) ** alpha`` finite), stamps its position into the slot's stamp word
     (``atomic_max``: the highest position of a slot wins) and, the first lane to reach a
     slot or an inner node, counts it at its parent (how many distinct children of every
     touched node change). The last program to finish decides: the call is refused if any
     item failed (the first failing item's record is kept for the error) or the tree's total
     could overflow; otherwise the highest priority seen is raised.
  2. *write*: the winning lane of each slot writes the leaf (if the call was accepted), then
     walks up: at each parent it takes a ticket (``atomic_add(count, -1)``); the lane holding
     the last ticket, whose every changed sibling is final, recomputes that parent in both
     trees (sum: the float64 pairwise sum of the 8 children, rounded once; block-min: the
     smallest positive leaf, then minima) and goes on; the others stop. Only touched
     ancestors are read or written, each once, and every stamp, count and mark is left back
     at its initial value for the next call.

  Tree values are therefore bit for bit those of the numba kernels for the same stored
  values (the same association of every sum; minima are exact).

The kernels also run under Triton's CPU interpreter (``TRITON_INTERPRET=1``, on CPU tensors):
that is how CI checks them against the numba kernels without a GPU. ``pow`` comes from
libdevice on the GPU, where the stored values and weights may differ from numba's libm in the
last float64 bit, as the torch path's (``alpha`` or ``beta`` of 0 and 1 are exact
everywhere); in the interpreter (which has no libdevice) it is the C library's, as numba's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import triton
import triton.language as tl

from rbdata.samplers._trees.backend import interpreting

__all__ = ["INTERPRET", "check_kernel", "draw_kernel", "write_kernel"]

#: whether kernels run in Triton's interpreter (set ``TRITON_INTERPRET=1`` before import)
INTERPRET = interpreting()

# The error record (see DeviceTrees): event (1 a refused update, 6 a draw from an all-zero
# tree), refusal code, index, priority, filled - 1. The first-failing-position word holds 2**62
# when no item failed.

if INTERPRET:
    from triton.runtime.interpreter import TensorHandle

    def _libm_pow(x: float, y: float) -> float:
        try:
            return math.pow(x, y)
        except OverflowError:
            return math.inf
        except ValueError:  # a negative base (a masked lane): NaN, as on a GPU
            return math.nan

    _vector_pow = np.vectorize(_libm_pow, otypes=[np.float64])

    def _pow(x: Any, y: Any) -> Any:
        """``x ** y`` in float64 for the interpreter: the C library's, as numba's.

        (libdevice has no CPU form, and numpy's vectorised ``power`` rounds differently.)
        """
        data = _vector_pow(x.handle.data.astype(np.float64), np.float64(y.handle.data))
        return tl.tensor(TensorHandle(data, tl.float64), x.type)

else:  # pragma: no cover - compiled for a GPU
    from triton.language.extra import libdevice

    @triton.jit
    def _pow(x, y):  # type: ignore[no-untyped-def]
        return libdevice.pow(x, y)


@triton.jit
def _power(x, y, MODE: tl.constexpr):  # type: ignore[no-untyped-def]
    # MODE 0: y == 0 (exactly 1), 1: y == 1 (x itself), 2: any other exponent
    if MODE == 0:
        return x * 0.0 + 1.0
    elif MODE == 1:
        return x
    else:
        return _pow(x, y)


@triton.jit
def draw_kernel(  # type: ignore[no-untyped-def]
    tree,
    offsets,
    depth,
    min_tree,
    u,
    index_out,
    weight_out,
    err,
    n,
    params,
    STRATIFIED: tl.constexpr,
    BETA_MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    pos = pid * BLOCK + tl.arange(0, BLOCK)
    mask = pos < n
    total = tl.load(tree + 7).to(tl.float64)
    r = tl.load(u + pos, mask=mask, other=0.0).to(tl.float64)
    if STRATIFIED:
        r = (pos.to(tl.float64) + r) / n
    r = r * total
    node = tl.zeros([BLOCK], dtype=tl.int64)
    for level in range(depth - 1):
        base = tl.load(offsets + level + 1) + 8 * node
        acc = tl.zeros([BLOCK], dtype=tl.float64)
        chosen = tl.zeros([BLOCK], dtype=tl.int64)
        before = tl.zeros([BLOCK], dtype=tl.float64)  # the largest inclusive prefix <= r
        last_positive = tl.zeros([BLOCK], dtype=tl.int64)
        before_last = tl.zeros([BLOCK], dtype=tl.float64)  # the prefix before it
        for c in tl.static_range(8):
            v = tl.load(tree + base + c, mask=mask, other=0.0).to(tl.float64)
            positive = v > 0
            last_positive = tl.where(positive, c, last_positive)
            before_last = tl.where(positive, acc, before_last)
            acc = acc + v
            inside = acc <= r
            chosen += inside.to(tl.int64)
            before = tl.where(inside, acc, before)
        rounded_up = chosen == 8  # a target at (or past) the total: the last positive child
        chosen = tl.where(rounded_up, last_positive, chosen)
        before = tl.where(rounded_up, before_last, before)
        r = r - before
        node = 8 * node + chosen
    leaf0 = tl.load(offsets + depth - 1)
    value = tl.load(tree + leaf0 + node, mask=mask, other=1.0).to(tl.float64)
    min_root = tl.load(min_tree + 7).to(tl.float64)
    weight = _power(value / min_root, -tl.load(params + 4), BETA_MODE)
    tl.store(index_out + pos, node, mask=mask)
    tl.store(weight_out + pos, weight.to(tl.float32), mask=mask)
    if pid == 0:  # noqa: SIM102 - (Triton: one scalar condition per ``if``)
        if total <= 0:  # noqa: SIM102 - all zero: no distribution; recorded, slot 0 drawn
            if tl.load(err) == 0:
                tl.store(err, 6.0)
                tl.store(err + 1, 0.0)


@triton.jit
def _priority(priority, pos, mask, SCALAR: tl.constexpr):  # type: ignore[no-untyped-def]
    # the items' priorities as float64: one per item, or one for all (SCALAR: new items)
    if SCALAR:
        return tl.load(priority).to(tl.float64) + 0.0 * pos.to(tl.float64)
    else:
        return tl.load(priority + pos, mask=mask, other=0.0).to(tl.float64)


@triton.jit
def _item(index, priority, pos, mask, filled, params, SCALAR: tl.constexpr):  # type: ignore[no-untyped-def]
    # an item's slot, priority (float64) and refusal code (0: fine), as the numba kernel
    # checks it: the index first, then finite, >= 0, and a value the tree's dtype holds
    slot = tl.load(index + pos, mask=mask, other=0)
    p = _priority(priority, pos, mask, SCALAR)
    eps = tl.load(params)
    pmax = tl.load(params + 2)
    finite = (p == p) & (p != float("inf")) & (p != -float("inf"))
    code = tl.where(
        (slot < 0) | (slot >= filled),
        1,
        tl.where(~finite, 2, tl.where(p < 0, 3, tl.where(p + eps <= pmax, 0, 4))),
    )
    return slot, p, code


@triton.jit
def check_kernel(  # type: ignore[no-untyped-def]
    index,
    priority,
    n,
    filled,
    params,
    tree,
    offsets,
    depth,
    stamp,
    count,
    touched,
    acc_sum,
    acc_bad,
    acc_top,
    done,
    good,
    max_t,
    err,
    SCALAR: tl.constexpr,
    ALPHA_MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    pos = pid * BLOCK + tl.arange(0, BLOCK)
    mask = pos < n
    slot, p, code = _item(index, priority, pos, mask, filled, params, SCALAR)
    eps = tl.load(params)
    alpha = tl.load(params + 1)
    fine = mask & (code == 0)
    bad = mask & (code != 0)
    value = _power(tl.where(fine, p + eps, 1.0), alpha, ALPHA_MODE)
    # the call's accumulators: block reductions, then one scalar atomic each (one thread,
    # in program order before this program's ticket below)
    tl.atomic_min(acc_bad, tl.min(tl.where(bad, pos.to(tl.int64), 2**62), axis=0))
    tl.atomic_add(acc_sum, tl.sum(tl.where(fine, value, 0.0), axis=0))
    tl.atomic_max(acc_top, tl.max(tl.where(fine, p, 0.0), axis=0))
    # stamp the slot (the highest position wins) and count distinct touched children
    in_range = mask & (slot >= 0) & (slot < filled)
    old = tl.atomic_max(stamp + slot, pos.to(tl.int32), mask=in_range)
    first = in_range & (old == -1)
    node = slot
    for i in range(depth - 1):
        level = depth - 2 - i
        node = node // 8
        element = tl.load(offsets + level) + node
        tl.atomic_add(count + element, 1, mask=first)
        seen = tl.atomic_xchg(touched + element, 1, mask=first)
        first = first & (seen == 0)
    # the last program decides for the whole call (every other one has counted in): the
    # barrier orders every warp's work of this program before its ticket
    tl.debug_barrier()
    ticket = tl.atomic_add(done, 1)
    if ticket == tl.num_programs(0) - 1:
        total_new = tl.atomic_add(acc_sum, 0.0)
        first_bad = tl.atomic_add(acc_bad, 0)
        top = tl.atomic_add(acc_top, 0.0)
        root = tl.load(tree + 7).to(tl.float64)
        failing = first_bad < n
        at = tl.where(failing, first_bad, 0)
        bad_slot, bad_p, bad_code = _item(index, priority, at, at < n, filled, params, SCALAR)
        fits = root + total_new <= tl.load(params + 3)
        refusal = tl.where(failing, bad_code, tl.where(fits, 0, 5))
        accepted = refusal == 0
        tl.store(good, accepted.to(tl.int32))
        current = tl.load(max_t)
        tl.store(max_t, tl.where(accepted & (top > current), top, current))
        if refusal != 0:  # noqa: SIM102 - (Triton: one scalar condition per ``if``)
            if tl.load(err) == 0:
                tl.store(err + 1, refusal.to(tl.float64))
                tl.store(err + 2, tl.where(failing, bad_slot, -1).to(tl.float64))
                tl.store(err + 3, tl.where(failing, bad_p, 0.0))
                tl.store(err + 4, tl.cast(filled - 1, tl.float64))  # (filled may be constexpr)
                tl.store(err, 1.0)
        # every other program is done with them: plain stores reset the words
        tl.store(acc_sum, 0.0)
        tl.store(acc_bad, 2**62)
        tl.store(acc_top, 0.0)
        tl.store(done, 0)


@triton.jit
def write_kernel(  # type: ignore[no-untyped-def]
    index,
    priority,
    n,
    filled,
    params,
    tree,
    min_tree,
    offsets,
    min_offsets,
    depth,
    stamp,
    count,
    touched,
    good,
    SCALAR: tl.constexpr,
    ALPHA_MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    pos = pid * BLOCK + tl.arange(0, BLOCK)
    mask = pos < n
    slot = tl.load(index + pos, mask=mask, other=0)
    in_range = mask & (slot >= 0) & (slot < filled)
    winner = in_range & (tl.load(stamp + slot, mask=in_range, other=-1) == pos.to(tl.int32))
    accepted = tl.load(good) != 0
    eps = tl.load(params)
    alpha = tl.load(params + 1)
    p = _priority(priority, pos, mask, SCALAR)
    value = _power(tl.where(winner, p + eps, 1.0), alpha, ALPHA_MODE)
    leaf0 = tl.load(offsets + depth - 1)
    tl.store(tree + leaf0 + slot, value.to(tree.dtype.element_ty), mask=winner & accepted)
    tl.store(stamp + slot, tl.full([BLOCK], -1, tl.int32), mask=winner)
    if depth == 1:  # a one-slot tree: the leaf is the root, its block-min the min root
        leaf = tl.load(tree + leaf0 + slot, mask=winner, other=0.0)
        tl.store(min_tree + 7 + slot, tl.where(leaf > 0, leaf, float("inf")), mask=winner)
    active = winner
    node = slot
    for i in range(depth - 1):
        level = depth - 2 - i
        node = node // 8
        element = tl.load(offsets + level) + node
        ticket = tl.atomic_add(count + element, -1, mask=active)
        active = active & (ticket == 1)  # the last changed child in: every sibling is final
        base = tl.load(offsets + level + 1) + 8 * node
        c0 = tl.load(tree + base, mask=active, other=0.0, cache_modifier=".cg")
        c1 = tl.load(tree + base + 1, mask=active, other=0.0, cache_modifier=".cg")
        c2 = tl.load(tree + base + 2, mask=active, other=0.0, cache_modifier=".cg")
        c3 = tl.load(tree + base + 3, mask=active, other=0.0, cache_modifier=".cg")
        c4 = tl.load(tree + base + 4, mask=active, other=0.0, cache_modifier=".cg")
        c5 = tl.load(tree + base + 5, mask=active, other=0.0, cache_modifier=".cg")
        c6 = tl.load(tree + base + 6, mask=active, other=0.0, cache_modifier=".cg")
        c7 = tl.load(tree + base + 7, mask=active, other=0.0, cache_modifier=".cg")
        a = c0.to(tl.float64) + c1.to(tl.float64)
        b = c2.to(tl.float64) + c3.to(tl.float64)
        c = c4.to(tl.float64) + c5.to(tl.float64)
        d = c6.to(tl.float64) + c7.to(tl.float64)
        total = (a + b) + (c + d)
        tl.store(tree + element, total.to(tree.dtype.element_ty), mask=active)
        min_element = tl.load(min_offsets + level) + node
        if level == depth - 2:  # a block of leaves: its smallest positive value
            inf = float("inf")
            m0 = tl.minimum(tl.where(c0 > 0, c0, inf), tl.where(c1 > 0, c1, inf))
            m1 = tl.minimum(tl.where(c2 > 0, c2, inf), tl.where(c3 > 0, c3, inf))
            m2 = tl.minimum(tl.where(c4 > 0, c4, inf), tl.where(c5 > 0, c5, inf))
            m3 = tl.minimum(tl.where(c6 > 0, c6, inf), tl.where(c7 > 0, c7, inf))
            smallest = tl.minimum(tl.minimum(m0, m1), tl.minimum(m2, m3))
        else:
            below = tl.load(min_offsets + level + 1) + 8 * node
            smallest = tl.load(min_tree + below, mask=active, other=0.0, cache_modifier=".cg")
            for k in tl.static_range(1, 8):
                child = tl.load(min_tree + below + k, mask=active, other=0.0, cache_modifier=".cg")
                smallest = tl.minimum(smallest, child)
        tl.store(min_tree + min_element, smallest, mask=active)
        tl.store(touched + element, tl.zeros([BLOCK], dtype=tl.int32), mask=active)
