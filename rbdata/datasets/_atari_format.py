"""Dopamine's replay-buffer checkpoints: reading the files, and which records are transitions.

A checkpoint of Dopamine's ``OutOfGraphReplayBuffer`` (``save``/``load``) is one gzip file per
array, each holding one ``np.save`` array (no pickle): the buffer's ``capacity`` rows of
``$store$_observation`` (single frames, ``[capacity, H, W]`` uint8), ``$store$_action``,
``$store$_reward`` and ``$store$_terminal`` (``[capacity]``), its ``add_count`` (0-d: how many
records were ever added, padding included) and its ``invalid_range``. Every file is read
through its ``.npy`` header and streamed through the decompressor
(:mod:`rbdata.datasets._build`), so a frame file is never in memory whole; nothing is ever
unpickled. :func:`valid_positions` applies the rules of ``is_valid_transition`` (see
:mod:`rbdata.datasets.atari` for them in words), vectorised over the whole buffer; the tests
check it against a per-index loop.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import numpy as np

from rbdata.datasets._build import NpzMember, RowStream, read_npy_header

__all__ = [
    "Checkpoint",
    "FrameReader",
    "UPDATE_HORIZON",
    "read_checkpoint",
    "valid_positions",
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
