"""``FrameStackStorage``: pixel transitions with each frame stored once, optionally compressed.

Users write the transitions they have: ``key`` (``"observation"`` by default) and
``("next", key)`` are frame stacks ``[stack, H, W]`` or ``[stack, H, W, C]`` (a batch adds
the leading dimension), next to any other fields. The storage keeps

* every other field, plus each step's *refs* (the pool slots of its two stacks: ``2 * stack``
  int32), in a :class:`~rbdata.storages.TensorStorage` (in memory) or a
  :class:`~rbdata.storages.MemmapStorage` (``path``): the *steps*;
* the frames in a :class:`~rbdata.storages.frames._pool.FramePool`: reference-counted slots,
  raw or compressed one by one (``codec``).

A write stores only the frames it cannot find already (``_streams.py``): a step that continues
the previous one (in the same env stream) adds its newest frame; an episode start, a reset with
repeated frames, another env's stream store what they need. Reads rebuild both stacks
bit-exactly from the refs. A frame lives as long as a stored step refers to it, so every index
in ``[0, len)`` can be read back: samplers need no rule of their own (no step is ever left
with overwritten frames).

With ``path``, the steps and the frames are files (``_format.py``, ``_files.py``) in the
storage's :class:`~rbdata.storages.frames._directory.FrameDirectory` (its path, files, writer
and read-only flag): :meth:`FrameStackStorage.open` reopens them, and every write is atomic
across a kill (see ``_directory.py``). Checkpoints, state dicts and ``rbdata inspect`` are the
storage's hooks, over the dump format of ``_dumped.py``.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from rbdata._core.ids import new_id
from rbdata._core.layout import Layout, Leaf
from rbdata._core.layout.keys import DICT_KIND
from rbdata._core.shown import shown
from rbdata.errors import CheckpointError
from rbdata.storages._describe import StorageInfo
from rbdata.storages._persist import check_config
from rbdata.storages._unpack import ItemUnpacker
from rbdata.storages.base import Codec, Prepared, SavedStorage, Storage, WriteTarget
from rbdata.storages.frames._codecs import FrameCodec
from rbdata.storages.frames._directory import FrameDirectory
from rbdata.storages.frames._dumped import (
    check_dumped,
    dump_dir,
    dump_meta,
    frames_of,
    state_of,
)
from rbdata.storages.frames._format import META_FILE, FramesMeta, check_stacks, describe_dir
from rbdata.storages.frames._pool import FramePool
from rbdata.storages.frames._streams import TRACKED, StreamTracker
from rbdata.storages.frames._writer import FrameWriter
from rbdata.storages.tensor import TensorStorage

__all__ = ["REFS_KEY", "FrameStackStorage"]

#: The steps' leaf that holds each step's frame slots (``[2, stack]`` int32).
REFS_KEY = ("_frame_refs",)

_F = TypeVar("_F", bound="FrameStackStorage")


class FrameStackStorage(Storage):
    """Frame-stacked pixel transitions, each frame stored once (optionally compressed).

    Args:
        capacity: steps (transitions) held.
        stack: frames per stack (4 for the usual Atari setup).
        key: the stacked observation's key; ``("next", key)`` is its next observation.
        path: ``None`` (in memory), or a new directory for the files: the steps in
            ``steps/`` (a :class:`~rbdata.storages.MemmapStorage`), the frames in
            ``frames/`` (reopened by ``FrameStackStorage.open``); the data is then on the CPU.
        codec: ``None`` (raw frames), ``"lz4"``, ``"zstd"`` or ``("zstd", level)``: each
            frame compressed on its own (``pip install 'rbdata[pixels]'``).
        device: where reads return the data (and raw frames live); ``None``: CPU.

    Raises:
        ValueError: a bad ``stack``, ``key`` or ``codec``, or a ``path`` with a GPU device.
        ImportError: the codec's library is missing.
        FileExistsError: ``path`` holds files already (reopen them with ``FrameStackStorage.open``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> frames = torch.arange(7 * 4, dtype=torch.uint8).view(7, 2, 2)  # 7 frames of 2x2
        >>> obs = torch.stack([frames[i : i + 3] for i in range(4)])  # 4 steps, stacks of 3
        >>> nxt = torch.stack([frames[i + 1 : i + 4] for i in range(4)])
        >>> td = TensorDict({"observation": obs, ("next", "observation"): nxt,
        ...                  "action": torch.arange(4)}, [4])
        >>> storage = FrameStackStorage(100, stack=3)
        >>> storage.set(slice(0, 4), td)
        >>> storage.frames_stored  # 3 for the first stack, then one per step
        7
        >>> bool((storage[2]["next", "observation"] == nxt[2]).all())
        True
    """

    kind = "frames"
    marker_file = META_FILE

    def __init__(
        self,
        capacity: int,
        stack: int,
        *,
        key: str | tuple[str, ...] = "observation",
        path: Any = None,
        codec: str | tuple[str, int] | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(capacity, device)
        if type(stack) is not int or stack < 1:
            raise ValueError(f"stack must be a positive int (frames per stack), got {shown(stack)}")
        self._stack = stack
        keys = (key,) if isinstance(key, str) else tuple(key)
        if not keys or not all(isinstance(k, str) and k for k in keys) or keys[0] == "next":
            raise ValueError(f"key must be a non-empty str (or tuple of str), got {shown(key)}")
        self._key: tuple[str, ...] = keys
        self._next_key: tuple[str, ...] = ("next", *keys)
        self._codec = None if codec is None else FrameCodec(codec)
        if path is not None and self.device.type != "cpu":
            raise ValueError(f"device: a storage with a path is on the CPU, got {self.device}")
        meta = FramesMeta(new_id(), self.capacity, stack, keys, self.codec)
        self._dir = FrameDirectory.create(None if path is None else Path(path), meta)
        self._steps: Storage = self._dir.new_steps(self.capacity, self.device)
        self._pool: FramePool | None = None
        self._tracker: StreamTracker | None = None
        self._places: tuple[int, int, list[int]] = (0, 0, [])  # obs, next, other leaves
        self._writer: FrameWriter | None = None  # the frames side of writes
        self._unpacker: ItemUnpacker | None = None  # the per-step path (see add_fast)
        self._unpack: Any = None

    # --- what it is ------------------------------------------------------------------------
    @property
    def stack(self) -> int:
        """Frames per stack."""
        return self._stack

    @property
    def key(self) -> tuple[str, ...]:
        """The stacked observation's key (``("next", *key)`` is the next observation)."""
        return self._key

    @property
    def codec(self) -> str | list[Any] | None:
        """The codec as given (``None``: raw frames)."""
        return None if self._codec is None else self._codec.spec()

    @property
    def frames_stored(self) -> int:
        """Frames held now (those some stored step, or the writer's streams, refer to)."""
        self._check_open()
        return 0 if self._pool is None else self._pool.live

    @property
    def steps(self) -> Storage:
        """The storage of the steps' other fields and frame refs (for implementers)."""
        self._check_open()
        return self._steps

    def nbytes(self) -> int:
        """Bytes the data takes: the frames (touched or compressed) and the steps' fields."""
        self._check_open()
        layout = self._steps.layout
        step = 0 if layout is None else layout.item_nbytes
        frames = 0 if self._pool is None else self._pool.nbytes()
        return frames + step * len(self)

    def config(self) -> dict[str, Any]:
        """``capacity``, ``stack``, ``key``, ``codec`` and ``device``."""
        self._check_open()
        return {
            "capacity": self.capacity,
            "stack": self._stack,
            "key": list(self._key),
            "codec": self.codec,
            "device": str(self.device),
        }

    def __repr__(self) -> str:
        return (
            f"FrameStackStorage(len={len(self)}, capacity={self.capacity}, stack={self._stack}, "
            f"codec={self.codec!r}, frames={self.frames_stored})"
        )

    # --- layout ----------------------------------------------------------------------------
    def _payload_device(self) -> torch.device | None:
        return torch.device("cpu")  # frames are compared and split on the CPU

    def _infer_layout(self, data: Any, batched: bool) -> Layout:
        layout = Layout.from_data(data, batched)
        self.check_layout(layout)
        return layout

    def check_layout(self, layout: Layout) -> None:  # type: ignore[override]
        """Refuse a layout without both stacks, or with stacks of another shape or dtype."""
        check_stacks(layout, self._key, self._stack)

    def _allocate(self, layout: Layout) -> None:
        keys = list(layout.keys)
        obs_at, next_at = keys.index(self._key), keys.index(self._next_key)
        others = [i for i in range(len(keys)) if i not in (obs_at, next_at)]
        self._places = (obs_at, next_at, others)
        leaf = layout.leaves[obs_at]
        frame_shape, dtype = tuple(leaf.shape[1:]), leaf.dtype
        steps = [layout.leaves[i] for i in others]
        steps.append(Leaf(REFS_KEY, (2, self._stack), torch.int32))
        self._steps_layout = Layout(DICT_KIND, steps)
        # every step's newest frame, plus 1/64 for episode starts and the writer's pins
        slots = self.capacity + self.capacity // 64 + 2 * self._stack * (TRACKED + 2)
        self._dir.fix_layout(layout)  # frames.json names the layout before any frame file
        files = self._dir.files
        self._pool = FramePool(frame_shape, dtype, slots, self._codec, self.device, files)
        self._tracker = StreamTracker(self._stack, self._pool)
        self._new_writer()
        self._bind_fast(layout)

    def _new_writer(self) -> None:
        """The frames side of writes, bound to the pool, the tracker and the steps."""
        assert self._pool is not None and self._tracker is not None
        args = (self._steps, self._stack, self._places, self._steps_layout)
        self._writer = FrameWriter(self._pool, self._tracker, *args)

    def _bind_fast(self, layout: Layout | None) -> None:
        """Set up the per-step path (steps in CPU numpy rows; else every write commits)."""
        self._unpacker = self._unpack = None
        if layout is not None and self._steps.writes_rows and self._steps.device.type == "cpu":
            self._unpacker = ItemUnpacker.for_layout(layout)
            self._unpack = None if self._unpacker is None else self._unpacker.unpack

    # --- writes ----------------------------------------------------------------------------
    def commit(self, target: WriteTarget, prepared: Prepared) -> None:
        """Store the new frames, then the steps with their refs (see the module docstring).

        Raises:
            IndexError: the write would leave unwritten steps below the new length (a
                ``set`` past ``len``); nothing is written.
        """
        self._check_writable()
        if target.skips(len(self)):
            raise IndexError(
                f"index: FrameStackStorage holds written steps only; the next free slot is "
                f"{len(self)}, a write there (or below) comes first"
            )
        if prepared.layout is not None:
            self._ensure_layout(prepared.layout)
        if not target.n:  # an empty batch: nothing to store
            return
        assert self._writer is not None
        n = target.n
        self._writer.commit(target, prepared, len(self))
        self._items_written += n
        if target.top > len(self):
            self._set_length(target.top)
        self._set_next(target.next_slot(self.capacity, self.next_slot))

    # --- the per-step path of ring writers and the SB3 adapter (see Storage.add_fast) -----
    writes_rows = True  # write_row/write_rows write once a layout is fixed on CPU steps

    def _rows_ok(self) -> bool:
        """Whether rows may be written now (a layout, CPU steps, this process the writer)."""
        unpacker, steps = self._unpacker, self._steps
        return (
            unpacker is not None
            and not self._closed
            and not steps.shared
            and self._dir.writes_here()
        )

    def add_fast(self, slot: int, item: Any, check: Any = None) -> bool:
        """One transition whose leaves match the layout exactly, without ``prepare``."""
        values = self._unpack(item) if self._rows_ok() else None
        if values is None:
            return False
        if check is not None:
            check(slot, item)
        return self._put_row(slot, values)

    def write_row(self, slot: int, values: list[Any]) -> bool:
        """Write one checked step (numpy leaves in layout order) at ``slot``; ``False``: not now."""
        if self._writer is None or not self._rows_ok():
            return False
        return self._put_row(slot, values)

    def _put_row(self, slot: int, values: list[Any]) -> bool:
        """:meth:`write_row` once :meth:`_rows_ok` said yes (the writer is set then)."""
        self._writer.put_row(slot, values, self._length)  # type: ignore[union-attr]
        top = slot + 1
        if top > self._length:
            self._length = top
        self._next = top % self.capacity
        self._items_written += 1
        return True

    def extend_fast(self, start: int, data: Any, check: Any = None) -> torch.Tensor | None:
        """A small batch (one env step of ``n_envs`` streams) at the ring slots from ``start``."""
        got = self._unpacker.unpack_batch(data) if self._rows_ok() else None  # type: ignore[union-attr]
        if got is None or got[1] > self.capacity:
            return None
        values, n = got
        index = torch.from_numpy(np.arange(start, start + n) % self.capacity)
        if check is not None:
            check(index, data)
        return index if self.write_rows(start, n, [np.asarray(v) for v in values]) else None

    def write_rows(self, start: int, n: int, values: list[Any]) -> bool:
        """Write ``n`` checked steps (numpy leaves) at ring slots from ``start``; or ``False``."""
        writer = self._writer
        if writer is None or not self._rows_ok():
            return False
        writer.write_rows(start, n, values, self._length)
        top = start + n
        if top > self._length:
            self._length = min(top, self.capacity)
        self._next = top % self.capacity
        self._items_written += n
        return True

    def _write(self, target: WriteTarget, payload: list[Any]) -> None:  # pragma: no cover
        raise AssertionError("FrameStackStorage writes through commit")

    def _write_one(self, index: int, payload: list[Any]) -> None:  # pragma: no cover
        raise AssertionError("FrameStackStorage writes through commit")

    def clear(self) -> None:
        """Forget all steps and frames (the memory is kept)."""
        self._check_writable()
        self._steps.clear()
        if self._pool is not None:
            assert self._tracker is not None
            self._tracker.forget(None)
            self._pool.reset()
        super().clear()

    # --- reads -----------------------------------------------------------------------------
    def gather(self, idx: torch.Tensor, extra: dict[str, torch.Tensor] | None) -> Any:
        """The steps at ``idx``: their fields, and both stacks rebuilt from the frames."""
        pool = self._pool
        if pool is None:
            raise IndexError("the storage is empty")
        batch = self._steps.gather(idx, extra)
        refs = batch.get(REFS_KEY[0])
        del batch[REFS_KEY[0]]
        obs, nxt = pool.read_pair(refs)
        batch.set(self._key, obs)
        batch.set(self._next_key, nxt)
        return batch

    def _get(self, index: int) -> Any:
        return self.gather(torch.tensor([index]), None)[0]

    # --- its directory ---------------------------------------------------------------------
    @classmethod
    def open(
        cls: type[_F],
        path: str | os.PathLike[str],
        copy_on_write: bool = False,
        read_only: bool = False,
    ) -> _F:
        """Reopen a storage directory written with ``path=`` (after a restart, a crash, a kill).

        ``frames.json``, the steps' files (:meth:`MemmapStorage.open
        <rbdata.storages.MemmapStorage.open>`: a committed write left by a killed writer is
        replayed) and the frame files' headers and sizes are checked first; then the frames'
        reference counts are rebuilt from the stored steps' refs, so the frames of a write cut
        by a kill are simply free. Every ``extend`` that returned is there, the one cut by the
        kill wholly there or wholly absent.

        Args:
            path: the storage directory.
            copy_on_write: map the files privately: writes stay in this process (how a
                checkpoint is loaded).
            read_only: as ``copy_on_write``, and every write is refused (``ReadOnlyError``).

        Raises:
            FileNotFoundError: no storage directory at ``path``.
            ValueError: naming the file and the field that is corrupt or out of range.
            StorageInUseError: another process (or storage object) writes the directory.

        Examples:
            >>> import shutil, tempfile, torch
            >>> from tensordict import TensorDict
            >>> from rbdata.storages import FrameStackStorage
            >>> frames = torch.arange(5 * 4, dtype=torch.uint8).view(5, 2, 2)
            >>> obs = torch.stack([frames[i : i + 2] for i in range(3)])  # stacks of 2
            >>> nxt = torch.stack([frames[i + 1 : i + 3] for i in range(3)])
            >>> tmp = tempfile.mkdtemp()
            >>> path = tmp + "/pixels"
            >>> storage = FrameStackStorage(100, 2, path=path, codec="lz4")
            >>> td = TensorDict({"observation": obs, "next": {"observation": nxt}}, [3])
            >>> storage.set(slice(0, 3), td)
            >>> storage.close()
            >>> again = FrameStackStorage.open(path)
            >>> len(again), again.frames_stored, bool((again[2] == td[2]).all())
            (3, 5, True)
            >>> again.close()
            >>> shutil.rmtree(tmp)
        """
        directory = FrameDirectory.open(path, copy_on_write, read_only)
        meta = directory.meta
        try:
            storage = cls(meta.capacity, meta.stack, key=meta.key, codec=meta.codec)  # type: ignore[arg-type]
        except BaseException:
            directory.close()
            raise
        storage._dir = directory
        try:
            storage._steps = directory.open_steps(copy_on_write)
            storage._attach(None if meta.layout is None else Layout.from_spec(meta.layout))
        except BaseException:
            storage.close()
            raise
        return storage

    def _attach(self, layout: Layout | None) -> None:
        """Take the steps as they are: the layout, the counts and the frames' references."""
        steps = self._steps
        if steps.capacity != self.capacity or (layout is None and steps.layout is not None):
            raise ValueError(
                f"{self._dir.path}: the steps (capacity {steps.capacity}, {steps.layout}) do not "
                f"match frames.json (capacity {self.capacity}, layout {layout})"
            )
        n = len(steps)
        if layout is not None:
            self.check_layout(layout)
            self._ensure_layout(layout)
            if steps.layout not in (None, self._steps_layout):
                raise ValueError(
                    f"{self._dir.path}: the steps' layout {steps.layout} does not match"
                )
            assert self._pool is not None and self._tracker is not None
            refs = steps.buffers[-1][:n].cpu().numpy() if n else np.zeros(0)  # type: ignore[attr-defined]
            self._tracker.forget(None)  # the counts are rebuilt: no pins
            self._pool.rebuild(refs.astype(np.int64))
        self._set_length(n)
        self._set_next(steps.next_slot)

    @property
    def path(self) -> Path | None:
        """The storage directory (``None`` in memory)."""
        self._check_open()
        return self._dir.path

    def flush(self) -> None:
        """Write the frames, then the steps, to their files durably (``fsync``)."""
        self._check_open()
        self._dir.flush(self._pool, self._steps)

    def close(self) -> None:
        """Close the files (a storage with a path); every other method then raises."""
        if self._closed:
            return
        self._dir.record_last(self._pool)
        self._closed = True
        close = getattr(self._steps, "close", None)
        if close is not None:
            close()
        if self._pool is not None:
            self._pool.close()
        self._dir.close()

    def _check_writable(self) -> None:
        self._check_open()
        self._dir.check_writable()

    # --- checkpoints, state dicts, in-place loads, ``rbdata inspect`` ----------------------
    def copy_from(self, src: Storage) -> None:
        """Hold what ``src`` holds: frames slot for slot and the steps (same stack and codec).

        The steps are emptied first, so a kill leaves this storage empty or a whole copy.
        Another storage (or another codec) is copied row by row through
        :meth:`~rbdata.storages.Storage.set`.
        """
        self._check_writable()
        ignore = {"device": ""}
        if (
            not isinstance(src, FrameStackStorage)
            or src.layout is None
            or src._pool is None
            or src.config() | ignore != self.config() | ignore
        ):
            super().copy_from(src)
            self._steps._set_next(self.next_slot)  # where the files say a writer resumes
            return
        self.clear()
        self._ensure_layout(src.layout)
        assert self._pool is not None
        self._pool.load(*src._pool.export())
        self._steps.copy_from(src._steps)
        self._attach(self._layout)
        self._items_written += len(src)

    def dump(
        self, directory: Path, codec: Codec, tensors: list[torch.Tensor], fsync: bool = True
    ) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
        """Write a storage directory: ``frames.json``, the steps (their own hook), the frames."""
        self._check_open()
        meta = dump_meta(self.config(), self.layout, self._pool)
        return dump_dir(directory, meta, self._steps, self._pool, codec, tensors, fsync)

    @classmethod
    def check_dump(
        cls, directory: Path, config: dict[str, Any], state: Any, meta_file: Path
    ) -> Any:
        """Check ``frames.json``, the steps' files and the frame files (sizes, headers, ids)."""
        return check_dumped(cls, directory, config, state, meta_file)

    @classmethod
    def restore(cls: type[_F], saved: SavedStorage) -> _F:
        """The dumped directory opened copy-on-write (lazy; writes never reach it).

        A storage saved from a GPU is copied to its device.
        """
        directory, config = saved.directory, saved.config
        try:
            storage = cls.open(directory, copy_on_write=True)
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{directory}: {err}") from err
        check_config(storage, config)
        if torch.device(config.get("device", "cpu")).type == "cpu":
            return storage
        own = cls(**config)
        try:
            own.copy_from(storage)
        finally:
            storage.close()
        return own

    def dump_state(self, codec: Codec) -> dict[str, Any]:
        """The layout, the steps' state (their own hook) and the frames (``uint8`` tensors)."""
        self._check_open()
        return state_of(self._steps, self.layout, self._pool, codec)

    @classmethod
    def from_state(cls: type[_F], config: dict[str, Any], state: Any, codec: Codec) -> _F:
        """A new storage in memory, filled from :meth:`dump_state`."""
        storage = cls(**config)
        try:
            steps = {"max_size": storage.capacity, "device": str(storage.device)}
            storage._steps = TensorStorage.from_state(steps, state["steps"], codec)
            frames = frames_of(state)
            if frames is not None:
                layout, data, table = frames
                storage.check_layout(layout)
                storage._ensure_layout(layout)
                assert storage._pool is not None
                storage._pool.load(data, table)
                storage._attach(layout)
            elif len(storage._steps):
                raise ValueError("steps without a layout")
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as err:
            raise CheckpointError(f"{cls.__name__}: state: {err}") from err
        return storage

    @classmethod
    def describe(
        cls,
        directory: Path,
        config: dict[str, Any] | None = None,
        state: Any = None,
        meta_file: Path | None = None,
    ) -> tuple[StorageInfo, list[str]]:
        """``frames.json`` and the steps' metadata: stack, codec, frames held, bytes per step."""
        return describe_dir(directory)

    @classmethod
    def empty_like(
        cls: type[_F],
        src: Storage,
        path: str | os.PathLike[str] | None = None,
        block_rows: int | None = None,
    ) -> _F:
        """A new, empty storage like ``src`` (a FrameStackStorage) at ``path``."""
        if not isinstance(src, FrameStackStorage):
            raise TypeError(
                f"{cls.__name__} is made from another FrameStackStorage (its stack and key); "
                "build one with FrameStackStorage(capacity, stack, path=...) and write to it"
            )
        config = src.config()
        key, codec = tuple(config["key"]), config["codec"]
        return cls(src.capacity, config["stack"], key=key, codec=codec, path=path)

    # --- pickling: a consistent snapshot ---------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        # the steps and the frames travel together as one copy (pickled plainly, never moved
        # to shared memory: a reader never pairs new steps with old frames); a copy of a
        # storage with a path is an in-memory one
        state = self.__dict__.copy()
        state["_steps"] = pickle.dumps(self._steps.dump_state(None))  # type: ignore[arg-type]
        del state["_dir"]  # a copy of a storage with a path is an in-memory one
        state["_unpacker"] = state["_unpack"] = None  # compiled for this process: anew
        state["_writer"] = None  # bound to the steps, rebuilt with the copy's own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        snapshot = pickle.loads(state.pop("_steps"))
        self.__dict__.update(state)
        self._dir = FrameDirectory()
        config = {"max_size": self.capacity, "device": str(self.device)}
        self._steps = TensorStorage.from_state(config, snapshot, None)  # type: ignore[arg-type]
        if self._pool is not None and self._tracker is not None:
            self._new_writer()
        self._bind_fast(self._layout)
