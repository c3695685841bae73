"""Conversion of an OGBench ``.npz`` file into a storage directory, chunk by chunk.

The keys are those of :mod:`rbdata.datasets.ogbench`: one row per row of the file, in file
order, with the file's dtypes. Every member is streamed (:mod:`rbdata.datasets._npz`), so
memory holds one block of rows (at most ~32 MiB of row data), not the file.

The layout follows OGBench's loader, ``ogbench.utils.load_dataset``: a trajectory of ``T``
steps is ``T`` rows ``(s_t, a_t)``, and ``terminals`` is 1 on its last row, whose next
observation the file does not hold; the next observation of any other row is the next row's
observation. OGBench's "compact" load gives ``valids = 1 - terminals`` for this; its "regular"
load drops the last rows instead. A file that holds ``next_observations`` itself (a regular
dataset saved by a user) uses it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rbdata.datasets._build import Block, write_blocks
from rbdata.datasets._json import json_safe
from rbdata.datasets._npz import NpzArchive, NpzMember, RowStream

__all__ = ["convert_ogbench", "check_ogbench"]

_REQUIRED = ("observations", "actions", "terminals")
_NEXT = "next_observations"
#: OGBench's in-memory compact layout (terminals already merged with the next row's): not a file
_REFUSED = ("valids",)
_BLOCK_BYTES = 1 << 25  # rows of a conversion block: at most 32 MiB of row data
_BLOCK_ROWS = 1 << 16


class _Counts:
    """Filled in while blocks stream: the episodes seen so far."""

    episodes = 0


def check_ogbench(npz: NpzArchive) -> tuple[int, list[NpzMember], dict[str, Any]]:
    """The rows of an OGBench-layout archive, its extra per-row members and its 0-d members.

    Raises:
        ValueError: a required member is missing, a member's rows differ from the
            observations', or the file is OGBench's compact in-memory layout (``valids``).
    """
    source, members = npz.path, npz.members
    missing = [name for name in _REQUIRED if name not in members]
    if missing:
        raise ValueError(
            f"{source}: not an OGBench file, missing arrays {missing} (has {sorted(members)})"
        )
    for name in _REFUSED:
        if name in members:
            raise ValueError(
                f"{source}: holds {name!r}, the layout of ogbench.utils.load_dataset("
                "compact_dataset=True) in memory (its terminals are merged with the next "
                "row's): convert the published file instead"
            )
    obs = members["observations"]
    if not obs.shape:
        raise ValueError(f"{source}: 'observations' is a scalar, expected one row per step")
    n = obs.shape[0]
    extras: list[NpzMember] = []
    scalars: dict[str, Any] = {}
    for name, member in members.items():
        if not member.shape and name not in _REQUIRED and name != _NEXT:
            scalars[name] = json_safe(npz.read_small(name))
            continue
        if not member.shape or member.shape[0] != n:
            raise ValueError(
                f"{source}: array {name!r} has shape {member.shape}, expected {n} rows "
                "(one per row of 'observations')"
            )
        if name not in _REQUIRED and name != _NEXT:
            if any(part in ("", ".", "..") for part in name.split("/")):
                raise ValueError(f"{source}: array name {name!r} is not a key (empty, . or ..)")
            extras.append(member)
    paths = {tuple(m.name.split("/")) for m in extras}
    for path in paths:
        if any(path[:i] in paths for i in range(1, len(path))):
            raise ValueError(
                f"{source}: array {'/'.join(path)!r} is nested under array "
                f"{'/'.join(next(path[:i] for i in range(1, len(path)) if path[:i] in paths))!r}"
            )
    if members["terminals"].shape[1:] not in ((), (1,)):
        raise ValueError(f"{source}: 'terminals' has shape {members['terminals'].shape}")
    if _NEXT in members and (
        members[_NEXT].shape != obs.shape or members[_NEXT].dtype != obs.dtype
    ):
        raise ValueError(
            f"{source}: {_NEXT!r} ({members[_NEXT].shape}, {members[_NEXT].dtype}) and "
            f"'observations' ({obs.shape}, {obs.dtype}) differ"
        )
    return n, extras, scalars


def _blocks(
    npz: NpzArchive, n: int, extras: list[NpzMember], rows: int, counts: _Counts
) -> Iterator[Block]:
    compact = _NEXT not in npz.members
    streams: dict[str, RowStream] = {}
    try:
        for name in [*_REQUIRED, *([] if compact else [_NEXT]), *(m.name for m in extras)]:
            streams[name] = npz.open(name)
        obs_stream = streams["observations"]
        episode = 0
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            m = stop - start
            # compact: one more row, the next observation of the block's last row
            extended = obs_stream.read(m + 1 if compact and stop < n else m)
            o = extended[:m]
            obs_stream.unread(extended[m:])
            done = streams["terminals"].read(m).reshape(m) != 0
            ids = episode + np.cumsum(done, dtype=np.int64) - done
            episode += int(done.sum())
            block: dict[tuple[str, ...], Any] = {
                ("observation",): o,
                ("action",): streams["actions"].read(m),
            }
            if not compact:
                block[("next", "observation")] = streams[_NEXT].read(m)
            else:
                valid = ~done  # OGBench's valids: 1 - terminals ...
                valid[len(extended) - 1 :] = False  # ... and never past the file's last row
                nxt = o.copy()
                take = np.flatnonzero(valid)
                nxt[take] = extended[take + 1]
                block[("next", "observation")] = nxt
            block[("next", "done")] = done.reshape(m, 1)
            if compact:
                block[("next", "valid")] = valid.reshape(m, 1)
            block[("episode",)] = ids
            for member in extras:
                key = ("info", *member.name.split("/"))
                block[key] = streams[member.name].read(m)
            if stop == n:
                episode += 0 if done[-1] else 1  # a last, unfinished episode
                for stream in streams.values():
                    stream.finish()
            counts.episodes = episode
            yield block
    finally:
        for stream in streams.values():
            stream.close()


def _block_rows(npz: NpzArchive) -> int:
    members = npz.members
    row = sum(m.row_bytes for m in members.values() if m.shape)
    row += members["observations"].row_bytes  # the next observations built for compact files
    return max(1, min(_BLOCK_ROWS, _BLOCK_BYTES // max(1, 2 * row)))


def convert_ogbench(
    file: str | os.PathLike[str],
    path: str | os.PathLike[str],
    backend: str = "memmap",
    *,
    rows: int | None = None,
    progress: bool = True,
    desc: str = "converting",
) -> dict[str, Any]:
    """Convert an OGBench ``.npz`` file into a new storage directory ``path``, chunk by chunk.

    Args:
        file: the ``.npz`` file (``np.savez`` or ``np.savez_compressed``).
        path: the new storage directory.
        backend: ``"memmap"`` or ``"arrow"``.
        rows: rows per block (default: up to 65536, at most ~32 MiB of row data).
        progress: show a progress bar.
        desc: label of the progress bar.

    Returns:
        ``{"transitions", "episodes", "layout", "metadata", "keys"}``: ``layout`` is
        ``"compact"`` (no ``next_observations`` in the file) or ``"regular"``; ``metadata``
        holds the file's 0-d arrays; keys: name -> [shape, dtype].

    Raises:
        ValueError: not an OGBench-layout ``.npz``, or a corrupt or truncated one (the message
            names the file and the array).
    """
    with NpzArchive(file) as npz:
        n, extras, scalars = check_ogbench(npz)
        counts = _Counts()
        layout = write_blocks(
            _blocks(npz, n, extras, rows or _block_rows(npz), counts),
            n,
            Path(path),
            backend,
            desc=desc,
            progress=progress,
        )
        compact = _NEXT not in npz.members
    keys = {"/".join(leaf.key): [list(leaf.shape), str(leaf.dtype)[6:]] for leaf in layout.leaves}
    return {
        "transitions": n,
        "episodes": counts.episodes,
        "layout": "compact" if compact else "regular",
        "metadata": scalars,
        "keys": keys,
    }
