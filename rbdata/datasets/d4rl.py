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

The file comes from the catalog's URL (behind ``RBDATA_D4RL_MIRROR`` if set), from ``url=``, or
from a local copy (``file=``, or a ``file://`` URL or mirror): a local file is verified like a
download (size and sha256 where the catalog has them, ``sha256=`` instead) and converted in
place, never copied, modified or deleted.

The conversion (:func:`convert_d4rl`) goes block by block: one row per row of the file, in file
order, with the file's dtypes; memory holds one block (at most ~32 MiB of observations) at a time.

Only the file's own bytes are converted. Before anything is read, every name the converter
reads (the row datasets, everything below ``infos`` and ``metadata``) is checked link by link
(:func:`check_self_contained`): an HDF5 external link, a virtual dataset with a source in
another file, or a dataset whose raw data is stored in external files would make HDF5 read
another file on disk into the cache, and is refused with a ``ValueError`` that names it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rbdata.datasets._build import Block, json_safe, write_blocks
from rbdata.datasets._cache import (
    DATASET_FILE,
    cache_root,
    d4rl_download_path,
    entry_dir,
    lock_for,
)
from rbdata.datasets._catalog import D4RL_PREFIX, D4RLEntry, d4rl_entry
from rbdata.datasets._download import (
    Downloaded,
    local_path,
    prepare_entry,
    resolve_mirror,
    verify_file,
)
from rbdata.datasets._download import download as fetch
from rbdata.datasets.base import OfflineDataset
from rbdata.samplers.base import Sampler

__all__ = [
    "D4RL",
    "check_self_contained",
    "convert_d4rl",
    "d4rl_download_path",
    "prepare",
    "read_d4rl_metadata",
    "source_url",
]


FAMILY = "d4rl"
MIRROR_ENV = "RBDATA_D4RL_MIRROR"


class D4RL(OfflineDataset):
    """A D4RL dataset: downloaded (resumable, checksummed), converted once, memory-mapped.

    The first construction downloads the HDF5 file into the cache (``root``, else
    ``$RBDATA_HOME``, else the user cache directory), converts it block by block into a
    memory-mapped storage and opens it; later constructions open the converted entry in
    milliseconds without the network or the HDF5 file. With ``file=`` (e.g. D4RL's own
    ``~/.d4rl/datasets/hopper_medium-v2.hdf5``) the local file is verified and converted
    instead, without the network.

    Args:
        name: the D4RL id, e.g. ``"hopper-medium-v2"`` (see ``rbdata datasets list``).
        root: the cache root.
        download: download the file if it is not in the cache (else raise). With ``False``
            no connection is ever opened: the file must be in the cache or local.
        backend: ``"memmap"`` or ``"arrow"`` storage.
        url: the full URL of this one file (a mirror), instead of the catalog's; a
            ``file://`` URL is a local file. The environment variable ``RBDATA_D4RL_MIRROR``
            replaces the catalog's ``http://rail.eecs.berkeley.edu/datasets/offline_rl/``
            prefix instead (a ``file://`` mirror is a local folder).
        file: a local copy of the HDF5 file, verified like a download and converted from
            where it is (not copied, never modified or deleted).
        sha256: the expected digest of the file, replacing the catalog's sha256 and size
            (a mirror may serve a re-packed file).
        sampler: sampler of :meth:`~OfflineDataset.sample` and iteration (default uniform).
        batch_size: default batch size of :meth:`~OfflineDataset.sample` and iteration.
        transform: applied to sampled batches.
        progress: show progress bars for the download and the conversion.

    Raises:
        KeyError: an unknown id.
        ValueError: both ``file`` and ``url``, a malformed ``sha256``, a sample id without
            a source (the message says how to build the sample), or a file whose data
            reaches outside it: an HDF5 external link, a virtual dataset mapping another
            file or external storage (the message names it; nothing is converted).
        FileNotFoundError: ``download=False`` and the dataset is neither converted nor in the
            cache, or ``file`` does not exist.
        rbdata.datasets.ChecksumError: the file's size or sha256 is not the expected one; the
            message names the file and both values (nothing is cached; a file that was already
            there is kept).
        rbdata.datasets.DownloadError: the download failed; the message ends with the ways
            out (a mirror, a local file).
    """

    def __init__(
        self,
        name: str,
        root: str | os.PathLike[str] | None = None,
        *,
        download: bool = True,
        backend: str = "memmap",
        url: str | None = None,
        file: str | os.PathLike[str] | None = None,
        sha256: str | None = None,
        sampler: Sampler | None = None,
        batch_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        progress: bool = True,
    ) -> None:
        entry = d4rl_entry(name)
        if file is not None and url is not None:
            raise ValueError(f"file, url: pass one of them, not both; got {file=!r}, {url=!r}")
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
                file=file,
                sha256=sha256,
                progress=progress,
            )
        super().__init__(target, sampler=sampler, batch_size=batch_size, transform=transform)


def _sample_advice(entry: D4RLEntry) -> str:
    return (
        f"build it with `rbdata datasets sample d4rl/{entry.id} --out FILE`, then pass "
        f"file=FILE (`rbdata datasets download d4rl/{entry.id} --file FILE`)"
    )


