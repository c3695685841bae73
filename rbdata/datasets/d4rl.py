"""``D4RL``: the D4RL datasets, downloaded, checksummed, converted once, memory-mapped.

Keys (one row per row of the HDF5 file, same order, the file's dtypes):

====================================  ===================================================
key                                   from the file
====================================  ===================================================
``"observation"``                     ``observations``
``"action"``                          ``actions``
``("next", "observation")``           ``next_observations``; without it, the next row's
                                      observation in the same episode, else a copy of the
                                      row's own (``("next", "valid")`` is ``False`` there)
``("next", "reward")`` ``[N, 1]``     ``rewards``
``("next", "terminated")`` ``[N, 1]`` ``terminals`` (bool)
``("next", "truncated")`` ``[N, 1]``  ``timeouts`` (bool; ``False`` in older files without it)
``("next", "done")`` ``[N, 1]``       terminated | truncated
``"episode"`` ``[N]`` int64           0, 1, 2, ... in file order; an episode ends at a done row
``("info", name)``                    every ``infos/<name>`` dataset
====================================  ===================================================

Every ``metadata/*`` entry is kept in :attr:`OfflineDataset.metadata` (text decoded as UTF-8).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rbdata.datasets._build import Block, write_blocks
from rbdata.datasets._cache import (
    DATASET_FILE,
    STORAGE_DIR,
    build_entry,
    cache_root,
    entry_dir,
    lock_for,
)
from rbdata.datasets._catalog import D4RL_PREFIX, D4RLEntry, d4rl_entry
from rbdata.datasets._download import download as fetch
from rbdata.datasets._download import resolve_mirror
from rbdata.datasets._json import json_safe
from rbdata.datasets.base import OfflineDataset
from rbdata.samplers.base import Sampler

__all__ = [
    "D4RL",
    "convert_d4rl",
    "d4rl_download_path",
    "prepare",
    "read_d4rl_metadata",
    "source_url",
]

FAMILY = "d4rl"
MIRROR_ENV = "RBDATA_D4RL_MIRROR"
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


def d4rl_download_path(root: Path, entry: D4RLEntry, url: str | None = None) -> Path:
    """Where the HDF5 file of ``entry`` is downloaded (ids sharing a file share the path)."""
    base = root / FAMILY / "downloads"
    if url is None:
        parts = [p for p in entry.file.split("/") if p not in ("", ".", "..")]
        return base.joinpath(*parts)
    tag = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    name = url.rstrip("/").rsplit("/", 1)[-1] or "data.hdf5"
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name).lstrip(".") or "data"
    return base / f"url-{tag}" / name


class D4RL(OfflineDataset):
    """A D4RL dataset: downloaded (resumable, checksummed), converted once, memory-mapped.

    The first construction downloads the HDF5 file into the cache (``root``, else
    ``$RBDATA_HOME``, else the user cache directory), converts it block by block into a
    memory-mapped storage and opens it; later constructions open the converted entry in
    milliseconds without the network or the HDF5 file.

    Args:
        name: the D4RL id, e.g. ``"hopper-medium-v2"`` (see ``rbdata datasets list``).
        root: the cache root.
        download: download the file if it is not in the cache (else raise).
        backend: ``"memmap"`` or ``"arrow"`` storage.
        url: the full URL of this one file (a mirror), instead of the catalog's. The
            environment variable ``RBDATA_D4RL_MIRROR`` replaces the catalog's
            ``http://rail.eecs.berkeley.edu/datasets/offline_rl/`` prefix instead.
        sha256: the expected digest of the file, replacing the catalog's sha256 and size
            (a mirror may serve a re-packed file).
        sampler: sampler of :meth:`~OfflineDataset.sample` and iteration (default uniform).
        batch_size: default batch size of :meth:`~OfflineDataset.sample` and iteration.
        transform: applied to sampled batches.
        progress: show progress bars for the download and the conversion.

    Raises:
        KeyError: an unknown id.
        FileNotFoundError: ``download=False`` and the dataset is not in the cache.
        rbdata.datasets.ChecksumError: the download's sha256 or size is not the expected one
            (nothing is cached).
        rbdata.datasets.DownloadError: the download failed after retries.
    """

    def __init__(
        self,
        name: str,
        root: str | os.PathLike[str] | None = None,
        *,
        download: bool = True,
        backend: str = "memmap",
        url: str | None = None,
        sha256: str | None = None,
        sampler: Sampler | None = None,
        batch_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        progress: bool = True,
    ) -> None:
        entry = d4rl_entry(name)
        base = cache_root(root)
        target = entry_dir(base, FAMILY, name, backend)
        if not (target / DATASET_FILE).is_file():
            prepare(
                entry,
                base,
                target,
                backend,
                download=download,
                url=url,
                sha256=sha256,
                progress=progress,
            )
        super().__init__(target, sampler=sampler, batch_size=batch_size, transform=transform)


def source_url(entry: D4RLEntry, url: str | None = None) -> str:
    """The URL to download ``entry`` from: ``url``, else the catalog's behind the mirror."""
    if url is not None:
        return url
    mirror = os.environ.get(MIRROR_ENV)
    if entry.is_sample:
        if not mirror:
            raise ValueError(
                f"{entry.id!r} is an rbdata sample dataset, served by a mirror only: set "
                f"{MIRROR_ENV} (see `make demo`) or pass url="
            )
        return resolve_mirror(D4RL_PREFIX + entry.url, D4RL_PREFIX, mirror)
    return resolve_mirror(entry.url, D4RL_PREFIX, mirror)


def prepare(
    entry: D4RLEntry,
    base: Path,
    target: Path,
    backend: str,
    *,
    download: bool,
    url: str | None,
    sha256: str | None,
    progress: bool,
) -> None:
    """Download (if needed) and convert ``entry`` into the cache entry ``target``."""
    href = source_url(entry, url)
    file = d4rl_download_path(base, entry, url)
    expected_sha = sha256.lower() if sha256 else entry.sha256
    expected_size = None if sha256 else entry.size

    def build(tmp: Path) -> dict[str, Any]:
        with lock_for(file):
            if not file.is_file() and not download:
                raise FileNotFoundError(
                    f"D4RL dataset {entry.id!r} is not in the cache ({target}); pass "
                    "download=True or run `rbdata datasets download d4rl/" + entry.id + "`"
                )
            got = fetch(
                href,
                file,
                name=entry.id,
                sha256=expected_sha,
                size=expected_size,
                progress=progress,
            )
        info = convert_d4rl(
            got.path, tmp / STORAGE_DIR, backend, progress=progress, desc=f"{entry.id} ({backend})"
        )
        return {
            "family": FAMILY,
            "id": entry.id,
            "backend": backend,
            **info,
            "source": {
                "url": href,
                "file": str(got.path.relative_to(base)),
                "size": got.size,
                "sha256": got.sha256,
                "sha256_verified": expected_sha is not None,
            },
            "ref_min_score": entry.ref_min_score,
            "ref_max_score": entry.ref_max_score,
        }

    build_entry(target, build)
