"""Dopamine's checkpoints read, their valid records found, converted into frame-stacked rows.

A checkpoint of Dopamine's ``OutOfGraphReplayBuffer`` (``save``/``load``) is one gzip file per
array, each holding one ``np.save`` array (no pickle): the buffer's ``capacity`` rows of
``$store$_observation`` (single frames, ``[capacity, H, W]`` uint8), ``$store$_action``,
``$store$_reward`` and ``$store$_terminal`` (``[capacity]``), its ``add_count`` (0-d: how many
records were ever added, padding included) and its ``invalid_range``. Every file is read through
its ``.npy`` header and streamed through the decompressor
(:class:`~rbdata.datasets._build.RowStream`), so a frame file is never in memory whole; nothing is
ever unpickled. :func:`valid_positions` applies the rules of ``is_valid_transition`` (see
:mod:`rbdata.datasets.atari` for them in words), vectorised over the whole buffer; the tests check
it against a per-index loop.

The conversion (:func:`convert_atari`) writes the transitions into a storage of
frame-stacked transitions with the keys, the order and the rules of
:mod:`rbdata.datasets.atari`. A first pass
reads each checkpoint's small files (actions, rewards, terminals, ``add_count``,
``invalid_range``) to count its valid transitions, which sizes the storage; the second pass
streams each checkpoint's frames in chronological order (:class:`FrameReader`) and hands the
storage, for every run of consecutive valid transitions, numpy sliding-window *views* of the
frames: ``observation[i]`` and ``("next", "observation")[i]`` are views of the same
``stack + chunk`` frames, never copies. Memory holds at most about two chunks of frames
(``2 * 8192`` frames of 84x84 bytes: ~115 MB), one checkpoint's small arrays and the
chronological copies of its valid rows, whatever the number of checkpoints: measured on a
wrapped checkpoint of 1M 84x84 records, the conversion's peak is ~220 MB above the process's
(7.6 s into a storage that discards; 2 cores). The storage's own memory comes on top.

:func:`new_storage` is the one place that chooses the storage the conversion writes.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch
from tensordict import TensorDict
from tqdm.auto import tqdm

from rbdata.datasets._build import NpzMember, RowStream, read_npy_header
from rbdata.datasets.atari._catalog import BACKEND
from rbdata.storages import FrameStackStorage
from rbdata.storages.base import Storage

__all__ = [
    "BACKEND",
    "Checkpoint",
    "Counted",
    "FrameReader",
    "STACK",
    "Source",
    "UPDATE_HORIZON",
    "check_codec",
    "convert_atari",
    "count_transitions",
    "new_storage",
    "read_checkpoint",
    "valid_positions",
    "write_transitions",
]


#: ``update_horizon`` of the logging agent (batch_rl's ``dqn.gin``: ``update_horizon = 1``)
UPDATE_HORIZON = 1
#: the kinds of dtype each array may have (Dopamine: uint8, int32, float32, uint8, int64)
_KINDS = {"observation": "u", "action": "iu", "reward": "f", "terminal": "biu"}


def _open(path: Path, role: str) -> tuple[RowStream, NpzMember]:
    """A row stream of the gzipped ``.npy`` at ``path``, positioned after its header."""
    where = f"{path} ({role})"
    fp = cast(IO[bytes], gzip.open(path, "rb"))  # noqa: SIM115 - the stream closes it
    try:
        shape, dtype = read_npy_header(fp, where)
    except BaseException:
        fp.close()
        raise
    member = NpzMember(role, shape, dtype)
    return RowStream(fp, member, where), member


def _read_all(path: Path, role: str, limit: int) -> np.ndarray:
    """The whole (small) array of ``path``; its gzip CRC is checked at the end."""
    stream, member = _open(path, role)
    try:
        size = member.row_bytes * member.rows
        if size > limit:
            raise ValueError(f"{path} ({role}): {member.shape} is {size} bytes, over {limit}")
        value = stream.read(member.rows)
        stream.finish()
    finally:
        stream.close()
    return value


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint's small files say (the frames stay in their file).

    Attributes:
        number: the checkpoint suffix.
        capacity: the buffer's rows (the length of every array).
        frame_shape: the shape of one frame (``(84, 84)`` for the DQN Replay Dataset).
        add_count: records ever added.
        invalid_range: the indices Dopamine's ``invalid_range`` excludes.
        action: ``[capacity]``, the file's dtype.
        reward: ``[capacity]``, the file's dtype.
        terminal: ``[capacity]`` bool.
    """

    number: int
    capacity: int
    frame_shape: tuple[int, ...]
    add_count: int
    invalid_range: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminal: np.ndarray

    @property
    def full(self) -> bool:
        """Whether the buffer wrapped (``is_full``: ``add_count >= capacity``)."""
        return self.add_count >= self.capacity

    @property
    def cursor(self) -> int:
        """Where the next record would be written (``add_count % capacity``)."""
        return self.add_count % self.capacity

    @property
    def records(self) -> int:
        """Records in the buffer: the capacity once full, else ``add_count``."""
        return self.capacity if self.full else self.add_count

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """The buffer rows of chronological ``positions`` (0: the oldest record)."""
        return (positions + (self.cursor if self.full else 0)) % self.capacity


