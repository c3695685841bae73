"""``OGBench``: the OGBench datasets, downloaded, checksummed, converted once, memory-mapped.

OGBench (Park et al., 2024) publishes each dataset as ``<id>.npz`` and its validation split as
``<id>-val.npz`` (``ogbench.utils.download_datasets``). Keys (one row per row of the file,
same order, the file's dtypes; the rules of ``ogbench.utils.load_dataset``):

====================================  ===================================================
key                                   from the file
====================================  ===================================================
``"observation"``                     ``observations``
``"action"``                          ``actions``
``("next", "observation")``           ``next_observations`` if the file holds it; else the
                                      next row's observation within the trajectory, and a
                                      copy of the row's own on a trajectory's last row
                                      (``("next", "valid")`` is ``False`` there)
``("next", "done")`` ``[N, 1]``       ``terminals`` (bool): the trajectory ends at this row
``("next", "valid")`` ``[N, 1]``      only without ``next_observations``: OGBench's
                                      ``valids`` (not ``terminals``), and ``False`` on the
                                      file's last row
``"episode"`` ``[N]`` int64           0, 1, 2, ... in file order; an episode ends at a done row
``("info", name)``                    every other array, e.g. ``qpos``, ``qvel``,
                                      ``button_states`` (``a/b`` gives ``("info", "a", "b")``)
====================================  ===================================================

OGBench's files hold no rewards (goal-conditioned rewards depend on the goal; the
``singletask`` variants compute them with the environment) and no terminated/truncated split:
``terminals`` marks where a recorded trajectory stops (the scripts run with
``terminate_at_goal=False`` and a step limit).

The file comes from the catalog's URL (behind ``RBDATA_OGBENCH_MIRROR`` if set) or from a local
copy (``file=``, or a ``file://`` mirror): a local file is verified like a download (size and
sha256 where the catalog has them, ``sha256=`` instead) and converted in place, never copied,
modified or deleted.

The conversion (:func:`convert_ogbench`) goes chunk by chunk: every member is streamed
(:class:`~rbdata.datasets._build.NpzArchive`), so memory holds one block of rows (at most
~32 MiB of row data), not the file.

The layout follows OGBench's loader, ``ogbench.utils.load_dataset``: a trajectory of ``T``
steps is ``T`` rows ``(s_t, a_t)``, and ``terminals`` is 1 on its last row, whose next
observation the file does not hold; the next observation of any other row is the next row's
observation. OGBench's "compact" load gives ``valids = 1 - terminals`` for this; its "regular"
load drops the last rows instead. A file that holds ``next_observations`` itself (a regular
dataset saved by a user) uses it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rbdata.datasets._build import Block, NpzArchive, NpzMember, RowStream, json_safe, write_blocks
from rbdata.datasets._cache import (
    DATASET_FILE,
    cache_root,
    entry_dir,
    lock_for,
)
from rbdata.datasets._catalog import (
    OGBENCH_PREFIX,
    OGBenchFile,
    ogbench_download_path,
    ogbench_entry,
)
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

__all__ = ["OGBench", "check_ogbench", "convert_ogbench", "prepare", "source_url"]


FAMILY = "ogbench"
MIRROR_ENV = "RBDATA_OGBENCH_MIRROR"


class OGBench(OfflineDataset):
    """An OGBench dataset: downloaded (resumable, checksummed), converted once, memory-mapped.

    The first construction downloads ``<name>.npz`` (``<name>-val.npz`` for ``split="val"``)
    into the cache (``root``, else ``$RBDATA_HOME``, else the user cache directory), streams it
    chunk by chunk into a memory-mapped storage (memory bounded by a chunk, not by the file:
    OGBench's compressed ``.npz`` members cannot be memory-mapped) and opens it; later
    constructions open the converted entry in milliseconds without the network or the file.
    With ``file=`` (e.g. OGBench's own ``~/.ogbench/data/<name>.npz``) the local file is
    verified and converted instead, without the network.

    Args:
        name: the OGBench id, e.g. ``"antmaze-large-navigate-v0"`` (``rbdata datasets list``).
        root: the cache root.
        split: ``"train"`` (``<name>.npz``) or ``"val"`` (``<name>-val.npz``); the cache and
            the command line name the validation split ``<name>-val``.
        download: download the file if it is not in the cache (else raise). With ``False``
            no connection is ever opened: the file must be in the cache or local.
        file: a local copy of the split's ``.npz``, verified like a download and converted
            from where it is (not copied, never modified or deleted).
        sha256: the expected digest of the file, replacing the catalog's sha256 and size
            (a mirror may serve a re-packed file). Without one the computed digest is
            recorded in the entry (``info["source"]["sha256"]``).
        backend: ``"memmap"`` or ``"arrow"`` storage.
        sampler: sampler of :meth:`~OfflineDataset.sample` and iteration (default uniform).
        batch_size: default batch size of :meth:`~OfflineDataset.sample` and iteration.
        transform: applied to sampled batches.
        progress: show progress bars for the download and the conversion.

    Raises:
        KeyError: an unknown id.
        ValueError: an unknown split, a malformed ``sha256``, or a file that is not an OGBench
            ``.npz`` (corrupt, truncated, missing arrays; nothing is cached).
        FileNotFoundError: ``download=False`` and the dataset is neither converted nor in the
            cache, or ``file`` does not exist.
        rbdata.datasets.ChecksumError: the file's size or sha256 is not the expected one.
        rbdata.datasets.DownloadError: the download failed; the message ends with the ways
            out (a mirror, a local file).

    Examples:
        >>> OGBench("antmaze-larg-navigate-v0")
        Traceback (most recent call last):
        ...
        rbdata.errors.MissingKeyError: unknown OGBench dataset 'antmaze-larg-navigate-v0'; ...
    """

    def __init__(
        self,
        name: str,
        root: str | os.PathLike[str] | None = None,
        *,
        split: str = "train",
        download: bool = True,
        file: str | os.PathLike[str] | None = None,
        sha256: str | None = None,
        backend: str = "memmap",
        sampler: Sampler | None = None,
        batch_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        progress: bool = True,
    ) -> None:
        source = ogbench_entry(name).split(split)
        base = cache_root(root)
        target = entry_dir(base, FAMILY, source.id, backend)
        if not (target / DATASET_FILE).is_file():
            prepare(
                source,
                base,
                target,
                backend,
                download=download,
                file=file,
                sha256=sha256,
                progress=progress,
            )
        super().__init__(target, sampler=sampler, batch_size=batch_size, transform=transform)


def _way_out(source: OGBenchFile) -> str:
    """How to get ``source`` without its host: a mirror or a local file."""
    split = "" if source.split == "train" else ", split='val'"
    return (
        f"to get it another way, set {MIRROR_ENV} to a mirror of {OGBENCH_PREFIX} (a URL or a "
        f"file:// folder), or use a local copy of {source.file}: "
        f"OGBench({source.dataset!r}{split}, file=PATH), or "
        f"`rbdata datasets download ogbench/{source.id} --file PATH`"
    )


def source_url(source: OGBenchFile) -> str:
    """The URL to download ``source`` from: the catalog's, behind ``RBDATA_OGBENCH_MIRROR``.

    Examples:
        >>> from rbdata.datasets._catalog import ogbench_file
        >>> source_url(ogbench_file("scene-play-v0-val"))
        'https://rail.eecs.berkeley.edu/datasets/ogbench/scene-play-v0-val.npz'
    """
    return resolve_mirror(source.url, OGBENCH_PREFIX, os.environ.get(MIRROR_ENV))


def _local_source(
    source: OGBenchFile, file: str | os.PathLike[str] | None
) -> tuple[Path, str] | None:
    """The local file to convert and its URL: ``file=``, a ``file://`` mirror, else None."""
    if file is not None:
        path = Path(file).expanduser().absolute()
        return path, path.as_uri()
    href = source_url(source)
    found = local_path(href)
    return None if found is None else (found.expanduser().absolute(), href)


def prepare(
    source: OGBenchFile,
    base: Path,
    target: Path,
    backend: str,
    *,
    download: bool,
    sha256: str | None,
    progress: bool,
    file: str | os.PathLike[str] | None = None,
) -> None:
    """Get ``source`` (local, cached or downloaded) and convert it into the entry ``target``.

    A failure leaves nothing behind: no entry, no lock file, no empty folder (a partial
    download with bytes in it stays, for the next call to resume).
    """
    expected_sha = sha256.lower() if sha256 else source.sha256
    expected_size = None if sha256 else source.size

    def cached_file() -> tuple[Downloaded, dict[str, Any]]:
        got, href = _cached_file(source, cached, download, expected_sha, expected_size, progress)
        return got, {"url": href}

    def convert(path: Path, storage: Path) -> dict[str, Any]:
        desc = f"{source.id} ({backend})"
        return convert_ogbench(path, storage, backend, progress=progress, desc=desc)

    cached = ogbench_download_path(base, source)
    head = {
        "family": FAMILY,
        "id": source.id,
        "dataset": source.dataset,
        "split": source.split,
        "backend": backend,
    }
    prepare_entry(
        target,
        base,
        cached,
        name=source.id,
        local=_local_source(source, file),
        cached_file=cached_file,
        convert=convert,
        fields=(head, {}),
        sha256=expected_sha,
        size=expected_size,
    )


def _cached_file(
    source: OGBenchFile,
    file: Path,
    download: bool,
    sha256: str | None,
    size: int | None,
    progress: bool,
) -> tuple[Downloaded, str]:
    """The verified file in the cache's downloads, fetched if missing and ``download``."""
    href = source_url(source)
    with lock_for(file):
        if file.is_file():  # there already: verified, never deleted, no network
            kept = (
                f"the file is kept: delete it (`rbdata datasets remove ogbench/{source.id}`) to "
                "download it again, or pass sha256= (--sha256) with the digest of a file you trust"
            )
            return verify_file(file, name=source.id, sha256=sha256, size=size, hint=kept), href
        if not download:
            raise FileNotFoundError(
                f"OGBench dataset {source.id!r} is not in the cache ({file}) and download=False: "
                f"pass download=True (`rbdata datasets download ogbench/{source.id}`), or "
                f"{_way_out(source)}"
            )
        got = fetch(
            href,
            file,
            name=source.id,
            sha256=sha256,
            size=size,
            progress=progress,
            hint=_way_out(source),
        )
        return got, href


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
