"""Conversion of DQN Replay checkpoints into a storage of frame-stacked transitions.

The keys, the order and the rules are those of :mod:`rbdata.datasets.atari`. A first pass
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

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tqdm.auto import tqdm

from rbdata.datasets._atari_catalog import BACKEND
from rbdata.datasets._atari_format import (
    FrameReader,
    read_checkpoint,
    valid_positions,
)
from rbdata.storages import FrameStackStorage
from rbdata.storages.base import Storage

__all__ = [
    "BACKEND",
    "STACK",
    "Counted",
    "Source",
    "check_codec",
    "convert_atari",
    "count_transitions",
    "new_storage",
    "write_transitions",
]

#: frames per observation (Dopamine's ``stack_size``, 4 for the DQN Replay Dataset)
STACK = 4
#: frames decompressed at a time
_CHUNK_FRAMES = 8192

#: one checkpoint: its number and its files by role (see ``_atari_catalog.ROLES``)
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
