"""The mixture's CPU gather: every leaf of every source's rows by one numba kernel call.

:class:`RowGather` fills a batch's leaves from the sources' backing tensors (``buffers`` of
tensor and memmap storages) straight into fresh tensors of ``B`` rows, and the batch's
``"index"`` (combined) and ``"source"`` columns with them: no ``index_select`` per leaf and
source, no ``torch.cat``. The kernel reads one ``int64`` table of addresses, row widths,
index arrays and bounds; it checks every index against its source's rows before it copies
anything, and copies each leaf in the widest unit (8, 4, 2 or 1 bytes) that divides its row
width and every address. Addresses are read anew for every batch (a storage's memory may
move: ``share_memory_``, a remap); what is cached is which buffer tensors were checked
(contiguous, on the CPU, of the leaf's dtype and shape), by identity: a tensor's shape and
dtype never change. :func:`gather_reference` is the kernel's torch reference (for tests).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
import torch

from rbdata._core.layout import Layout
from rbdata._core.native import voidptr
from rbdata.errors import IndexOutOfRangeError

__all__ = ["RowGather", "gather_reference", "gather_rows"]

# the table: [leaves L, sources S, rows n, index column, source column (0: none)], row
# bytes per leaf, output address per leaf, per source (index address, count, rows, offset,
# position), then per source its buffers' addresses (one per leaf)
_HEAD, _PER_SOURCE = 5, 5


@numba.njit(cache=True, nogil=True, inline="always")
def _nb_copy(
    src: int, index: Any, rows: int, out: int, start: int, width: int, dtype: Any
) -> None:  # pragma: no cover
    # rows of ``width`` elements of ``dtype``: element loops, no per-row slice objects
    count = index.shape[0]
    source = numba.carray(voidptr(src), (rows * width,), dtype)
    dst = numba.carray(voidptr(out), ((start + count) * width,), dtype)
    base = start * width
    for i in range(count):
        at = index[i] * width
        for e in range(width):
            dst[base + e] = source[at + e]
        base += width


@numba.njit(cache=True, nogil=True)
def _nb_gather(table: Any) -> int:  # pragma: no cover
    # returns -1, or the batch row of the first index out of its source's rows (nothing
    # copied then), or n where the counts do not add up to n
    n_leaves, n_sources, n = table[0], table[1], table[2]
    outs = _HEAD + n_leaves
    sources = outs + n_leaves
    buffers = sources + _PER_SOURCE * n_sources
    start = 0
    for s in range(n_sources):
        at = sources + _PER_SOURCE * s
        count, rows = table[at + 1], table[at + 2]
        index = numba.carray(voidptr(table[at]), (count,), np.int64)
        for i in range(count):
            if index[i] < 0 or index[i] >= rows:
                return start + i
        start += count
    if start != n:
        return n
    for leaf in range(n_leaves):
        nbytes, out = table[_HEAD + leaf], table[outs + leaf]
        align = out | nbytes
        for s in range(n_sources):
            align |= table[buffers + s * n_leaves + leaf]
        start = 0
        for s in range(n_sources):
            at = sources + _PER_SOURCE * s
            count, rows = table[at + 1], table[at + 2]
            index = numba.carray(voidptr(table[at]), (count,), np.int64)
            src = table[buffers + s * n_leaves + leaf]
            if align % 8 == 0:
                _nb_copy(src, index, rows, out, start, nbytes // 8, np.uint64)
            elif align % 4 == 0:
                _nb_copy(src, index, rows, out, start, nbytes // 4, np.uint32)
            elif align % 2 == 0:
                _nb_copy(src, index, rows, out, start, nbytes // 2, np.uint16)
            else:
                _nb_copy(src, index, rows, out, start, nbytes, np.uint8)
            start += count
    if table[3] != 0:  # the combined index and the source position of every row
        combined = numba.carray(voidptr(table[3]), (n,), np.int64)
        position = numba.carray(voidptr(table[4]), (n,), np.int64)
        start = 0
        for s in range(n_sources):
            at = sources + _PER_SOURCE * s
            count, offset, pos = table[at + 1], table[at + 3], table[at + 4]
            index = numba.carray(voidptr(table[at]), (count,), np.int64)
            for i in range(count):
                combined[start + i] = index[i] + offset
                position[start + i] = pos
            start += count
    return -1


def _fits(buf: Any, shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Whether the kernel may read ``buf`` as contiguous rows of ``shape`` and ``dtype``."""
    return (
        isinstance(buf, torch.Tensor)
        and buf.is_cpu
        and buf.layout is torch.strided
        and buf.dtype is dtype
        and tuple(buf.shape[1:]) == tuple(shape)
        and buf.dim() == len(shape) + 1
        and buf.is_contiguous()
        and not buf.is_conj()
        and not buf.is_neg()
    )