def read_checkpoint(number: int, paths: dict[str, Path], stack: int) -> Checkpoint:
    """Read and check the small files of checkpoint ``number`` and the frames' header.

    Args:
        number: the checkpoint suffix.
        paths: role (``observation``, ``action``, ``reward``, ``terminal``, ``add_count``,
            ``invalid_range``) -> the file.
        stack: frames per observation (Dopamine's ``stack_size``).

    Raises:
        ValueError: a file that is not a gzipped ``.npy``, an array of the wrong shape or
            kind, or an ``add_count``/``invalid_range`` out of range (the message names the
            file).
    """
    stream, obs = _open(paths["observation"], "observation")
    stream.close()
    if len(obs.shape) != 3 or obs.dtype.kind not in _KINDS["observation"]:
        raise ValueError(
            f"{paths['observation']}: expected frames [capacity, H, W] uint8, got "
            f"{obs.shape} {obs.dtype}"
        )
    if obs.dtype.itemsize != 1:
        raise ValueError(f"{paths['observation']}: expected uint8 frames, got {obs.dtype}")
    capacity = obs.shape[0]
    if capacity < stack + UPDATE_HORIZON:
        raise ValueError(f"{paths['observation']}: a capacity of {capacity} rows is too small")
    arrays: dict[str, np.ndarray] = {}
    for role in ("action", "reward", "terminal"):
        value = _read_all(paths[role], role, 64 * capacity)
        if value.shape != (capacity,) or value.dtype.kind not in _KINDS[role]:
            raise ValueError(
                f"{paths[role]}: expected {role} [{capacity}] of kind {_KINDS[role]!r}, got "
                f"{value.shape} {value.dtype}"
            )
        arrays[role] = value
    count = _read_all(paths["add_count"], "add_count", 64)
    if count.shape != () or count.dtype.kind not in "iu" or int(count) < 0:
        raise ValueError(
            f"{paths['add_count']}: expected a 0-d count >= 0, got {count.shape} {count}"
        )
    invalid = _read_all(paths["invalid_range"], "invalid_range", 1 << 16)
    if (
        invalid.ndim != 1
        or invalid.dtype.kind not in "iuf"
        or not np.all(np.isfinite(invalid))
        or np.any(invalid != np.round(invalid))
        or np.any((invalid < 0) | (invalid >= capacity))
    ):
        raise ValueError(
            f"{paths['invalid_range']}: expected indices in [0, {capacity}), got {invalid!r}"
        )
    return Checkpoint(
        number=number,
        capacity=capacity,
        frame_shape=tuple(obs.shape[1:]),
        add_count=int(count),
        invalid_range=invalid.astype(np.int64),
        action=arrays["action"],
        reward=arrays["reward"],
        terminal=arrays["terminal"] != 0,
    )