def _way_out(entry: D4RLEntry) -> str:
    """How to get ``entry`` without its host: a mirror or a local file."""
    if entry.is_sample:
        return f"{_sample_advice(entry)}, or set {MIRROR_ENV} to a mirror that serves it"
    return (
        f"to get it another way, set {MIRROR_ENV} to a mirror of {D4RL_PREFIX} (a URL or a "
        f"file:// folder), or use a local copy of the file: D4RL({entry.id!r}, file=PATH), "
        f"or `rbdata datasets download d4rl/{entry.id} --file PATH`"
    )


def source_url(entry: D4RLEntry, url: str | None = None) -> str:
    """The URL to download ``entry`` from: ``url``, else the catalog's behind the mirror.

    Raises:
        ValueError: a sample id (served by a mirror only) without ``url`` or a mirror; the
            message says how to build the sample file.
    """
    if url is not None:
        return url
    mirror = os.environ.get(MIRROR_ENV)
    if entry.is_sample:
        if not mirror:
            raise ValueError(
                f"{entry.id!r} is an rbdata sample dataset, not on the D4RL host: {_way_out(entry)}"
            )
        return resolve_mirror(D4RL_PREFIX + entry.url, D4RL_PREFIX, mirror)
    return resolve_mirror(entry.url, D4RL_PREFIX, mirror)


def _local_source(
    entry: D4RLEntry, file: str | os.PathLike[str] | None, url: str | None
) -> tuple[Path, str] | None:
    """The local file to convert and its URL: ``file=``, a ``file://`` url or mirror, else None."""
    if file is not None:
        path = Path(file).expanduser().absolute()
        return path, path.as_uri()
    mirror = os.environ.get(MIRROR_ENV)
    if url is None and not (mirror and local_path(mirror) is not None):
        return None
    href = source_url(entry, url)
    found = local_path(href)
    return None if found is None else (found.expanduser().absolute(), href)


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
    file: str | os.PathLike[str] | None = None,
) -> None:
    """Get the file of ``entry`` (local, cached or downloaded) and convert it into ``target``.

    A failure leaves nothing behind: no entry, no lock file, no empty folder (a partial
    download with bytes in it stays, for the next call to resume).
    """
    expected_sha = sha256.lower() if sha256 else entry.sha256
    expected_size = None if sha256 else entry.size

    def cached_file() -> tuple[Downloaded, dict[str, Any]]:
        got, fetched = _cached_file(
            entry, cached, url, download, expected_sha, expected_size, progress
        )
        return got, ({"url": fetched} if fetched is not None else {})

    def convert(path: Path, storage: Path) -> dict[str, Any]:
        desc = f"{entry.id} ({backend})"
        try:
            return convert_d4rl(path, storage, backend, progress=progress, desc=desc)
        except OSError as err:
            if isinstance(err, FileNotFoundError) and not path.exists():
                raise
            raise ValueError(
                f"dataset {entry.id!r}: {str(path)!r} is not a readable HDF5 file "
                f"({type(err).__name__}: {err}); expected D4RL's {entry.id} file, a complete "
                "HDF5 file with observations, actions, rewards, terminals and timeouts: it is "
                "truncated or corrupt; download it again or pass the right file"
            ) from err

    cached = d4rl_download_path(base, entry, url)
    head = {"family": FAMILY, "id": entry.id, "backend": backend}
    tail = {"ref_min_score": entry.ref_min_score, "ref_max_score": entry.ref_max_score}
    prepare_entry(
        target,
        base,
        cached,
        name=entry.id,
        local=_local_source(entry, file, url),
        cached_file=cached_file,
        convert=convert,
        fields=(head, tail),
        sha256=expected_sha,
        size=expected_size,
    )


def _cached_file(
    entry: D4RLEntry,
    file: Path,
    url: str | None,
    download: bool,
    sha256: str | None,
    size: int | None,
    progress: bool,
) -> tuple[Downloaded, str | None]:
    """The verified file in the cache's downloads, fetched if missing and ``download``."""
    with lock_for(file):
        if file.is_file():  # there already: verified, never deleted, no network
            try:
                href: str | None = source_url(entry, url)
            except ValueError:
                href = None
            how = f" (`rbdata datasets remove d4rl/{entry.id}`)" if url is None else ""
            kept = (
                f"the file is kept: delete it{how} to download it again, or pass sha256= "
                "(--sha256) with the digest of a file you trust"
            )
            got = verify_file(file, name=entry.id, sha256=sha256, size=size, hint=kept)
            return got, href
        if not download:
            raise FileNotFoundError(
                f"D4RL dataset {entry.id!r} is not in the cache ({file}) and download=False: "
                f"pass download=True (`rbdata datasets download d4rl/{entry.id}`), or "
                f"{_sample_advice(entry) if entry.is_sample else _way_out(entry)}"
            )
        href = source_url(entry, url)
        got = fetch(
            href,
            file,
            name=entry.id,
            sha256=sha256,
            size=size,
            progress=progress,
            hint=_way_out(entry),
        )
        return got, href


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
