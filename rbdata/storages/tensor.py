"""``TensorStorage``: items in preallocated tensors, on CPU or CUDA."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rbdata._core.device import resolve_device
from rbdata._core.layout import STRING, TENSOR, Layout
from rbdata._core.torchrl_names import TENSOR_KEYWORDS, refuse_data_capacity, torchrl_keywords
from rbdata.errors import CheckpointError
from rbdata.storages import _memory
from rbdata.storages._persist import check_config, saved_counts
from rbdata.storages._staging import same_device, to_device
from rbdata.storages._unpack import ItemUnpacker, numpy_views
from rbdata.storages.base import Codec, Prepared, SavedStorage, Storage, WriteTarget

if TYPE_CHECKING:
    from rbdata.storages._describe import StorageInfo

__all__ = ["TensorStorage"]


class TensorStorage(Storage):
    """Preallocated tensors, one per leaf, shaped ``[capacity, *item_shape]``.

    The layout (keys, per-item shapes, dtypes) is taken from the first write. Reads
    gather every leaf with one ``index_select`` and build the output once.

    Args:
        max_size: capacity in items.
        device: where the tensors live (``None``: CPU; ``"cuda"`` for GPU memory).

    Raises:
        RuntimeError: if ``device`` is not available (e.g. ``"cuda"`` without CUDA).
        TypeError: if ``max_size`` is data (torchrl's ``TensorStorage(tensor)``, which is
            ``TensorStorage(len(data))`` then ``extend(data)`` here).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> storage = TensorStorage(100)
        >>> storage.set(slice(0, 4), TensorDict({"obs": torch.arange(8.0).view(4, 2)}, [4]))
        >>> len(storage), storage[[3, 0]]["obs"].tolist()
        (4, [[6.0, 7.0], [0.0, 1.0]])
    """

    writes_rows = True  # write_row/write_rows write whenever the buffers are CPU numpy views
    _shared = False  # True for a MemmapStorage other processes write: no per-step path then

    @torchrl_keywords(TENSOR_KEYWORDS)
    def __init__(self, max_size: int, device: torch.device | str | None = None) -> None:
        refuse_data_capacity(self, max_size)  # torchrl's TensorStorage(tensor)
        super().__init__(max_size, device)
        resolve_device(self.device)  # refused here, at construction, if it cannot hold data
        self._buffers: list[torch.Tensor] = []
        # numpy views of CPU buffers: a one-row write through numpy costs ~half of torch's
        # ``buf[i] = t`` (the per-step ``add`` path of online agents). Torch may move the
        # memory under them (a pickle for a spawned worker, ``share_memory_``): ``_guard``
        # says when, and the write paths rebuild them first (``rbdata/storages/_memory.py``).
        self._np_buffers: list[np.ndarray] | None = None
        self._guard: _memory.Guard = ()
        self._move_lock = _memory.move_lock()  # writes against moves of the memory (_memory)
        # the file mappings under the buffers, for storages that map files (torch follows them)
        self._mapped: list[_memory.Mapping | None] | None = None
        self._unpacker: ItemUnpacker | None = None  # see add_fast
        self._unpack: Callable[[Any], list[Any] | None] | None = None
        self._plain = False

    def config(self) -> dict[str, Any]:
        """``max_size`` and ``device``."""
        return {"max_size": self.capacity, "device": str(self.device)}

    def _set_buffers(
        self,
        buffers: list[torch.Tensor],
        layout: Layout,
        mapped: list[_memory.Mapping | None] | None = None,
    ) -> None:
        """Take ``buffers`` (``mapped``: the file mappings they view, see ``_memory``)."""
        self._buffers = buffers
        self._plain = layout.kind == "tensor"
        self._mapped = mapped
        self._bind_views()
        unpacker = ItemUnpacker.for_layout(layout) if self._np_buffers is not None else None
        self._unpacker = unpacker
        self._unpack = None if unpacker is None else unpacker.unpack

    def _bind_views(self) -> list[np.ndarray] | None:
        """(Re)build the numpy views of the buffers and the guard that watches their memory."""
        views, self._guard = _memory.bind(self._tensors(), self._mapped)
        self._np_buffers = views
        return views

    def _views(self) -> list[np.ndarray] | None:
        """The numpy views, rebuilt first if torch moved the memory under them."""
        for t, ptr in self._guard:
            if t.data_ptr() != ptr:
                return self._bind_views()
        return self._np_buffers

    def _tensors(self) -> list[torch.Tensor]:
        """The buffers, re-bound first to the files they map if torch moved them away."""
        mapped = self._mapped
        if mapped is not None:
            _memory.rebind(self._buffers, mapped)
        return self._buffers

    @property
    def buffers(self) -> list[torch.Tensor]:
        """The backing tensors in layout order (views of all ``capacity`` slots)."""
        return self._tensors()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # CPU buffers: shared memory for another process, else each leaf's bytes once (_memory)
        state["_buffers"] = _memory.ship(self._tensors(), self._layout, self._move_lock)
        # numpy views would pickle as copies, mappings and locks are this process's: anew
        state["_np_buffers"] = state["_mapped"] = state["_move_lock"] = None
        state["_guard"] = ()
        state["_unpack"] = state["_unpacker"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._buffers = _memory.received(self._buffers)  # copy.copy passes the Shipment on
        self._move_lock = _memory.move_lock()
        if self._layout is not None:
            self._set_buffers(self._buffers, self._layout)

    def _allocate(self, layout: Layout) -> None:
        if self.device.type == "cpu":  # one block: one pointer for the write paths to watch
            buffers = _memory.arena(self.capacity, layout.leaves)
        else:
            buffers = [
                torch.zeros((self.capacity, *leaf.shape), dtype=leaf.dtype, device=self.device)
                for leaf in layout.leaves
            ]
        self._set_buffers(buffers, layout)

    def _payload_device(self) -> torch.device | None:
        # CUDA: prepare leaves CPU leaves where they are, then stages them itself (below)
        return None if self._device.type == "cuda" else self._device

    def prepare(self, data: Any, batched: bool) -> Prepared:
        """Validate ``data`` (see :meth:`Storage.prepare`); on CUDA, start its copy to the GPU.

        CPU leaves are copied (and cast) into pinned memory, then queued for the GPU with
        ``non_blocking=True``: the host never waits for the device, once per batch or ever
        (a pageable ``.to("cuda")`` would).
        """
        prepared = super().prepare(data, batched)
        if self._device.type == "cuda" and prepared.layout is not None:
            leaves = prepared.layout.leaves
            prepared.payload = [
                to_device(t, leaf.dtype, self._device) if isinstance(t, torch.Tensor) else t
                for t, leaf in zip(prepared.payload, leaves, strict=True)
            ]
        return prepared

    def _write(self, target: WriteTarget, payload: list[Any]) -> None:
        runs = target.runs
        with self._move_lock:  # no move of the memory while torch copies into it
            buffers = self._tensors()
            if runs is None:
                index = target.slots()
                idx = index.to(self.device, non_blocking=index.is_cpu)  # host to GPU: no wait
                for buf, t in zip(buffers, payload, strict=True):
                    buf.index_copy_(0, idx, t.to(device=buf.device, dtype=buf.dtype))
            elif len(runs) == 1:
                for buf, t in zip(buffers, payload, strict=True):
                    buf[runs[0]].copy_(t)
            else:
                offset = 0
                for run in runs:
                    stop = offset + run.stop - run.start
                    for buf, t in zip(buffers, payload, strict=True):
                        buf[run].copy_(t[offset:stop])
                    offset = stop

    def add_fast(self, slot: int, item: Any, check: Any = None) -> bool:
        """One item through numpy row writes, if its leaves match the layout exactly."""
        unpack = self._unpack
        if unpack is None or self._shared or self._closed:
            return False
        values = unpack(item)
        if values is None:
            return False
        if check is not None:
            check(slot, item)
        return self.write_row(slot, values)  # True: an unpacker implies numpy buffers

    def write_row(self, slot: int, values: list[Any]) -> bool:
        """Write one checked item at ``slot``: :meth:`write_rows` of one row per leaf.

        ``values``: one value per leaf in layout order that a numpy row assignment stores
        exactly (see ``rbdata/storages/_unpack.py``). ``False``: nothing written.
        """
        arrays = self._np_buffers
        if arrays is None or self._closed:
            return False
        with self._move_lock:  # no move between the check and the last byte (see _memory)
            for t, ptr in self._guard:  # torch moved the memory (pickled, shared): views anew
                if t.data_ptr() != ptr:
                    arrays = self._bind_views()
                    assert arrays is not None
            for arr, value in zip(arrays, values, strict=True):
                arr[slot] = value
        top = slot + 1
        if top > self._length:
            self._length = top
        self._next, self._items_written = top % self._capacity, self._items_written + 1
        return True

    def _unpack_batch(
        self, start: int, data: Any, check: Any
    ) -> tuple[list[Any], int, torch.Tensor] | None:
        """A small batch's leaves, size and ring slots from ``start`` (``check`` passed)."""
        unpacker = self._unpacker
        if unpacker is None or self._shared or self._closed:
            return None
        got = unpacker.unpack_batch(data)
        cap = self._capacity
        if got is None or got[1] > cap:  # too big: the general path says so
            return None
        values, n = got
        slots = np.arange(start, start + n)  # numpy's arange + from_numpy: half torch's cost
        if start + n > cap:
            np.remainder(slots, cap, out=slots)
        index = torch.from_numpy(slots)
        if check is not None:
            check(index, data)
        return values, n, index

    def _put_rows(self, start: int, n: int, values: list[Any]) -> int:
        """Assign a batch to the ring slots from ``start``; return one past the top slot."""
        end, cap = start + n, self.capacity
        with self._move_lock:  # no move between the check and the last byte (see _memory)
            arrays: list[Any] = self._views()  # type: ignore[assignment]  # set with _unpacker
            if end <= cap:
                for arr, value in zip(arrays, values, strict=True):
                    arr[start:end] = value
                return end
            k = cap - start
            for arr, value in zip(arrays, values, strict=True):
                arr[start:] = value[:k]
                arr[: end - cap] = value[k:]
        return cap

    def extend_fast(self, start: int, data: Any, check: Any = None) -> torch.Tensor | None:
        """A batch through numpy slice writes, if its leaves match the layout exactly."""
        got = self._unpack_batch(start, data, check)
        if got is None:
            return None
        values, n, index = got
        return index if self.write_rows(start, n, values) else None  # an unpacker: written

    def write_rows(self, start: int, n: int, values: list[Any]) -> bool:
        """Write ``n`` checked rows per leaf at the ring slots from ``start``.

        ``values``: one numpy array (or tensor view) per leaf in layout order, of the leaf's
        dtype and shape ``[n, *item_shape]``; ``n`` at most the capacity. ``False``: the
        storage takes no numpy rows now (no layout yet, closed, on a GPU); nothing written.
        """
        if self._np_buffers is None or self._closed:
            return False
        top = self._put_rows(start, n, values)
        if top > self._length:
            self._length = top
        self._next, self._items_written = (start + n) % self._capacity, self._items_written + n
        return True

    def _write_one(self, index: int, payload: list[Any]) -> None:
        with self._move_lock:  # no move between the check and the last byte (see _memory)
            arrays = self._views()
            values = None if arrays is None else numpy_views(payload)
            if values is not None:
                for arr, value in zip(arrays, values, strict=True):  # type: ignore[arg-type]
                    arr[index] = value
                return
            for buf, t in zip(self._tensors(), payload, strict=True):
                buf[index] = t

    def gather(self, idx: torch.Tensor, extra: dict[str, torch.Tensor] | None) -> Any:
        """The items at ``idx``: one ``index_select`` per leaf on the storage's device."""
        if idx.device != self._device:  # host to GPU without waiting; GPU to host waits
            idx = idx.to(self._device, non_blocking=idx.is_cpu)  # (a no-op ``to``: ~0.6 us)
        if self._plain:  # plain-tensor items: one gather, nothing to assemble
            return self._rows(idx)[0]
        layout = self._layout
        if layout is None:
            raise IndexError("the storage is empty")
        tensors = self._rows(idx)
        device: torch.device | None = self.device
        if extra:
            for key, value in extra.items():
                if value.device != self._device:
                    if value.is_cpu:  # a CPU sampler's index/weight join the data
                        extra[key] = value.to(self._device, non_blocking=True)
                    elif not same_device(value.device, self._device):
                        device = None  # a GPU sampler's stay on its GPU: a mixed batch
        return layout.assemble(tensors, torch.Size((idx.shape[0],)), device, extra)

    def _rows(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Every leaf's rows at ``idx`` (on the storage's device): one ``index_select`` each."""
        buffers = self._buffers if self._mapped is None else self._tensors()
        return [torch.index_select(buf, 0, idx) for buf in buffers]

    def _get(self, index: int) -> Any:
        layout = self._layout
        assert layout is not None  # len() > 0 implies a layout
        return layout.assemble([buf[index] for buf in self._tensors()], torch.Size(), self.device)

    # --- persistence: a MemmapStorage directory, whole arrays -------------------------------
    # The format is the memmap package's (``memmap/_persist.py``), imported when used: that
    # package's storage derives from this class, and the format module never imports it back
    # (it opens a dumped directory through the registered "memmap" kind).
    def dump(
        self, directory: Path, codec: Codec, tensors: list[torch.Tensor], fsync: bool = True
    ) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
        """Write a :class:`~rbdata.storages.MemmapStorage` directory: whole arrays."""
        from rbdata.storages.memmap import _persist

        return _persist.dump_tensors(self, directory, fsync)

    @classmethod
    def check_dump(
        cls, directory: Path, config: dict[str, Any], state: Any, meta_file: Path
    ) -> Any:
        """Check ``layout.json``, the header and every leaf file's size."""
        from rbdata.storages.memmap import _meta  # the format, torch-free; see dump

        return _meta.check_dumped(cls.__name__, directory, config, state)

    @classmethod
    def restore(cls, saved: SavedStorage) -> TensorStorage:
        """The files mapped copy-on-write (lazy); a CUDA storage copies them to its device."""
        from rbdata.storages.memmap import _persist  # the format; see dump

        mapped = _persist.open_dumped(saved.directory)
        storage = cls(**saved.config)
        check_config(mapped, {"max_size": storage.capacity})
        layout = mapped.layout
        if layout is not None:
            storage._set_buffers([b.to(storage.device) for b in mapped.buffers], layout)
            storage._layout = layout
        storage._length, storage._next = len(mapped), mapped.next_slot
        check_config(storage, saved.config)
        return storage

    def dump_state(self, codec: Codec) -> dict[str, Any]:
        """The counts, the layout and CPU copies of the filled rows of every leaf."""
        n, layout = len(self), self.layout
        return {
            "length": n,
            "next": self.next_slot,
            "layout": None if layout is None else layout.to_json(),
            "buffers": [b[:n].detach().cpu().clone() for b in self.buffers],
        }

    @classmethod
    def from_state(cls, config: dict[str, Any], state: Any, codec: Codec) -> TensorStorage:
        """A new storage filled from :meth:`dump_state`."""
        storage = cls(**config)
        n, nxt = saved_counts(storage, state)
        if state["layout"] is not None:
            layout = Layout.from_json(state["layout"])
            storage._ensure_layout(layout)
            for buf, data, leaf in zip(
                storage.buffers, state["buffers"], layout.leaves, strict=True
            ):
                if tuple(data.shape) != (n, *leaf.shape) or data.dtype != leaf.dtype:
                    raise CheckpointError(
                        f"{cls.__name__}: key {leaf.name}: {data.dtype} {tuple(data.shape)}, "
                        f"expected {leaf.dtype} {(n, *leaf.shape)}"
                    )
                buf[:n].copy_(data)
        storage._set_length(n)
        storage._set_next(nxt)
        return storage

    def copy_from(self, src: Storage) -> None:
        """Buffer to buffer from another tensor storage (any device), else rows as the base."""
        if not isinstance(src, TensorStorage):
            return super().copy_from(src)
        n = len(src)
        with self._move_lock:  # torch copies into the buffers: no move meanwhile
            if src.layout is not None:
                self._ensure_layout(src.layout)
                for d, s in zip(self.buffers, src.buffers, strict=True):
                    d[:n].copy_(s[:n])
            self._set_length(n)
            self._set_next(src.next_slot)
        self._items_written += len(src)  # whatever class: see Storage.items_written

    @classmethod
    def check_layout(cls, layout: Layout) -> None:
        """Refuse variable-length (ragged) and string leaves: buffers are fixed-shape."""
        for leaf in layout.leaves:
            if leaf.kind != TENSOR:
                what = "strings" if leaf.kind == STRING else "variable-length (ragged) tensors"
                raise TypeError(
                    f"key {leaf.name}: {cls.__name__} keeps fixed-shape tensors only, this key "
                    f"holds {what}; convert to 'arrow' instead"
                )

    @classmethod
    def describe(
        cls,
        directory: Path,
        config: dict[str, Any] | None = None,
        state: Any = None,
        meta_file: Path | None = None,
    ) -> tuple[StorageInfo, list[str]]:
        """``layout.json`` and the header of the dumped directory; leaf files by size."""
        from rbdata.storages.memmap import _meta  # the format, torch-free; see dump

        return _meta.describe_dir(directory)
