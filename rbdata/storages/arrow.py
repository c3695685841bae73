"""``ArrowStorage``: items in Arrow IPC (Feather v2) chunk files, memory-mapped.

On disk, a storage directory holds:

- ``_rbdata.json``: format name and version, capacity, chunk size, layout, filled length and
  the slot after the last write (where a ring writer resumes);
- ``chunk-000000.arrow``, ...: chunk ``k`` holds slots ``[k * chunk_size, (k + 1) *
  chunk_size)`` in slot order, as one record batch of a plain Arrow IPC file. Column names
  are the keys joined by ``"."`` (``"data"`` for plain-tensor items).

Names starting with ``_`` or ``.`` are skipped by ``pyarrow.dataset``, so
``pyarrow.dataset.dataset(path, format="arrow")`` (and polars, duckdb) read exactly the stored
rows once the storage is flushed or closed.

**The unit of rewrite is a chunk.** Writes go to the chunk in memory (opened from its file
once, on the first write to it); a chunk is written back as a whole new file (atomically:
a temporary file, then ``os.replace``) when the write cursor leaves it, and on :meth:`flush`,
:meth:`close` and pickling. A ring writer therefore writes each chunk once per lap, and the
newest ``capacity`` rows are always stored exactly. The trade-off: a random ``set`` into
several chunks rewrites each of them (``chunk_size`` rows each), and rows in the chunk under
the cursor reach the disk at the next flush, not at once (unlike :class:`MemmapStorage`,
whose every write is in shared memory).

When every leaf is fixed-shape, a *full* chunk is not rewritten: its fixed-size Arrow
buffers are written in place through a writable mapping of the file (still valid Arrow), so
a ring on its second lap costs about what :class:`MemmapStorage` costs. Bool leaves are
stored as ``uint8`` 0/1 (field metadata ``rbdata.dtype = "bool"``) for that reason: Arrow's
own booleans are bit-packed.
"""

from __future__ import annotations

import ctypes
import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorStack

from rbdata._layout import RAGGED, STRING, TENSOR, Key, Layout, Leaf
from rbdata._numba import HAS_NUMBA
from rbdata._numba import voidptr as _nb_voidptr
from rbdata.storages._files import atomic_write_json, read_meta, storage_dir
from rbdata.storages.base import Prepared, Storage

if HAS_NUMBA:  # pragma: no branch - numba is a core dependency
    import numba

__all__ = ["ArrowStorage"]

_FORMAT = "rbdata.arrow"
_VERSION = 1
_META_FILE = "_rbdata.json"
_DEFAULT_CHUNK = 1 << 16

