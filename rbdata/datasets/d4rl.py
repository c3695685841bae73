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
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rbdata.datasets._cache import (
    DATASET_FILE,
    cache_root,
    d4rl_download_path,
    entry_dir,
    lock_for,
)
from rbdata.datasets._catalog import D4RL_PREFIX, D4RLEntry, d4rl_entry
from rbdata.datasets._d4rl_convert import convert_d4rl, read_d4rl_metadata
from rbdata.datasets._download import Downloaded, local_path, resolve_mirror, verify_file
from rbdata.datasets._download import download as fetch
from rbdata.datasets._prepare import prepare_entry
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
        return convert_d4rl(path, storage, backend, progress=progress, desc=desc)

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
