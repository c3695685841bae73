"""``AtariDQN``, the DQN Replay Dataset's class, and its ``rbdata datasets download``.

The keys and the rules are in :mod:`rbdata.datasets.atari`; the files come from the catalog
(:mod:`rbdata.datasets.atari._catalog`) and are converted by
:mod:`rbdata.datasets.atari._convert`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rbdata.datasets._cache import (
    DATASET_FILE,
    STORAGE_DIR,
    build_entry,
    cache_root,
    entry_dir,
    lock_for,
    prune_empty_dirs,
)
from rbdata.datasets._download import (
    LOCAL_HINT,
    Downloaded,
    local_path,
    resolve_mirror,
    verify_file,
)
from rbdata.datasets._download import download as fetch
from rbdata.datasets.atari._catalog import (
    ATARI_DQN_PREFIX,
    BACKEND,
    DEFAULT_CHECKPOINTS,
    FAMILY,
    AtariSource,
    atari_download_path,
    atari_id,
    atari_source,
)
from rbdata.datasets.atari._convert import check_codec, convert_atari
from rbdata.datasets.base import OfflineDataset
from rbdata.samplers.base import Sampler

__all__ = ["MIRROR_ENV", "AtariDQN", "open_atari", "prepare", "source_url"]

MIRROR_ENV = "RBDATA_ATARI_DQN_MIRROR"


class AtariDQN(OfflineDataset):
    """A game and run of the DQN Replay Dataset: downloaded, checked, converted once.

    The first construction downloads the checkpoints' files into the cache (``root``, else
    ``$RBDATA_HOME``, else the user cache directory; resumable, under a lock, with a progress
    bar), converts their valid transitions into one storage with bounded memory (see
    :mod:`rbdata.datasets.atari._convert`) and opens it; later constructions open the entry
    in milliseconds, without the network or the files. See the module for the keys and rules.

    Args:
        game: the game as the bucket names it, e.g. ``"Pong"`` (``rbdata datasets list``).
        run: the run, 1 to 5.
        checkpoints: the checkpoint suffixes (0 to 50), one int or several; read in
            increasing order into one entry (``<game>/<run>/<checkpoints>``).
        root: the cache root.
        download: download the files that are not in the cache (else raise). With ``False``
            no connection is ever opened.
        file: a local folder holding Dopamine's files (``<name>_ckpt.<N>.gz``), or one that
            holds them in ``replay_logs/``: verified and read in place, no network.
        codec: how a new conversion compresses frames: ``None``, ``"lz4"``, ``"zstd"`` or
            ``("zstd", level)``. An entry already converted opens as it was written
            (``info["codec"]``).
        sha256: expected digests by file name (e.g. ``{"add_count_ckpt.50.gz": "..."}``);
            files not named are not checked (the bucket publishes no sha256), their computed
            digests are recorded.
        sampler: sampler of :meth:`~OfflineDataset.sample` and iteration (default uniform).
        batch_size: default batch size of :meth:`~OfflineDataset.sample` and iteration.
        transform: applied to sampled batches.
        progress: show progress bars for the downloads and the conversion.

    Raises:
        KeyError: an unknown game.
        ValueError: an unknown run or checkpoint, a bad ``codec`` or ``sha256``, or a file
            that is not in Dopamine's format (nothing is cached).
        FileNotFoundError: ``download=False`` and a file is missing, or ``file`` lacks one.
        rbdata.datasets.ChecksumError: a file's sha256 is not the expected one.
        rbdata.datasets.DownloadError: a download failed; the message ends with the ways out.

    Examples:
        >>> AtariDQN("pong")
        Traceback (most recent call last):
        ...
        rbdata.errors.MissingKeyError: unknown DQN Replay game 'pong'; did you mean 'Pong'?
    """

    def __init__(
        self,
        game: str,
        run: int = 1,
        checkpoints: int | tuple[int, ...] | list[int] = DEFAULT_CHECKPOINTS,
        root: str | os.PathLike[str] | None = None,
        *,
        download: bool = True,
        file: str | os.PathLike[str] | None = None,
        codec: Any = "lz4",
        sha256: Mapping[str, str] | None = None,
        sampler: Sampler | None = None,
        batch_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        progress: bool = True,
    ) -> None:
        source = atari_source(game, run, checkpoints)
        codec = check_codec(codec)
        base = cache_root(root)
        target = entry_dir(base, FAMILY, source.id, BACKEND)
        if not (target / DATASET_FILE).is_file():
            prepare(
                source,
                base,
                target,
                download=download,
                file=file,
                codec=codec,
                sha256=sha256,
                progress=progress,
            )
        super().__init__(target, sampler=sampler, batch_size=batch_size, transform=transform)


def _way_out(source: AtariSource) -> str:
    """How to get ``source`` without its host: a mirror or a local folder."""
    return (
        f"to get it another way, set {MIRROR_ENV} to a mirror of {ATARI_DQN_PREFIX} (a URL or "
        f"a file:// folder), or copy the files (gsutil -m cp -R "
        f"gs://atari-replay-datasets/dqn/{source.game}/{source.run} DIR) and use "
        f"AtariDQN({source.game!r}, {source.run}, file=DIR), or "
        f"`rbdata datasets download atari-dqn/{source.id} --file DIR`"
    )


def source_url(source: AtariSource, name: str) -> str:
    """The URL of file ``name`` of ``source``: the bucket's, behind ``RBDATA_ATARI_DQN_MIRROR``.

    Examples:
        >>> from rbdata.datasets.atari._catalog import atari_source
        >>> os.environ.get(MIRROR_ENV) is None
        True
        >>> source_url(atari_source("Pong"), "add_count_ckpt.50.gz")[-43:]
        'dqn/Pong/1/replay_logs/add_count_ckpt.50.gz'
    """
    return resolve_mirror(source.file_url(name), ATARI_DQN_PREFIX, os.environ.get(MIRROR_ENV))


def _local_folder(source: AtariSource, file: str | os.PathLike[str] | None) -> Path | None:
    """The folder of local files: ``file=`` (or its ``replay_logs/``), a file:// mirror's."""
    if file is not None:
        folder = Path(file).expanduser().absolute()
        if not folder.is_dir():
            raise FileNotFoundError(
                f"file: {str(folder)!r} is not a folder (expected one holding Dopamine's "
                f"<name>_ckpt.<N>.gz files of {source.game} run {source.run})"
            )
        logs = folder / "replay_logs"
        return logs if logs.is_dir() else folder
    found = local_path(source_url(source, "x"))
    return None if found is None else found.parent.expanduser().absolute()