_TORCH_TO_NUMPY = {
    torch.float64: np.float64,
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.ipc
    except ImportError as err:  # pragma: no cover - the test environment has pyarrow
        raise ImportError("ArrowStorage needs pyarrow: pip install 'rbdata[arrow]'") from err
    return pyarrow


def _column_name(key: Key) -> str:
    return ".".join(key) or "data"


def _chunk_file(k: int) -> str:
    return f"chunk-{k:06d}.arrow"


if HAS_NUMBA:

    @numba.njit(cache=True, nogil=True, inline="always")
    def _nb_copy_rows(
        src_addresses: Any, chunk_size: int, index: Any, width: int, out_address: int, dtype: Any
    ) -> None:  # pragma: no cover
        # rows of ``width`` elements of ``dtype``: element loops, no per-row slice objects
        n = index.shape[0]
        out = numba.carray(_nb_voidptr(out_address), (n * width,), dtype)
        for i in range(n):
            k = index[i] // chunk_size
            row = index[i] - k * chunk_size
            src = numba.carray(_nb_voidptr(src_addresses[k]), ((row + 1) * width,), dtype)
            for e in range(width):
                out[i * width + e] = src[row * width + e]

    @numba.njit(cache=True, nogil=True)
    def _nb_gather_rows(
        addresses: Any, chunk_size: int, index: Any, row_bytes: Any, out_addresses: Any
    ) -> None:  # pragma: no cover
        # every leaf at once: out[leaf][i] = chunk[leaf][index[i] // chunk_size][row], copied
        # in the widest unit that divides the row (buffers are at least 8-byte aligned)
        for leaf in range(addresses.shape[0]):
            width = row_bytes[leaf]
            src, out = addresses[leaf], out_addresses[leaf]
            if width % 8 == 0:
                _nb_copy_rows(src, chunk_size, index, width // 8, out, np.uint64)
            elif width % 4 == 0:
                _nb_copy_rows(src, chunk_size, index, width // 4, out, np.uint32)
            elif width % 2 == 0:
                _nb_copy_rows(src, chunk_size, index, width // 2, out, np.uint16)
            else:
                _nb_copy_rows(src, chunk_size, index, width, out, np.uint8)


def _gather_rows(
    addresses: np.ndarray,
    chunk_size: int,
    index: np.ndarray,
    row_bytes: np.ndarray,
    out_addresses: np.ndarray,
) -> None:
    """Copy rows of fixed-shape leaves from per-chunk buffers into outputs (one call a batch)."""
    if HAS_NUMBA:
        _nb_gather_rows(addresses, chunk_size, index, row_bytes, out_addresses)
        return
    for leaf in range(addresses.shape[0]):  # pragma: no cover - numba is a core dependency
        width = int(row_bytes[leaf])
        for i, slot in enumerate(index.tolist()):
            k, row = divmod(slot, chunk_size)
            ctypes.memmove(
                int(out_addresses[leaf]) + i * width, int(addresses[leaf, k]) + row * width, width
            )


class _Chunk:
    """One chunk: sealed (a memory-mapped record batch) or open (mutable arrays in memory).

    ``fixed`` holds one numpy array per fixed-shape leaf (read-only views of the file when
    sealed, ``chunk_size``-row arrays when open); ``variable`` one list per string or ragged
    leaf (open chunks only; a sealed chunk reads them from ``batch``).
    """

    __slots__ = ("base", "batch", "file", "fixed", "rows", "variable", "writable")

    def __init__(self) -> None:
        self.batch: Any = None
        self.file: Path | None = None
        self.base = 0  # the address of the file's mapping (sealed)
        self.writable: list[np.ndarray] | None = None  # writable views of the file's columns
        self.fixed: list[np.ndarray] = []
        self.variable: list[list[Any]] = []
        self.rows = 0

    @property
    def is_open(self) -> bool:
        return self.batch is None


class ArrowStorage(Storage):
    """Items in memory-mapped Arrow IPC chunk files; keeps variable-length fields and strings.

    Args:
        max_size: capacity in items.
        path: directory for the files. ``None`` makes a temporary directory that is removed
            when the storage is closed or garbage-collected; an explicit path is kept. An
            explicit path that already holds files is refused: reopen it with
            :meth:`ArrowStorage.open`.
        chunk_size: rows per chunk file (the unit of rewrite, see the module docs).
        ragged: keys whose first dimension varies per item, for when the first write is a
            single item (a batch's list of tensors is recognised without it).

    What comes back, per Arrow column type:

    ======================================  ============================  ===================
    stored (first write gives)              Arrow type                    batch of ``B``
    ======================================  ============================  ===================
    tensor ``[B, *shape]``, numeric/bool    primitive, or                 tensor ``[B, *shape]``
                                            ``fixed_size_list`` (flat;
                                            bool as uint8)
    list of ``B`` tensors ``[L_i, *shape]``  ``list<...>``                 jagged nested tensor
    list of ``B`` ``str``                   ``string``                    ``NonTensorStack``
    ======================================  ============================  ===================

    A single item gives a tensor, a tensor ``[L, *shape]`` and a ``str`` respectively.

    Examples:
        >>> import torch
        >>> storage = ArrowStorage(100, chunk_size=8)
        >>> storage.set(slice(0, 3), {
        ...     "obs": torch.arange(6.0).view(3, 2),
        ...     "boxes": [torch.ones(2, 4), torch.ones(0, 4), torch.ones(1, 4)],
        ...     "text": ["go left", "stop", "go right"],
        ... })
        >>> batch = storage[[2, 0]]
        >>> batch["obs"].tolist(), batch["text"].tolist()
        ([[4.0, 5.0], [0.0, 1.0]], ['go right', 'go left'])
        >>> [b.shape for b in batch["boxes"].unbind()]
        [torch.Size([1, 4]), torch.Size([2, 4])]
        >>> storage.close()
    """

    def __init__(
        self,
        max_size: int,
        path: str | os.PathLike[str] | None = None,
        chunk_size: int | None = None,
        ragged: tuple[str | Key, ...] | list[str | Key] = (),
    ) -> None:
        _pyarrow()
        super().__init__(max_size, device="cpu")
        if chunk_size is None:
            chunk_size = min(self.capacity, _DEFAULT_CHUNK)
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        self.chunk_size = min(chunk_size, self.capacity)
        self._ragged = tuple((k,) if isinstance(k, str) else tuple(k) for k in ragged)
        root, self._finalizer = storage_dir(self, path, "rbdata-arrow-")
        self._path = root
        self._init_state()
        self._write_meta()

    def config(self) -> dict[str, Any]:
        """``max_size``, ``chunk_size`` and the declared ``ragged`` keys."""
        return {
            "max_size": self.capacity,
            "chunk_size": self.chunk_size,
            "ragged": [list(k) for k in self._ragged],
        }

    def _init_state(self) -> None:
        n_chunks = -(-self.capacity // self.chunk_size)
        self._chunks: list[_Chunk | None] = [None] * n_chunks
        self._fixed: list[int] = []  # positions of fixed-shape leaves in the layout
        self._variable: list[int] = []
        self._addresses: np.ndarray | None = None  # [fixed leaf, chunk] buffer addresses
        self._row_bytes = np.zeros(0, np.int64)
        self._specs: list[tuple[tuple[int, ...], torch.dtype]] = []
        self._closed = False

    # --- opening, closing, pickling --------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> ArrowStorage:
        """Reopen a flushed or closed storage directory read/write (e.g. after a restart).

        Chunk files are checked against the metadata: a missing or short chunk is refused.
        """
        pa = _pyarrow()
        root = Path(path)
        meta = read_meta(root, _META_FILE, _FORMAT, _VERSION, "ArrowStorage")
        meta_file = root / _META_FILE
        self = cls.__new__(cls)
        Storage.__init__(self, int(meta["capacity"]), device="cpu")
        self.chunk_size = int(meta["chunk_size"])
        self._ragged = tuple(tuple(k) for k in meta.get("ragged", []))
        self._finalizer = None
        self._path = root
        self._init_state()
        length, next_slot = int(meta["length"]), int(meta["next"])
        if not 0 <= length <= self.capacity or not 0 <= next_slot < self.capacity:
            raise ValueError(f"{meta_file}: length {length} / next slot {next_slot} out of range")
        if "layout" in meta:
            self._set_layout(Layout.from_json(meta["layout"]))
        for k in range(len(self._chunks)):
            expected = min(self.chunk_size, max(0, length - k * self.chunk_size))
            file = root / _chunk_file(k)
            if not expected:
                continue
            if not file.is_file():
                raise ValueError(f"{file}: missing; the metadata says {expected} rows")
            try:
                chunk = self._sealed_chunk(file)
            except (OSError, pa.ArrowInvalid) as err:
                raise ValueError(f"{file}: not a readable Arrow IPC file ({err})") from err
            if chunk.rows < expected:
                raise ValueError(
                    f"{file}: {chunk.rows} rows, expected {expected}; truncated or corrupt"
                )
            self._chunks[k] = chunk
        self._length, self._next = length, next_slot
        return self

    def flush(self) -> None:
        """Write every chunk held in memory to its file and the metadata (then plain Arrow)."""
        if self._closed:
            raise ValueError("the storage is closed")
        for k, chunk in enumerate(self._chunks):
            if chunk is not None and chunk.is_open:
                self._seal(k)
        self._write_meta()

    def close(self) -> None:
        """Flush, then unmap the files; a temporary directory (``path=None``) is removed."""
        if self._closed:
            return
        if self._finalizer is None:
            self.flush()
        self._chunks = [None] * len(self._chunks)
        self._addresses = None
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    def __getstate__(self) -> dict[str, Any]:
        self.flush()  # the receiving process maps the files: they must hold every row
        return {"path": str(self._path)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        other = type(self).open(state["path"])
        self.__dict__.update(other.__dict__)
        other.__dict__.clear()

    @property
    def path(self) -> Path:
        """The storage directory."""
        return self._path

    def clear(self) -> None:
        """Forget all items; the chunk files are removed (the layout is kept)."""
        super().clear()
        for k in range(len(self._chunks)):
            (self._path / _chunk_file(k)).unlink(missing_ok=True)
        self._chunks = [None] * len(self._chunks)
        self._addresses = None
        self._write_meta()

    def _write_meta(self, fsync: bool = True) -> None:
        meta: dict[str, Any] = {
            "format": _FORMAT,
            "version": _VERSION,
            "capacity": self.capacity,
            "chunk_size": self.chunk_size,
            "ragged": [list(k) for k in self._ragged],
            "length": self._length,
            "next": self._next,
        }
        if self._layout is not None:
            meta["layout"] = self._layout.to_json()
        atomic_write_json(self._path / _META_FILE, meta, fsync)

    # --- reading -----------------------------------------------------------------------------
    def column(self, key: str | Key, chunk: int = 0) -> Any:
        """The rows of one leaf in one chunk, without a copy for fixed-shape leaves.

        A fixed-shape leaf gives a **read-only** tensor ``[rows, *shape]`` that views the
        memory-mapped file (or the chunk held in memory); bool leaves are bit-packed in Arrow
        and come back as a copy. Variable leaves give a list.
        """
        layout = self._layout
        key = (key,) if isinstance(key, str) else tuple(key)
        if layout is None or key not in layout.keys:
            raise KeyError(f"no key {key!r} in this storage")
        c = self._chunks[chunk] if 0 <= chunk < len(self._chunks) else None
        if c is None:
            raise IndexError(f"chunk {chunk} holds no rows")
        pos = layout.keys.index(key)
        # an open chunk holds chunk_size rows, filled or not: only the filled ones are rows
        rows = min(c.rows, max(0, self._length - chunk * self.chunk_size))
        if pos in self._fixed:
            view = c.fixed[self._fixed.index(pos)][:rows]
            with warnings.catch_warnings():  # a read-only mapping: documented as read-only
                warnings.simplefilter("ignore", UserWarning)
                return torch.from_numpy(view)
        return self._variable_rows(c, self._variable.index(pos), np.arange(rows))

    def _gather(self, idx: torch.Tensor, extra: dict[str, torch.Tensor] | None) -> Any:
        if self._closed:  # the chunks are unmapped: the gather kernel would read address 0
            raise ValueError("the storage is closed")
        layout = self._layout
        if layout is None:
            raise IndexError("the storage is empty")
        n = int(idx.shape[0])
        slots = idx.numpy()
        if not slots.flags.c_contiguous:
            slots = np.ascontiguousarray(slots)
        outputs: list[Any] = []
        if self._fixed:
            if self._addresses is None:
                self._refresh_addresses()
            outputs = [torch.empty((n, *shape), dtype=dtype) for shape, dtype in self._specs]
            _gather_rows(
                self._addresses,  # type: ignore[arg-type]
                self.chunk_size,
                slots,
                self._row_bytes,
                np.array([out.data_ptr() for out in outputs], dtype=np.int64),
            )
        if self._variable:  # back to layout order
            leaves = layout.leaves
            fixed, outputs = outputs, [None] * len(leaves)
            for pos, out in zip(self._fixed, fixed, strict=True):
                outputs[pos] = out
            for j, pos in enumerate(self._variable):
                outputs[pos] = self._gather_variable(leaves[pos], j, slots)
        return layout.assemble(outputs, torch.Size((n,)), self.device, extra)

    def _get(self, index: int) -> Any:
        batch = self._gather(torch.tensor([index]), None)
        layout = self._layout
        assert layout is not None
        if layout.kind == TENSOR:
            return batch[0]
        item = batch[0]
        for pos in self._variable:  # a string item: the str itself
            if layout.leaves[pos].kind == STRING:
                item.set_non_tensor(layout.keys[pos], batch.get(layout.keys[pos])[0])
        return item

    def _gather_variable(self, leaf: Leaf, j: int, slots: np.ndarray) -> Any:
        values: list[Any] = [None] * len(slots)
        chunk_of = slots // self.chunk_size
        for k in np.unique(chunk_of).tolist():
            where = np.nonzero(chunk_of == k)[0]
            rows = slots[where] - k * self.chunk_size
            c = self._chunks[k]
            assert c is not None
            for w, v in zip(where.tolist(), self._variable_rows(c, j, rows), strict=True):
                values[w] = v
        if leaf.kind == STRING:
            return NonTensorStack.from_list(values)
        if not values:
            return torch.empty((0, 0, *leaf.shape), dtype=leaf.dtype)
        lengths = torch.tensor([len(v) for v in values], dtype=torch.long)
        offsets = torch.zeros(len(values) + 1, dtype=torch.long)
        torch.cumsum(lengths, 0, out=offsets[1:])
        # np.concatenate copies into a new, writable array: torch.from_numpy on each row, a
        # read-only view of a sealed (memory-mapped) chunk, warned "not writable" (an error
        # under -W error) and then copied anyway in torch.cat
        flat = torch.from_numpy(np.concatenate(values)).to(leaf.dtype)
        return torch.nested.nested_tensor_from_jagged(flat, offsets)

    def _variable_rows(self, c: _Chunk, j: int, rows: np.ndarray) -> list[Any]:
        if c.is_open:
            column = c.variable[j]
            return [column[r] for r in rows.tolist()]
        pa = _pyarrow()
        leaf = self._layout.leaves[self._variable[j]]  # type: ignore[union-attr]
        taken = c.batch.column(self._variable[j]).take(pa.array(rows))
        if leaf.kind == STRING:
            return [s if s is not None else "" for s in taken.to_pylist()]
        lengths = pa.compute.list_value_length(taken).fill_null(0).to_numpy()
        flat = taken.flatten()
        if leaf.shape:
            flat = flat.flatten()
        values = flat.to_numpy(zero_copy_only=False).reshape(-1, *leaf.shape)
        return np.split(values, np.cumsum(lengths)[:-1])

    # --- writing -------------------------------------------------------------------------
    def _infer_layout(self, data: Any, batched: bool) -> Layout:
        """The first write's layout; string and ragged leaves allowed, dtypes Arrow keeps."""
        layout = Layout.from_data(data, batched, variable=True, ragged=self._ragged)
        for leaf in layout.leaves:
            if leaf.kind != STRING and leaf.dtype not in _TORCH_TO_NUMPY:
                raise TypeError(
                    f"key {leaf.name}: ArrowStorage cannot store dtype {leaf.dtype}; "
                    f"supported: {', '.join(str(d)[6:] for d in _TORCH_TO_NUMPY)}"
                )
        return layout

    def _set_layout(self, layout: Layout) -> None:
        self._layout = layout
        self._fixed = [i for i, leaf in enumerate(layout.leaves) if leaf.kind == TENSOR]
        self._variable = [i for i, leaf in enumerate(layout.leaves) if leaf.kind != TENSOR]
        self._specs = [(layout.leaves[i].shape, layout.leaves[i].dtype) for i in self._fixed]
        self._row_bytes = np.array(
            [layout.leaves[i].numel * layout.leaves[i].dtype.itemsize for i in self._fixed],
            dtype=np.int64,
        )

    def _allocate(self, layout: Layout) -> None:
        self._set_layout(layout)
        self._write_meta()

    def commit(self, index: int | list[slice] | torch.Tensor, prepared: Prepared) -> None:
        """Write prepared data, then write back every chunk the cursor has left."""
        if self._closed:
            raise ValueError("the storage is closed")
        super().commit(index, prepared)
        tail = self._next // self.chunk_size
        sealed = False
        for k, chunk in enumerate(self._chunks):
            if chunk is not None and chunk.is_open and k != tail:
                self._seal(k)
                sealed = True
        if sealed:  # durable at the next flush (fsync'ed): a write must not wait for the disk
            self._write_meta(fsync=False)

    def _set_length(self, n: int) -> None:
        # rows between the old and the new length exist (zeros, empty, "") in open chunks
        cs = self.chunk_size
        for k in range(self._length // cs, -(-n // cs)):
            self._open_chunk(k)
        self._length = n

    def _open_chunk(self, k: int) -> _Chunk:
        """The chunk ``k`` in memory, opened from its file (a copy) or new."""
        chunk = self._chunks[k]
        if chunk is not None and chunk.is_open:
            return chunk
        layout = self._layout
        assert layout is not None
        rows = min(self.chunk_size, self.capacity - k * self.chunk_size)
        new = _Chunk()
        new.rows = rows
        for pos in self._fixed:
            leaf = layout.leaves[pos]
            new.fixed.append(np.zeros((rows, *leaf.shape), dtype=_TORCH_TO_NUMPY[leaf.dtype]))
        for pos in self._variable:
            leaf = layout.leaves[pos]
            empty = (
                ""
                if leaf.kind == STRING
                else np.zeros((0, *leaf.shape), _TORCH_TO_NUMPY[leaf.dtype])
            )
            new.variable.append([empty] * rows)
        if chunk is not None:  # copy the sealed rows
            held = chunk.rows
            for dst, src in zip(new.fixed, chunk.fixed, strict=True):
                dst[:held] = src[:held]
            for j, column in enumerate(new.variable):
                column[:held] = self._variable_rows(chunk, j, np.arange(held))
        self._chunks[k] = new
        self._addresses = None
        return new

    def _write(self, index: list[slice] | torch.Tensor, payload: list[Any]) -> None:
        fixed = self._fixed_arrays(payload)
        if isinstance(index, torch.Tensor):
            self._write_slots(index.numpy(), fixed, payload)
            return
        cs, offset = self.chunk_size, 0
        for run in index:  # contiguous runs (a ring writer's path): slice copies per chunk
            start = run.start
            while start < run.stop:
                k = start // cs
                stop = min(run.stop, (k + 1) * cs)
                row, count = start - k * cs, stop - start
                targets, chunk = self._targets(k)
                for dst, src in zip(targets, fixed, strict=True):
                    dst[row : row + count] = src[offset : offset + count]
                for j, pos in enumerate(self._variable):
                    values = payload[pos][offset : offset + count]
                    chunk.variable[j][row : row + count] = self._variable_values(pos, values)
                offset += count
                start = stop

    def _write_one(self, index: int, payload: list[Any]) -> None:
        layout = self._layout
        assert layout is not None
        batch = [
            [v] if layout.leaves[i].kind != TENSOR else torch.as_tensor(v).unsqueeze(0)
            for i, v in enumerate(payload)
        ]
        slot = np.array([index], dtype=np.int64)
        self._write_slots(slot, self._fixed_arrays(batch), batch)

    def _fixed_arrays(self, payload: list[Any]) -> list[np.ndarray]:
        layout = self._layout
        assert layout is not None
        return [
            payload[pos].detach().to(device="cpu", dtype=layout.leaves[pos].dtype).numpy()
            for pos in self._fixed
        ]

    def _variable_values(self, pos: int, values: list[Any]) -> list[Any]:
        leaf = self._layout.leaves[pos]  # type: ignore[union-attr]
        if leaf.kind == RAGGED:
            return [v.detach().to(device="cpu", dtype=leaf.dtype).numpy() for v in values]
        return list(values)

    def _write_slots(self, slots: np.ndarray, fixed: list[np.ndarray], payload: list[Any]) -> None:
        cs = self.chunk_size
        chunk_of = slots // cs
        for k in np.unique(chunk_of).tolist():
            targets, chunk = self._targets(k)
            where = np.nonzero(chunk_of == k)[0]
            rows = slots[where] - k * cs
            for dst, src in zip(targets, fixed, strict=True):
                dst[rows] = src[where]  # duplicates: the last one wins, as in numpy
            for j, pos in enumerate(self._variable):
                values = self._variable_values(pos, [payload[pos][w] for w in where.tolist()])
                column = chunk.variable[j]
                for r, v in zip(rows.tolist(), values, strict=True):
                    column[r] = v

    # --- chunk files -----------------------------------------------------------------------
    def _seal(self, k: int) -> None:
        """Write open chunk ``k`` (its filled rows) to its file and map the file."""
        pa = _pyarrow()
        chunk = self._chunks[k]
        assert chunk is not None and chunk.is_open
        layout = self._layout
        assert layout is not None
        rows = min(chunk.rows, max(0, self._length - k * self.chunk_size))
        columns, fields = [], []
        fixed_iter, variable_iter = iter(chunk.fixed), iter(chunk.variable)
        for leaf in layout.leaves:
            if leaf.kind == TENSOR:
                array = _fixed_array(pa, next(fixed_iter)[:rows], leaf)
            elif leaf.kind == STRING:
                array = pa.array(next(variable_iter)[:rows], pa.string())
            else:
                array = _ragged_array(pa, next(variable_iter)[:rows], leaf)
            meta = {
                "rbdata.shape": json.dumps(list(leaf.shape)),
                "rbdata.dtype": str(leaf.dtype)[6:],
            }
            fields.append(pa.field(_column_name(leaf.key), array.type, metadata=meta))
            columns.append(array)
        batch = pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))
        file = self._path / _chunk_file(k)
        tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
        os.replace(tmp, file)
        self._chunks[k] = self._sealed_chunk(file)
        self._addresses = None

    def _sealed_chunk(self, file: Path) -> _Chunk:
        """Map a chunk file: zero-copy read-only views of its fixed-shape columns."""
        pa = _pyarrow()
        layout = self._layout
        assert layout is not None
        source = pa.memory_map(str(file))
        chunk = _Chunk()
        chunk.file = file
        chunk.base = source.read_buffer(1).address  # byte 0 of the mapping
        source.seek(0)
        batch = chunk.batch = pa.ipc.open_file(source).get_batch(0)
        chunk.rows = batch.num_rows
        for pos in self._fixed:
            leaf = layout.leaves[pos]
            column = batch.column(pos)
            flat = column.flatten() if leaf.shape else column
            view = flat.to_numpy(zero_copy_only=True)  # bools are stored as uint8
            expected = np.uint8 if leaf.dtype is torch.bool else _TORCH_TO_NUMPY[leaf.dtype]
            if view.dtype != expected or view.size != batch.num_rows * leaf.numel:
                # the gather kernel trusts these buffers: a foreign file must not reach it
                raise ValueError(
                    f"{file}: column {_column_name(leaf.key)!r} holds {view.size} "
                    f"{view.dtype} values, expected {batch.num_rows * leaf.numel} "
                    f"{np.dtype(expected)} for the layout"
                )
            if leaf.dtype is torch.bool:
                view = view.view(np.bool_)
            chunk.fixed.append(view.reshape(batch.num_rows, *leaf.shape))
        return chunk

    def _targets(self, k: int) -> tuple[list[np.ndarray], _Chunk]:
        """Where a write to chunk ``k`` goes: its file in place, or the chunk in memory.

        A full chunk of a layout without variable-length leaves is written in place
        through a writable mapping of its file (fixed-size Arrow buffers stay valid Arrow),
        like :class:`MemmapStorage`: a ring on its second lap rewrites no file.
        """
        chunk = self._chunks[k]
        full = min(self.chunk_size, self.capacity - k * self.chunk_size)
        if chunk is None or chunk.is_open or self._variable or chunk.rows != full:
            chunk = self._open_chunk(k)
            return chunk.fixed, chunk
        if chunk.writable is None:
            whole = np.memmap(chunk.file, dtype=np.uint8, mode="r+")  # type: ignore[call-overload]
            views = []
            for view in chunk.fixed:
                start = view.ctypes.data - chunk.base
                raw = whole[start : start + view.nbytes]
                views.append(raw.view(view.dtype).reshape(view.shape))
            chunk.writable = views
        return chunk.writable, chunk

    def _refresh_addresses(self) -> None:
        addresses = np.zeros((len(self._fixed), len(self._chunks)), np.int64)
        for k, chunk in enumerate(self._chunks):
            if chunk is not None:
                for j, array in enumerate(chunk.fixed):
                    addresses[j, k] = array.ctypes.data
        self._addresses = addresses


def _fixed_array(pa: Any, values: np.ndarray, leaf: Leaf) -> Any:
    flat_values = np.ascontiguousarray(values).reshape(-1)
    if leaf.dtype is torch.bool:  # uint8 0/1 (field metadata rbdata.dtype=bool): zero-copy
        flat_values = flat_values.view(np.uint8)
    flat = pa.array(flat_values)
    if not leaf.shape:
        return flat
    return pa.FixedSizeListArray.from_arrays(flat, leaf.numel)


def _ragged_array(pa: Any, items: list[np.ndarray], leaf: Leaf) -> Any:
    lengths = np.array([len(v) for v in items], dtype=np.int64)
    offsets = np.zeros(len(items) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    dtype = _TORCH_TO_NUMPY[leaf.dtype]
    values = (
        np.concatenate([np.asarray(v, dtype=dtype).reshape(-1) for v in items])
        if items
        else np.zeros(0, dtype)
    )
    inner = pa.array(values)
    if leaf.shape:
        inner = pa.FixedSizeListArray.from_arrays(inner, leaf.numel)
    return pa.ListArray.from_arrays(pa.array(offsets), inner)
