"""The frames of a :class:`~rbdata.storages.FrameStackStorage`: :class:`FramePool`.

A pool is a set of frame *slots* with reference counts. Every step refers to the slots of its
two stacks (its refs, ``2 * stack`` int32 per step, kept with the step's other fields); a slot
is free again when no step (and no stream of the writer, see ``_streams.py``) refers to it,
and a free slot is reused before a new one is touched. So a frame lives exactly as long as a
stored step needs it: a step the storage holds can always be read back, whatever the episode
lengths, resets or writes that came since. Samplers need no rule of their own (every index in
``[0, len)`` is readable), which is why the storage has no "invalid" steps to tell them about.

Frames are kept either raw, in one tensor ``[slots, *frame]`` (on the storage's device), or
compressed, one blob per frame in one byte log with a slot table (``codec``): a blob is
appended, and when the log is full it is compacted (the live blobs moved down, in log order)
if enough of it is dead, else it grows. Both grow when more slots are needed than the
storage's default (``capacity + capacity // 64`` plus the writer's pins). The arrays are the
pool's *memory*'s (``_memory.py``): process memory, or the files of a directory (``_files.py``).
The kernels (counts, the per-step write) are ``_kernels.py``'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rbdata.storages.frames._codecs import FrameCodec
from rbdata.storages.frames._kernels import acquire as _acquire
from rbdata.storages.frames._kernels import admit_kernel, admit_raw
from rbdata.storages.frames._kernels import release as _release
from rbdata.storages.frames._kernels import settle as _settle
from rbdata.storages.frames._memory import FrameMemory, pack, take_rows, zeros

__all__ = ["FramePool"]

_MIN_LOG = 1 << 20


class FramePool:
    """Reference-counted frame slots, raw or compressed (see the module docstring).

    Args:
        frame_shape: one frame's shape (``[H, W]`` or ``[H, W, C]``).
        dtype: the frames' dtype.
        slots: slots to start with (more are added when needed).
        codec: ``None`` (raw) or the :class:`FrameCodec` of the blobs.
        device: where raw frames live and reads return them.
        memory: where the arrays live (``_memory.py``; default: process memory), e.g. the
            ``FrameFiles`` of a directory (with more slots already: the pool takes them).
    """

    def __init__(
        self,
        frame_shape: tuple[int, ...],
        dtype: torch.dtype,
        slots: int,
        codec: FrameCodec | None,
        device: torch.device,
        memory: FrameMemory | None = None,
    ) -> None:
        self.frame_shape = tuple(frame_shape)
        self.dtype = dtype
        self.codec = codec
        self.device = device
        self.frame_bytes = int(np.prod(self.frame_shape, dtype=np.int64)) * dtype.itemsize
        self._memory = FrameMemory(self.frame_shape, dtype, device) if memory is None else memory
        #: the word a frame is compared and copied in: ``uint64`` where the bytes allow
        self.word: Any = np.uint64 if self.frame_bytes % 8 == 0 else np.uint8
        self._frames: torch.Tensor | None = None
        self._rows: np.ndarray | None = None  # numpy [slots, frame_bytes] of CPU frames
        self._words: np.ndarray | None = None  # the same as [slots, words] of ``word``
        self._log = zeros(0)
        self._head = 0
        self._live_bytes = 0
        self._set_table(np.zeros((0, 2), np.int64))
        if codec is None:
            frames = self._memory.frames(None, slots, 0)
            self._set_frames(frames)
            slots = int(frames.shape[0])
        else:
            self._set_table(self._memory.table(None, slots))
            slots = int(self._table.shape[0])
            self._log = self._memory.log(None, max(_MIN_LOG, slots * self.frame_bytes // 32), 0)
        self._count = np.zeros(slots, np.int32)
        self._free = np.empty(slots, np.int64)
        self._nfree = 0
        self._high = 0  # slots [0, high) were used once; above, untouched

    def _set_table(self, table: np.ndarray) -> None:
        """The slot table ``[slots, 2]``; ``_offsets`` and ``_lengths`` are its columns."""
        self._table, self._offsets, self._lengths = table, table[:, 0], table[:, 1]

    # --- slots and references ------------------------------------------------------------
    @property
    def slots(self) -> int:
        """Slots the pool has now."""
        return int(self._count.shape[0])

    @property
    def live(self) -> int:
        """Slots that some step (or the writer) refers to."""
        return self._high - self._nfree

    @property
    def high(self) -> int:
        """Slots ever used (the raw memory touched is ``high`` frames)."""
        return self._high

    def nbytes(self) -> int:
        """Bytes the frames take now: touched raw slots, or the used log, plus the counts."""
        meta = self._high * (4 + (16 if self.codec is not None else 0))
        if self.codec is None:
            return self._high * self.frame_bytes + meta
        return self._head + meta

    def take(self, n: int) -> np.ndarray:
        """``n`` free slots (each with no reference yet): reused ones first, then new ones."""
        nfree = self._nfree
        if n == 1 and nfree:  # the per-step case
            self._nfree = nfree - 1
            return self._free[nfree - 1 : nfree].copy()
        out = np.empty(n, np.int64)
        k = min(n, self._nfree)
        if k:
            out[:k] = self._free[self._nfree - k : self._nfree][::-1]
            self._nfree -= k
        rest = n - k
        if rest:
            if self._high + rest > self.slots:
                self._grow(self._high + rest)
            out[k:] = np.arange(self._high, self._high + rest)
            self._high += rest
        return out

    def words(self) -> np.ndarray | None:
        """The raw CPU frames, ``[slots, words]`` of :attr:`word`; ``None``: a codec, device frames.

        A view of the frames as they are now: growth (and a reopen, an unpickled copy) replaces
        them, so take it at each use and never keep it. Whether it is ``None`` is fixed for the
        pool's life (its codec and device; only :meth:`close` ends it): ``StreamTracker`` keeps
        its stacks by reference exactly when it is not (see ``_streams.py``).
        """
        return self._words

    def acquire(self, refs: np.ndarray) -> None:
        """Add one reference per entry of ``refs`` (in-range slots, any repeats)."""
        _acquire(self._count, refs.reshape(-1))

    def settle(self, refs: np.ndarray, fresh: np.ndarray, old: np.ndarray) -> None:
        """Take a write's references, then drop those of the steps it overwrote (``old``).

        Placeholders ``-1 - k`` in ``refs`` become ``fresh[k]`` (in place).
        """
        freed = self._nfree
        flat = refs.reshape(-1)
        self._nfree = _settle(self._count, flat, fresh, old.reshape(-1), self._free, freed)
        if self.codec is not None and self._nfree > freed:
            dead = self._free[freed : self._nfree]
            self._live_bytes -= int(self._lengths[dead].sum())

    def admit_one(
        self,
        step: tuple[np.ndarray, ...],
        kept: np.ndarray,
        kept_refs: np.ndarray,
        kept_count: int,
        rows: np.ndarray,
    ) -> int:
        """The frames side of one step of one stream, in one kernel call (CPU frames).

        ``step``: ``(obs, nxt, both, stored)``: the stacks (C-contiguous ``[S, *frame]`` or ``[1,
        S, words]`` of :attr:`word`), ``[2, 2, S]`` int64 that gets the step's refs (``both[0]``)
        and a copy of ``stored`` (``both[1]``, flattened), and the refs of the stored step it
        overwrites, as stored (C-contiguous ``[2, S]``, or ``[0, S]``: none). ``kept``,
        ``kept_refs``, ``kept_count``: a ``StreamTracker``'s arrays, with one stream and no last
        step (raw CPU frames: ``kept`` is unused, the stack is compared where it is stored);
        ``rows`` ``[2 * S, words]`` scratch. Plans the step, stores its new frames, takes the
        references of its refs, pins the next observation as the tracker's stream 0, then drops
        the overwritten refs (after taking slots: a slot they free is never one of this step's).
        Returns the free-stack mark :meth:`undrop` takes, or ``-1`` (nothing changed): not here
        (device frames, a codec without a C compressor, no room without growing), take the
        general path.
        """
        if self.codec is None:
            words = self._words
            if words is None:
                return -1
            counts = (self._count, self._free, self._nfree, self._high)
            new, mark, nfree, high = admit_raw(step, kept_refs, kept_count, rows, *counts, words)
        else:
            compress = self.codec.compress_c
            if compress is None:
                return -1
            kernel = admit_kernel(compress)
            got = kernel(step, kept, kept_refs, kept_count, rows, self._count, self._free,
                         self._nfree, self._high, self._log, self._table, self._head,
                         self._live_bytes)  # fmt: skip
            new, mark, nfree, high, self._head, self._live_bytes = got
        if new < 0:
            return -1
        self._nfree, self._high = nfree, high
        return int(mark)

    def undrop(self, old: np.ndarray, mark: int) -> None:
        """Undo :meth:`admit_one`'s drop of ``old`` (its steps were not written after all).

        Nothing took a slot since: the slots ``old`` freed are the free stack above ``mark``.
        """
        back = self._free[mark : self._nfree]
        if self.codec is not None:
            self._live_bytes += int(self._lengths[back].sum())
        self._nfree = mark
        self.acquire(old)

    def release(self, refs: np.ndarray) -> None:
        """Drop one reference per entry; slots left with none are free (data kept until reused)."""
        freed = self._nfree
        self._nfree = _release(self._count, refs.reshape(-1), self._free, self._nfree)
        if self.codec is not None and self._nfree > freed:
            dead = self._free[freed : self._nfree]
            self._live_bytes -= int(self._lengths[dead].sum())

    def reset(self) -> None:
        """Forget every frame (the memory is kept)."""
        self._count[:] = 0
        self._nfree = 0
        self._high = 0
        self._head = 0
        self._live_bytes = 0

    def rebuild(self, refs: np.ndarray) -> None:
        """Counts from scratch: a reference per entry of ``refs`` (the stored steps' refs).

        When a storage is loaded or reopened: what no step refers to is free (the frames of a
        write killed before its steps' commit, the pins). ``ValueError`` (nothing changed):
        a ref outside the pool, or a referenced blob outside the log.
        """
        flat = refs.reshape(-1)
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= self.slots):
            raise ValueError(
                f"frame refs out of range: [{int(flat.min())}, {int(flat.max())}] for a pool of "
                f"{self.slots} frames"
            )
        high = int(flat.max()) + 1 if flat.size else 0
        count = np.zeros(self.slots, np.int32)
        if flat.size:
            _acquire(count, flat)
        used = np.flatnonzero(count[:high])
        head = live_bytes = 0
        if self.codec is not None and used.size:
            offsets, lengths = self._offsets[used], self._lengths[used]
            head, live_bytes = int((offsets + lengths).max()), int(lengths.sum())
            if int(offsets.min()) < 0 or int(lengths.min()) <= 0 or head > self._log.shape[0]:
                raise ValueError(
                    f"frame table: a stored step's frame lies outside the {self._log.shape[0]}"
                    "-byte log; corrupt"
                )
        self._count = count
        self._high = high
        unused = np.flatnonzero(count[:high] == 0)
        self._nfree = int(unused.size)
        self._free[: self._nfree] = unused[::-1]
        self._head, self._live_bytes = head, live_bytes

    # --- data ----------------------------------------------------------------------------
    def store(self, slots: np.ndarray, frames: np.ndarray) -> None:
        """Write ``frames`` (``[n, frame_bytes]`` uint8 rows, C-contiguous) at ``slots``."""
        if not slots.size:
            return
        if self.codec is None:
            rows = self._rows
            if rows is not None:  # CPU: numpy rows of the frames
                if slots.shape[0] == 1:
                    rows[slots[0]] = frames[0]
                else:
                    rows[slots] = frames
                return
            assert self._frames is not None
            data = torch.from_numpy(frames).view(self.dtype).view(-1, *self.frame_shape)
            index = torch.from_numpy(slots).to(self.device)
            self._frames.index_copy_(0, index, data.to(self.device))
            return
        codec = self.codec
        if slots.shape[0] == 1:  # the per-step case: one frame, no arrays built
            blob = codec.compress(frames[0])
            size = len(blob)
            if self._head + size > self._log.shape[0]:
                self._make_room(size)
            head = self._head
            self._log[head : head + size] = np.frombuffer(blob, np.uint8)
            slot = slots[0]
            self._offsets[slot] = head
            self._lengths[slot] = size
            self._head = head + size
            self._live_bytes += size
            return
        blobs = [codec.compress(f) for f in frames]
        sizes = np.fromiter((len(b) for b in blobs), np.int64, len(blobs))
        total = int(sizes.sum())
        if self._head + total > self._log.shape[0]:
            self._make_room(total)
        head = self._head
        self._log[head : head + total] = np.frombuffer(b"".join(blobs), np.uint8)
        starts = head + np.cumsum(sizes) - sizes
        self._offsets[slots] = starts
        self._lengths[slots] = sizes
        self._head = head + total
        self._live_bytes += total

    def _read_raw(self, refs: torch.Tensor) -> torch.Tensor:
        """Raw frames at ``refs`` (any shape of in-range slots): ``[*refs.shape, *frame]``."""
        assert self._frames is not None
        flat = refs.reshape(-1)
        if flat.device != self._frames.device:
            flat = flat.to(self._frames.device, non_blocking=flat.is_cpu)
        return take_rows(self._frames, flat).view(*refs.shape, *self.frame_shape)

    def read_pair(self, refs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both stacks of the steps whose refs are ``refs`` (``[n, 2, stack]``).

        Two contiguous ``[n, stack, *frame]`` tensors (see :meth:`FrameCodec.decode_places`).
        """
        if self.codec is None:
            refs = refs.long()
            return self._read_raw(refs[:, 0]), self._read_raw(refs[:, 1])
        places = refs.transpose(0, 1).reshape(-1).cpu().numpy()  # the obs, then the next
        log, offsets, lengths, size = self._log, self._offsets, self._lengths, self.frame_bytes
        rows = self.codec.decode_places(log, offsets, lengths, places, size)
        both = torch.from_numpy(rows).view(self.dtype)
        both = both.view(2, refs.shape[0], refs.shape[2], *self.frame_shape)
        if self.device.type != "cpu":
            both = both.to(self.device)
        return both[0], both[1]

    # --- persistence: saved and loaded frames, the files of a storage directory --------------
    @property
    def blob_bytes(self) -> int:
        """Bytes of the blobs that some step (or the writer) refers to (0 without a codec)."""
        return self._live_bytes

    @property
    def data_bytes(self) -> int:
        """Bytes of the frames held: the live blobs (compressed), or the live raw frames."""
        return self._live_bytes if self.codec is not None else self.live * self.frame_bytes

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        """The frames of slots ``[0, high)`` to save (:meth:`load` takes them back).

        Raw: rows ``[high, frame_bytes]`` ``uint8``, an empty table. Compressed: the live blobs
        packed, and the table ``[high, 2]`` of their places (``0, 0`` for a free slot).
        """
        high = self._high
        if self._frames is not None:
            rows = self._frames[:high].detach().cpu().contiguous().view(torch.uint8)
            return rows.view(high, self.frame_bytes).numpy(), np.zeros((0, 2), np.int64)
        live = np.flatnonzero(self._count[:high] > 0)
        order = live[np.argsort(self._offsets[live], kind="stable")]
        table = np.zeros((high, 2), np.int64)
        table[live] = self._table[live]
        packed = np.empty(int(table[:, 1].sum()), np.uint8)
        pack(self._log, packed, table, order, False)
        return packed, table

    def load(self, data: np.ndarray, table: np.ndarray) -> None:
        """Replace every frame by saved ones (:meth:`export`'s form); then call :meth:`rebuild`."""
        self.reset()
        high = data.shape[0] if self._frames is not None else table.shape[0]
        if high > self.slots:
            self._grow(high)
        if self._frames is not None:
            rows = torch.from_numpy(data).view(self.dtype).view(high, *self.frame_shape)
            self._frames[:high] = rows.to(self._frames.device)
            return
        self._make_room(data.shape[0])  # the pool is empty: it grows the log if needed
        self._log[: data.shape[0]] = data
        self._table[:high] = table
        self._head = int(data.shape[0])

    def flush(self) -> None:
        """Write the frames to their files, durably (nothing to do in memory)."""
        self._memory.flush()

    def close(self) -> None:
        """Release the arrays (and the files that hold them)."""
        self._frames = self._rows = self._words = None
        self._log = zeros(0)
        self._memory.close()

    # --- pickling: the used part only, as plain bytes, into process memory -----------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        high = self._high
        state["_slots"] = self.slots
        state["_memory"] = self._memory.for_copy()
        state["_rows"] = state["_words"] = None
        if self._frames is not None:
            state["_frames"] = self._frames[:high].detach().cpu().numpy().copy()
        state["_log"] = self._log[: self._head].copy()
        state["_table"] = self._table[:high].copy()
        del state["_offsets"], state["_lengths"]  # columns of the table
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        slots = state.pop("_slots")
        frames, log, table = state.pop("_frames"), state.pop("_log"), state.pop("_table")
        self.__dict__.update(state)
        self._frames = None
        if frames is not None:
            self._set_frames(self._memory.frames(None, slots, 0))
            assert self._frames is not None
            self._frames[: frames.shape[0]] = torch.from_numpy(frames)
            self._set_table(table)
            self._log = zeros(0)
            return
        self._set_table(self._memory.table(table, slots))
        size = max(_MIN_LOG, slots * self.frame_bytes // 32, log.shape[0])
        self._log = self._memory.log(log, size, log.shape[0])

    # --- growth --------------------------------------------------------------------------
    def _set_frames(self, frames: torch.Tensor) -> None:
        """Take ``frames`` (this pool's own tensor: nothing else moves its memory)."""
        self._frames = frames
        rows = None
        if frames.is_cpu:
            rows = frames.view(torch.uint8).view(frames.shape[0], self.frame_bytes).numpy()
        self._rows = rows
        self._words = None if rows is None else rows.view(self.word)

    def _grow(self, needed: int) -> None:
        """At least ``needed`` slots (x1.25 at least): counts, free list and frames kept."""
        slots = max(needed, self.slots + self.slots // 4 + 16)
        if self._frames is not None:
            self._set_frames(self._memory.frames(self._frames, slots, self._high))
            slots = int(self._frames.shape[0])
        else:
            self._set_table(self._memory.table(self._table, slots))
            slots = int(self._table.shape[0])
        count = np.zeros(slots, np.int32)
        count[: self.slots] = self._count
        free = np.empty(slots, np.int64)
        free[: self._nfree] = self._free[: self._nfree]
        self._count, self._free = count, free

    def _make_room(self, total: int) -> None:
        """Room for ``total`` more bytes: compact the log if enough of it is dead, else grow."""
        dead = self._head - self._live_bytes
        if dead and dead >= self._head // self._memory.compact_divisor:
            live = np.flatnonzero(self._count[: self._high] > 0)
            order = live[np.argsort(self._offsets[live], kind="stable")]
            log, table, self._head = self._memory.compact(self._log, self._table, order)
            self._log = log
            self._set_table(table)
            self._live_bytes = self._head
        if self._head + total <= self._log.shape[0]:
            return
        size = max(self._head + total, self._log.shape[0] + self._log.shape[0] // 2)
        self._log = self._memory.log(self._log, size, self._head)