def _check_digests(sha256: Mapping[str, str] | None, names: set[str]) -> dict[str, str]:
    digests = {str(k): str(v).lower() for k, v in (sha256 or {}).items()}
    unknown = sorted(set(digests) - names)
    if unknown:
        raise ValueError(f"sha256: no such file among the checkpoints': {unknown}")
    return digests


def prepare(
    source: AtariSource,
    base: Path,
    target: Path,
    *,
    download: bool,
    codec: Any,
    sha256: Mapping[str, str] | None,
    progress: bool,
    file: str | os.PathLike[str] | None = None,
) -> None:
    """Get the files of ``source`` (local, cached or downloaded) and convert them into ``target``.

    A failure leaves nothing behind: no entry, no lock file, no empty folder (a partial
    download with bytes in it stays, for the next call to resume).
    """
    names = {n for c in source.checkpoints for n in source.files(c).values()}
    digests = _check_digests(sha256, names)
    local = _local_folder(source, file)

    def build(tmp: Path) -> dict[str, Any]:
        sources = []
        files: dict[str, dict[str, Any]] = {}
        for checkpoint in source.checkpoints:
            paths = {}
            for role, name in source.files(checkpoint).items():
                got = _get(source, name, base, local, download, digests.get(name), progress)
                paths[role] = got.path
                where = str(got.path) if local else got.path.relative_to(base).as_posix()
                files[name] = {"path" if local else "file": where, "size": got.size}
                files[name].update(sha256=got.sha256, sha256_verified=name in digests)
            sources.append((checkpoint, paths))
        desc = f"{source.id} ({BACKEND})"
        info = convert_atari(sources, tmp / STORAGE_DIR, codec=codec, progress=progress, desc=desc)
        url = local.as_uri() + "/" if local else source_url(source, "")
        head = {"family": FAMILY, "id": source.id, "game": source.game, "run": source.run}
        head.update(checkpoints=list(source.checkpoints), backend=BACKEND)
        return {**head, **info, "source": {"url": url, "files": files}}

    downloads = atari_download_path(base, source, "x").parent
    try:
        build_entry(target, build)
    except BaseException:
        prune_empty_dirs(target.parent, base)
        prune_empty_dirs(downloads, base)
        raise


def _get(
    source: AtariSource,
    name: str,
    base: Path,
    local: Path | None,
    download: bool,
    sha256: str | None,
    progress: bool,
) -> Downloaded:
    """File ``name``: verified in the local folder, or in the cache (fetched if missing)."""
    if local is not None:
        return verify_file(local / name, name=f"{source.id} {name}", sha256=sha256, hint=LOCAL_HINT)
    file = atari_download_path(base, source, name)
    label = f"atari-dqn/{source.id} {name}"
    with lock_for(file):
        if file.is_file():  # there already: verified, never deleted, no network
            kept = (
                f"the file is kept: delete it (`rbdata datasets remove atari-dqn/{source.id}`) "
                "to download it again, or pass its digest in sha256= if you trust it"
            )
            return verify_file(file, name=label, sha256=sha256, hint=kept)
        if not download:
            raise FileNotFoundError(
                f"DQN Replay file {name} of {source.game} run {source.run} is not in the cache "
                f"({file}) and download=False: pass download=True (`rbdata datasets download "
                f"atari-dqn/{source.id}`), or {_way_out(source)}"
            )
        url = source_url(source, name)
        return fetch(url, file, name=label, sha256=sha256, progress=progress, hint=_way_out(source))


def open_atari(
    root: Path, name: str, *, backend: str, url: str | None, sha256: str | None, file: str | None
) -> Any:
    """``rbdata datasets download atari-dqn/<name>``: the converted dataset, opened.

    Raises:
        ValueError: ``--url`` or ``--sha256`` (not for this family), or another backend.
    """
    if url is not None or sha256 is not None:
        raise ValueError(
            "--url and --sha256 do not apply to atari-dqn ids (many files each): set "
            "RBDATA_ATARI_DQN_MIRROR to a mirror (a URL or a file:// folder), or pass "
            "--file DIR (a folder of the files); in Python, AtariDQN(..., sha256={name: hex})"
        )
    if backend != BACKEND:
        raise ValueError(f"--backend: atari-dqn entries are stored as {BACKEND}, not {backend}")
    source = atari_id(name)
    return AtariDQN(source.game, source.run, source.checkpoints, root, file=file, progress=True)