def _as_index(idx: torch.Tensor) -> torch.Tensor:
    if idx.dtype is not torch.int64 or not idx.is_cpu or not idx.is_contiguous():
        idx = idx.to("cpu", torch.int64).contiguous()
    if idx.dim() != 1:
        raise ValueError(f"indices: 1-d tensors expected, got shape {tuple(idx.shape)}")
    return idx


def _run(
    row_bytes: list[int],
    outputs: Sequence[torch.Tensor],
    sources: Sequence[tuple[torch.Tensor, int, int, int]],
    buffers: Sequence[Sequence[torch.Tensor]],
    n: int,
    columns: tuple[torch.Tensor, torch.Tensor] | None,
) -> None:
    """Build the table (addresses read now) and call the kernel; everything is checked.

    ``sources``: per source ``(index, rows, offset, position)``.
    """
    table = [len(outputs), len(sources), n]
    table += (0, 0) if columns is None else (columns[0].data_ptr(), columns[1].data_ptr())
    table += row_bytes
    table += [out.data_ptr() for out in outputs]
    for idx, rows, offset, position in sources:
        table += (idx.data_ptr(), idx.shape[0], rows, offset, position)
    for bufs in buffers:
        table += [b.data_ptr() for b in bufs]
    bad = _nb_gather(np.array(table, dtype=np.int64))
    if bad >= 0:
        start = 0
        for idx, rows, _, _ in sources:
            if bad < start + idx.shape[0]:
                value = int(idx[bad - start])
                raise IndexOutOfRangeError(
                    f"index {value} is out of range for a source of {rows} rows"
                )
            start += idx.shape[0]
        raise ValueError(f"the indices hold {start} rows, the outputs {n}")