def valid_positions(ckpt: Checkpoint, stack: int) -> np.ndarray:
    """The chronological positions (0: the oldest record) of the valid transitions.

    Dopamine's ``is_valid_transition(index)``, for every index at once (``update_horizon``
    1): not yet full, an index must be in ``[stack - 1, cursor - 1)``; never one of
    ``invalid_range``; and no terminal among the stack's frames but the last. Besides, the
    stacks of a transition (``index - stack + 1 .. index + 1``) never cross the cursor
    (Dopamine's ``invalid_range`` is what guarantees it in a buffer it wrote).

    Examples:
        >>> z = np.zeros(8)
        >>> ckpt = Checkpoint(0, 8, (1, 1), 11, np.array([2, 3, 4, 5, 6]), z, z, z != 0)
        >>> ckpt.cursor, valid_positions(ckpt, 4).tolist(), ckpt.rows(np.array([4])).tolist()
        (3, [4, 5, 6], [7])
    """
    cap, cursor = ckpt.capacity, ckpt.cursor
    index = np.arange(cap)
    valid = np.ones(cap, dtype=bool)
    if not ckpt.full:
        valid &= (index >= stack - 1) & (index < cursor - UPDATE_HORIZON)
    valid[ckpt.invalid_range] = False
    for back in range(1, stack):  # a terminal in frame index - back of the stack
        valid &= ~np.roll(ckpt.terminal, back)
    order = np.argsort((index - (cursor if ckpt.full else 0)) % cap, kind="stable")
    positions = np.flatnonzero(valid[order])
    records = ckpt.records
    keep = (positions >= stack - 1) & (positions + UPDATE_HORIZON < records)
    return positions[keep]


