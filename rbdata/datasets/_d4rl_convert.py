"""Conversion of a D4RL-layout HDF5 file into a storage directory, block by block.

The keys are those of :mod:`rbdata.datasets.d4rl`: one row per row of the file, in file order,
with the file's dtypes; memory holds one block (at most ~32 MiB of observations) at a time.

Only the file's own bytes are converted. Before anything is read, every name the converter
reads (the row datasets, everything below ``infos`` and ``metadata``) is checked link by link
(:func:`check_self_contained`): an HDF5 external link, a virtual dataset with a source in
another file, or a dataset whose raw data is stored in external files would make HDF5 read
another file on disk into the cache, and is refused with a ``ValueError`` that names it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rbdata.datasets._build import Block, write_blocks
from rbdata.datasets._json import json_safe

__all__ = ["check_self_contained", "convert_d4rl", "read_d4rl_metadata"]

_REQUIRED = ("observations", "actions", "rewards", "terminals")
_OPTIONAL = ("timeouts", "next_observations")
_GROUPS = ("infos", "metadata")  # read whole
_MAX_SOFT = 16  # soft links followed in a row before a chain is refused
_BLOCK_BYTES = 1 << 25  # rows of a conversion block: at most 32 MiB of row data
_BLOCK_ROWS = 1 << 16


def _h5py() -> Any:
    import h5py

    return h5py


def read_d4rl_metadata(h5: Any) -> dict[str, Any]:
    """Every dataset below the file's ``metadata`` group, keyed by its path below it.

    Nested groups give keys like ``"policy/fc0/weight"``; text comes back as ``str``.

    Raises:
        ValueError: the group reaches outside the file (see :func:`check_self_contained`).
    """
    check_self_contained(h5, str(h5.filename), ("metadata",))
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


def _outside(h5: Any, path: str, source: str, depth: int = 0) -> None:
    """Refuse ``path`` if resolving it crosses an external link (soft links followed)."""
    h5py = _h5py()
    if depth > _MAX_SOFT:
        raise ValueError(f"{source}: {path!r}: more than {_MAX_SOFT} soft links in a row")
    current = ""
    for part in (p for p in path.split("/") if p):
        parent, current = current or "/", f"{current}/{part}"
        # every component before this one is checked, so this lookup stays in the file
        link = h5.get(current, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            raise ValueError(
                f"{source}: {current!r} is an HDF5 external link to {link.path!r} in the file "
                f"{link.filename!r}; only data inside the file is converted (external links "
                "are refused)"
            )
        if isinstance(link, h5py.SoftLink):
            target = link.path if link.path.startswith("/") else f"{parent}/{link.path}"
            _outside(h5, target, source, depth + 1)


def _check_dataset(ds: Any, name: str, source: str) -> None:
    """Refuse a dataset whose bytes live in another file (virtual or external storage)."""
    if ds.is_virtual:
        for vs in ds.virtual_sources():
            if vs.file_name != ".":
                raise ValueError(
                    f"{source}: {name!r} is a virtual dataset with a source in the file "
                    f"{vs.file_name!r} ({vs.dset_name!r}); only data inside the file is "
                    "converted (virtual datasets mapping other files are refused)"
                )
    external = ds.external
    if external:
        files = sorted({str(entry[0]) for entry in external})
        raise ValueError(
            f"{source}: {name!r} stores its data in the external file(s) {files}; only data "
            "inside the file is converted (external storage is refused)"
        )


def check_self_contained(h5: Any, source: str, names: tuple[str, ...] | None = None) -> None:
    """Refuse a file whose converted names reach outside it (see the module docstring).

    Checks ``names`` (default: the row datasets, ``infos`` and ``metadata``) and every object
    below them: no external link on the way to any of them (through soft links too), no
    virtual dataset with a source in another file, no dataset stored in external files.
    Nothing outside the file is opened.

    Raises:
        ValueError: names the link or dataset, and the other file.
    """
    h5py = _h5py()
    seen: set[Any] = set()

    def walk(path: str) -> None:
        _outside(h5, path, source)
        obj = h5.get(path)
        if obj is None or obj.id in seen:  # missing: _check_file says so
            return
        seen.add(obj.id)
        if isinstance(obj, h5py.Dataset):
            _check_dataset(obj, path, source)
        elif isinstance(obj, h5py.Group):
            for name in obj:  # link names: nothing is resolved yet
                walk(f"{path}/{name}")

    for name in (*_REQUIRED, *_OPTIONAL, *_GROUPS) if names is None else names:
        walk(f"/{name}")


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
    for optional in _OPTIONAL:
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

    Raises:
        ValueError: not a D4RL-layout file, or one whose data reaches outside it (an
            external link, a virtual dataset of another file, external storage; the message
            names it).
    """
    h5py = _h5py()
    with h5py.File(file, "r") as h5:
        check_self_contained(h5, str(file))  # first: nothing outside the file is read
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
