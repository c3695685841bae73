"""Conversion of a D4RL-layout HDF5 file into a storage directory, block by block.

The keys are those of :mod:`rbdata.datasets.d4rl`: one row per row of the file, in file order,
with the file's dtypes; memory holds one block (at most ~32 MiB of observations) at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rbdata.datasets._build import Block, write_blocks
from rbdata.datasets._json import json_safe

__all__ = ["convert_d4rl", "read_d4rl_metadata"]

_REQUIRED = ("observations", "actions", "rewards", "terminals")
_BLOCK_BYTES = 1 << 25  # rows of a conversion block: at most 32 MiB of row data
_BLOCK_ROWS = 1 << 16


def _h5py() -> Any:
    import h5py

    return h5py


def read_d4rl_metadata(h5: Any) -> dict[str, Any]:
    """Every dataset below the file's ``metadata`` group, keyed by its path below it.

    Nested groups give keys like ``"policy/fc0/weight"``; text comes back as ``str``.
    """
    group = h5.get("metadata")
    out: dict[str, Any] = {}
    if group is None:
        return out
    h5py = _h5py()

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            out[name] = json_safe(obj[()])

    group.visititems(visit)
    return out


def _infos(h5: Any) -> dict[tuple[str, ...], Any]:
    group = h5.get("infos")
    out: dict[tuple[str, ...], Any] = {}
    if group is None:
        return out
    h5py = _h5py()

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            key = ("info", *name.split("/"))
            out[key] = obj

    group.visititems(visit)
    return out


class _Counts:
    """Filled in while blocks stream: the episodes seen so far."""

    episodes = 0


def _check_file(h5: Any, source: str) -> tuple[int, dict[tuple[str, ...], Any]]:
    """The rows of a D4RL-layout file and its ``infos/*`` datasets; refuse a foreign file."""
    missing = [name for name in _REQUIRED if name not in h5]
    if missing:
        raise ValueError(f"{source}: not a D4RL file, missing datasets {missing}")
    n = int(h5["observations"].shape[0])
    columns: dict[str, Any] = {name: h5[name] for name in _REQUIRED}
    for optional in ("timeouts", "next_observations"):
        if optional in h5:
            columns[optional] = h5[optional]
    infos = _infos(h5)
    for name, ds in [*columns.items(), *(("/".join(k), v) for k, v in infos.items())]:
        if not ds.shape or ds.shape[0] != n:
            raise ValueError(f"{source}: dataset {name!r} has shape {ds.shape}, expected {n} rows")
    for name in ("rewards", "terminals", "timeouts"):
        if name in columns and columns[name].shape[1:] not in ((), (1,)):
            raise ValueError(f"{source}: dataset {name!r} has shape {columns[name].shape}")
    if "next_observations" in columns and h5["next_observations"].shape != h5["observations"].shape:
        raise ValueError(f"{source}: next_observations and observations differ in shape")
    return n, infos


def _blocks(
    h5: Any, n: int, infos: dict[tuple[str, ...], Any], rows: int, counts: _Counts
) -> Iterator[Block]:
    # look the datasets up once: h5py's name lookup costs ~0.1 ms a call
    obs, actions, rewards, terminals = (h5[name] for name in _REQUIRED)
    next_obs, timeouts = h5.get("next_observations"), h5.get("timeouts")
    episode = 0
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        m = stop - start
        # without next_observations, one more row: the next observation of the block's last
        extended = obs[start : stop if next_obs is not None else min(n, stop + 1)]
        o = extended[:m]
        term = np.asarray(terminals[start:stop]).reshape(m) != 0
        trunc = (
            np.zeros(m, bool)
            if timeouts is None
            else np.asarray(timeouts[start:stop]).reshape(m) != 0
        )
        done = term | trunc
        ids = episode + np.cumsum(done, dtype=np.int64) - done
        episode += int(done.sum())
        reward = np.asarray(rewards[start:stop])
        block: dict[tuple[str, ...], Any] = {
            ("observation",): o,
            ("action",): actions[start:stop],
        }
        if next_obs is not None:
            block[("next", "observation")] = next_obs[start:stop]
        else:
            following = extended[1:]  # the rows that have a next row in the file
            valid = ~done
            valid[len(following) :] = False
            nxt = o.copy()
            take = np.flatnonzero(valid)
            nxt[take] = following[take]
            block[("next", "observation")] = nxt
        block[("next", "reward")] = reward.reshape(m, 1)
        block[("next", "terminated")] = term.reshape(m, 1)
        block[("next", "truncated")] = trunc.reshape(m, 1)
        block[("next", "done")] = done.reshape(m, 1)
        if next_obs is None:
            block[("next", "valid")] = valid.reshape(m, 1)
        block[("episode",)] = ids
        for key, ds in infos.items():
            block[key] = ds[start:stop]
        if stop == n:
            episode += 0 if done[-1] else 1  # a last, unfinished episode
        counts.episodes = episode
        yield block


def _block_rows(h5: Any) -> int:
    row = 0
    for name in ("observations", "next_observations", "actions"):
        if name in h5:
            ds = h5[name]
            row += int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize
    return max(1, min(_BLOCK_ROWS, _BLOCK_BYTES // max(1, 2 * row)))


def convert_d4rl(
    file: str | os.PathLike[str],
    path: str | os.PathLike[str],
    backend: str = "memmap",
    *,
    rows: int | None = None,
    progress: bool = True,
    desc: str = "converting",
) -> dict[str, Any]:
    """Convert a D4RL-layout HDF5 file into a new storage directory ``path``, block by block.

    Args:
        file: the HDF5 file.
        path: the new storage directory.
        backend: ``"memmap"`` or ``"arrow"``.
        rows: rows per block (default: up to 65536, at most ~32 MiB of observations).
        progress: show a progress bar.
        desc: label of the progress bar.

    Returns:
        ``{"transitions", "episodes", "metadata", "keys"}`` (keys: name -> [shape, dtype]).
    """
    h5py = _h5py()
    with h5py.File(file, "r") as h5:
        n, infos = _check_file(h5, str(file))
        metadata = read_d4rl_metadata(h5)
        counts = _Counts()
        block_rows = rows or _block_rows(h5)
        layout = write_blocks(
            _blocks(h5, n, infos, block_rows, counts),
            n,
            Path(path),
            backend,
            desc=desc,
            progress=progress,
        )
    keys = {"/".join(leaf.key): [list(leaf.shape), str(leaf.dtype)[6:]] for leaf in layout.leaves}
    return {"transitions": n, "episodes": counts.episodes, "metadata": metadata, "keys": keys}