class FrameReader:
    """The frames of a checkpoint in chronological order, chunk by chunk.

    A full buffer's oldest record is at the cursor: positions ``0 .. capacity - cursor - 1``
    are the file's rows from the cursor to its end, the others its rows from 0 to the cursor.
    Each run of rows is streamed from its file's start (rows before it are decompressed and
    dropped): at most two passes over the file, memory bounded by ``chunk`` frames.

    Args:
        path: the observation file.
        ckpt: its checkpoint.
        chunk: frames per chunk.
    """

    def __init__(self, path: Path, ckpt: Checkpoint, chunk: int) -> None:
        self.path = path
        self.ckpt = ckpt
        self.chunk = max(1, chunk)

    def read(self, start: int, stop: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(position, frames)`` chunks covering chronological positions ``[start, stop)``."""
        ckpt = self.ckpt
        head = ckpt.capacity - ckpt.cursor if ckpt.full else ckpt.records
        runs = [(0, head, ckpt.cursor if ckpt.full else 0), (head, ckpt.records, -head)]
        for first, end, shift in runs:  # position p is row p + shift
            lo, hi = max(start, first), min(stop, end)
            if lo < hi:
                for at, frames in self._rows(lo + shift, hi + shift):
                    yield at - shift, frames

    def _rows(self, lo: int, hi: int) -> Iterator[tuple[int, np.ndarray]]:
        stream, member = _open(self.path, "observation")
        try:
            if member.shape != (self.ckpt.capacity, *self.ckpt.frame_shape):
                raise ValueError(f"{self.path}: its shape changed to {member.shape}")
            at = 0
            while at < lo:  # decompressed and dropped
                at += len(stream.read(min(self.chunk, lo - at)))
            while at < hi:
                frames = stream.read(min(self.chunk, hi - at))
                yield at, frames
                at += len(frames)
            if hi == self.ckpt.capacity:
                stream.finish()  # the end of the file: its CRC is checked
        finally:
            stream.close()


#: frames per observation (Dopamine's ``stack_size``, 4 for the DQN Replay Dataset)
STACK = 4
#: frames decompressed at a time
_CHUNK_FRAMES = 8192

#: one checkpoint: its number and its files by role (see ``_catalog.ROLES``)
Source = tuple[int, dict[str, Path]]


def check_codec(codec: Any) -> Any:
    """``codec`` as JSON: ``None``, ``"lz4"``, ``"zstd"`` or ``["zstd", level]``.

    Raises:
        ValueError: any other value.

    Examples:
        >>> check_codec("lz4"), check_codec(("zstd", 9))
        ('lz4', ['zstd', 9])
    """
    if codec is None or codec in ("lz4", "zstd"):
        return codec
    if (
        isinstance(codec, (tuple, list))
        and len(codec) == 2
        and codec[0] == "zstd"
        and isinstance(codec[1], int)
        and not isinstance(codec[1], bool)
    ):
        return ["zstd", codec[1]]
    raise ValueError(f"codec: expected None, 'lz4', 'zstd' or ('zstd', level), got {codec!r}")


def new_storage(path: Path, capacity: int, stack: int, codec: Any) -> FrameStackStorage:
    """The new storage at ``path`` that the conversion fills: the one place its kind is chosen.

    A :class:`~rbdata.storages.FrameStackStorage` on disk: each 84 x 84 frame stored once,
    compressed with ``codec`` (``"lz4"`` by default; ``None`` keeps frames raw).
    """
    return FrameStackStorage(capacity, stack, path=path, codec=codec)


@dataclass(frozen=True)
class Counted:
    """A checkpoint's valid transitions and what its storage's layout takes from it."""

    number: int
    transitions: int
    frame_shape: tuple[int, ...]
    action: np.dtype[Any]
    reward: np.dtype[Any]


def count_transitions(sources: Sequence[Source], stack: int = STACK) -> list[Counted]:
    """Read every checkpoint's small files; check they fit one storage; count the transitions.

    Raises:
        ValueError: a malformed file, or checkpoints of different frame shapes or dtypes.
    """
    found: list[Counted] = []
    for number, paths in sources:
        ckpt = read_checkpoint(number, paths, stack)
        counted = Counted(
            number,
            len(valid_positions(ckpt, stack)),
            ckpt.frame_shape,
            ckpt.action.dtype,
            ckpt.reward.dtype,
        )
        first = found[0] if found else counted
        if (first.frame_shape, first.action, first.reward) != (
            counted.frame_shape,
            counted.action,
            counted.reward,
        ):
            raise ValueError(
                f"checkpoint {number}: frames {counted.frame_shape}, actions {counted.action} "
                f"and rewards {counted.reward} differ from checkpoint {first.number}'s "
                f"({first.frame_shape}, {first.action}, {first.reward})"
            )
        found.append(counted)
    return found


def _runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` index ranges of ``positions`` over which they go up by one."""
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = [0, *breaks.tolist()]
    return list(zip(starts, [*breaks.tolist(), len(positions)], strict=True))


def _stacks(window: np.ndarray, stack: int) -> np.ndarray:
    """``out[j] = window[j : j + stack]``: a view, no copy (``[n - stack + 1, stack, ...]``)."""
    view = np.lib.stride_tricks.sliding_window_view(window, stack, axis=0, writeable=True)
    return np.moveaxis(view, -1, 1)


def write_transitions(
    sources: Sequence[Source],
    storage: Storage,
    *,
    stack: int = STACK,
    chunk: int | None = None,
    bar: Any = None,
) -> dict[str, Any]:
    """Write the valid transitions of ``sources`` into ``storage`` from slot 0, in order.

    Args:
        sources: the checkpoints, in the order to write them.
        storage: any rbdata storage with room for them (:func:`count_transitions`).
        stack: frames per observation.
        chunk: frames decompressed at a time (default 8192).
        bar: a progress bar to update with the transitions written.

    Returns:
        ``{"transitions", "episodes", "checkpoints"}``: ``checkpoints`` lists, for each, its
        number, capacity, ``add_count``, cursor, whether it was full and its transitions.
    """
    out = episode = 0
    described = []
    for number, paths in sources:
        ckpt = read_checkpoint(number, paths, stack)
        positions = valid_positions(ckpt, stack)
        described.append(
            {
                "checkpoint": number,
                "capacity": ckpt.capacity,
                "add_count": ckpt.add_count,
                "cursor": ckpt.cursor,
                "full": ckpt.full,
                "transitions": len(positions),
            }
        )
        if not len(positions):
            continue
        rows = ckpt.rows(positions)
        done = ckpt.terminal[rows]
        columns = {
            "action": ckpt.action[rows],
            "reward": ckpt.reward[rows],
            "done": done,
            "episode": episode + np.cumsum(done, dtype=np.int64) - done,
        }
        episode += int(done.sum()) + (0 if done[-1] else 1)
        reader = FrameReader(paths["observation"], ckpt, chunk or _CHUNK_FRAMES)
        _write_frames(reader, positions, columns, storage, out, stack, bar)
        out += len(positions)
    return {"transitions": out, "episodes": episode, "checkpoints": described}


def _write_frames(
    reader: FrameReader,
    positions: np.ndarray,
    columns: dict[str, np.ndarray],
    storage: Storage,
    out: int,
    stack: int,
    bar: Any,
) -> None:
    """Stream the frames of ``positions`` and write their transitions, run by run."""
    done = 0  # transitions of this checkpoint written
    tail: np.ndarray | None = None  # the last ``stack`` frames of the previous window
    for start, frames in reader.read(int(positions[0]) - stack + 1, int(positions[-1]) + 2):
        window = frames if tail is None else np.concatenate([tail, frames])
        first = start - (0 if tail is None else len(tail))  # the window's first position
        # a transition needs frames v - stack + 1 .. v + 1: those with v + 1 in the window
        end = int(np.searchsorted(positions, first + len(window) - 1))
        if end > done:
            stacks = _stacks(window, stack)
            part = positions[done:end]
            for i, j in _runs(part):
                at = int(part[i]) - stack + 1 - first  # the stack of transition part[i]
                n = j - i
                rows = slice(done + i, done + j)
                data = TensorDict(
                    {
                        "observation": torch.from_numpy(stacks[at : at + n]),
                        "action": torch.from_numpy(columns["action"][rows]),
                        "episode": torch.from_numpy(columns["episode"][rows]),
                        "next": {
                            "observation": torch.from_numpy(stacks[at + 1 : at + 1 + n]),
                            "reward": torch.from_numpy(columns["reward"][rows, None]),
                            "done": torch.from_numpy(columns["done"][rows, None]),
                            "terminated": torch.from_numpy(columns["done"][rows, None]),
                        },
                    },
                    batch_size=[n],
                )
                storage.set(slice(out + done + i, out + done + j), data)
                if bar is not None:
                    bar.update(n)
            done = end
        tail = window[-stack:].copy()
    if done != len(positions):
        raise ValueError(f"{reader.path}: the frames ended before transition {done}")


def convert_atari(
    sources: Sequence[Source],
    path: str | os.PathLike[str],
    *,
    codec: Any = "lz4",
    stack: int = STACK,
    chunk: int | None = None,
    progress: bool = True,
    desc: str = "converting",
) -> dict[str, Any]:
    """Convert checkpoints into a new storage directory ``path`` (see :func:`new_storage`).

    Args:
        sources: the checkpoints, in the order to write them.
        path: the new storage directory.
        codec: the frames' compression (``FrameStackStorage``'s ``codec``).
        stack: frames per observation.
        chunk: frames decompressed at a time (default 8192).
        progress: show a progress bar.
        desc: label of the progress bar.

    Returns:
        ``{"transitions", "episodes", "stack", "frame_shape", "codec", "keys", "metadata"}``;
        ``metadata["checkpoints"]`` describes each checkpoint; keys: name -> [shape, dtype].

    Raises:
        ValueError: a malformed file (named), or no valid transition at all.
    """
    codec = check_codec(codec)
    found = count_transitions(sources, stack)
    total = sum(c.transitions for c in found)
    if total == 0:
        raise ValueError(f"checkpoints {[c.number for c in found]}: no valid transition")
    storage = new_storage(Path(path), total, stack, codec)
    bar = tqdm(total=total, desc=desc, unit="steps", unit_scale=True, disable=not progress)
    try:
        written = write_transitions(sources, storage, stack=stack, chunk=chunk, bar=bar)
    finally:
        bar.close()
        storage.close()
    if written["transitions"] != total:
        raise ValueError(f"wrote {written['transitions']} transitions, counted {total}")
    first = found[0]
    frames = [stack, *first.frame_shape]
    keys = {
        "observation": [frames, "uint8"],
        "action": [[], str(first.action)],
        "episode": [[], "int64"],
        "next/observation": [frames, "uint8"],
        "next/reward": [[1], str(first.reward)],
        "next/done": [[1], "bool"],
        "next/terminated": [[1], "bool"],
    }
    return {
        "transitions": total,
        "episodes": written["episodes"],
        "stack": stack,
        "frame_shape": list(first.frame_shape),
        "codec": codec,
        "keys": keys,
        "metadata": {"checkpoints": written["checkpoints"]},
    }