def gather_rows(
    buffers: Sequence[Sequence[torch.Tensor]],
    indices: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    offsets: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``outputs[l] = cat([buffers[s][l][indices[s]] for s])`` by one kernel call.

    Everything is checked first: each buffer must be a contiguous CPU tensor of its output's
    dtype and per-row shape, each output a contiguous CPU tensor of ``sum(len(indices))``
    rows. With ``offsets`` and ``positions`` (one per source) it also returns the combined
    index ``cat([indices[s] + offsets[s]])`` and the source column (``positions[s]`` per row).

    Raises:
        IndexError: an index outside ``[0, rows)`` of its buffers (nothing is copied then).
        ValueError: tensors the kernel cannot read.
    """
    index = [_as_index(i) for i in indices]
    n = sum(int(i.shape[0]) for i in index)
    for out in outputs:
        if not _fits(out, tuple(out.shape[1:]), out.dtype) or out.shape[0] != n:
            raise ValueError(f"outputs: contiguous CPU tensors of {n} rows expected")
    if len(buffers) != len(index):
        raise ValueError(f"buffers: one list per source ({len(index)}), got {len(buffers)}")
    for s, bufs in enumerate(buffers):
        if len(bufs) != len(outputs) or not all(
            _fits(b, tuple(o.shape[1:]), o.dtype) for b, o in zip(bufs, outputs, strict=True)
        ):
            raise ValueError(f"buffers[{s}]: contiguous CPU tensors like the outputs expected")
    rows = [min((int(b.shape[0]) for b in bufs), default=0) for bufs in buffers]
    columns = None
    if offsets is not None and positions is not None:
        columns = (torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64))
    offsets = [0] * len(index) if offsets is None else offsets
    positions = [0] * len(index) if positions is None else positions
    row_bytes = [o.element_size() * (o.numel() // n if n else 0) for o in outputs]
    sources = list(zip(index, rows, offsets, positions, strict=True))
    _run(row_bytes, outputs, sources, buffers, n, columns)
    return columns


def gather_reference(
    buffers: Sequence[Sequence[torch.Tensor]], indices: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """The torch reference of :func:`gather_rows`: ``index_select`` per source, then ``cat``."""
    pieces = [
        [b.index_select(0, i) for b in bufs] for bufs, i in zip(buffers, indices, strict=True)
    ]
    return [torch.cat(column) for column in zip(*pieces, strict=True)]


class RowGather:
    """The CPU gather of a mixture's sources; remembers which buffers it checked.

    Pickled empty: a copy checks the buffers it is given anew.
    """

    def __init__(self) -> None:
        self._layout: Layout | None = None
        self._row_bytes: list[int] = []
        self._checked: dict[int, tuple[tuple[weakref.ref[torch.Tensor], ...], int]] = {}
        self._templates: dict[int, list[torch.Tensor]] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (RowGather, ())

    def _bind(self, layout: Layout) -> None:
        """Start over for a new layout (what was checked was checked against the old one)."""
        self._layout, self._checked, self._templates = layout, {}, {}
        self._row_bytes = [leaf.numel * leaf.dtype.itemsize for leaf in layout.leaves]

    def rows(self, key: int, bufs: list[torch.Tensor], layout: Layout) -> int:
        """The rows the kernel may read from ``bufs`` (source ``key``'s), ``-1``: it may not.

        ``bufs``: one tensor per leaf of ``layout``. A buffer is checked once; while the
        same tensor objects come back, the check stands.
        """
        if self._layout is not layout:
            self._bind(layout)
        got = self._checked.get(key)
        if got is not None:
            refs, bound = got
            if len(refs) == len(bufs):
                for ref, buf in zip(refs, bufs, strict=True):
                    if ref() is not buf:
                        break
                else:
                    return bound
        leaves = layout.leaves
        if len(bufs) != len(leaves) or not all(
            _fits(b, f.shape, f.dtype) for b, f in zip(bufs, leaves, strict=True)
        ):
            self._checked.pop(key, None)
            return -1
        bound = min((int(b.shape[0]) for b in bufs), default=0)
        self._checked[key] = (tuple(weakref.ref(b) for b in bufs), bound)
        return bound

    def outputs(self, n: int, layout: Layout) -> list[torch.Tensor]:
        """Fresh contiguous CPU leaves of ``n`` rows (``empty_like`` of cached templates)."""
        if self._layout is not layout:
            self._bind(layout)
        templates = self._templates.get(n)
        if templates is None:
            if len(self._templates) > 8:  # batch sizes seen: a handful
                self._templates.clear()
            templates = [torch.empty((n, *f.shape), dtype=f.dtype) for f in layout.leaves]
            templates.append(torch.empty(n, dtype=torch.int64))  # the index and source columns
            self._templates[n] = templates
        empty_like = torch.empty_like
        return [empty_like(t) for t in templates[:-1]]

    def column(self, n: int) -> torch.Tensor:
        """A fresh int64 column of ``n`` rows (after :meth:`outputs` for ``n``)."""
        return torch.empty_like(self._templates[n][-1])

    def __call__(
        self,
        parts: Sequence[tuple[Any, torch.Tensor]],
        buffers: Sequence[list[torch.Tensor]],
        n: int,
        layout: Layout,
        columns: bool,
    ) -> tuple[list[torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None] | None:
        """The leaves of ``layout`` at each part's ``(source, indices)``, from ``buffers``.

        ``buffers[i]``: part ``i``'s source's backing tensor per leaf. With ``columns``, also
        the batch's ``"index"`` (combined) and ``"source"`` columns. ``None`` where a
        buffer is not one the kernel reads (the caller gathers otherwise).

        Raises:
            IndexError: an index outside its source's rows (nothing is returned).
        """
        sources = []
        for (source, idx), bufs in zip(parts, buffers, strict=True):
            bound = self.rows(source.position, bufs, layout)
            if bound < 0:
                return None
            sources.append((_as_index(idx), bound, source.offset, source.position))
        outputs = self.outputs(n, layout)
        cols = (self.column(n), self.column(n)) if columns else None
        _run(self._row_bytes, outputs, sources, buffers, n, cols)
        return outputs, cols
