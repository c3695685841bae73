"""The catalogs ``rbdata datasets`` reads without torch (D4RL, OGBench), and the Minari extra.

The D4RL catalog: ids, download URLs, sizes, sha256 and reference scores.

The data lives in the top-level ``datasets/d4rl.tsv`` (shipped in the wheel, located through
:func:`rbdata._core.resources.catalog_path`); its provenance is in ``datasets/README.md``.
``datasets/d4rl-samples.tsv`` adds small sample datasets in the D4RL layout, built locally by
the recipes in ``datasets/samples/``: their ``url`` is a path relative to the D4RL prefix that
only a mirror (``RBDATA_D4RL_MIRROR``) serves.

The OGBench catalog: dataset ids, their two files (train and ``-val``), sizes and sha256.

The data lives in the top-level ``datasets/ogbench.tsv`` (shipped in the wheel, located through
:func:`rbdata._core.resources.catalog_path`); its provenance is in ``datasets/README.md``. OGBench
publishes each dataset as two files below one URL prefix, ``<id>.npz`` (the training split)
and ``<id>-val.npz`` (the validation split), as ``ogbench.utils.download_datasets`` fetches
them. In the cache and on the command line the validation split is the id ``<id>-val``.

The ``minari`` extra (:func:`minari_module`): import it, or raise the error that names
``pip install 'rbdata[minari]'``; ``rbdata datasets list`` lists Minari's local datasets with
it.

This module imports neither torch nor numpy: ``rbdata datasets list`` reads it alone.
"""

from __future__ import annotations

import csv
import difflib
import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rbdata._core.resources import catalog_path
from rbdata.errors import MissingExtraError, MissingKeyError

__all__ = [
    "D4RLEntry",
    "D4RL_PREFIX",
    "OGBENCH_PREFIX",
    "OGBenchEntry",
    "OGBenchFile",
    "SPLITS",
    "d4rl_catalog",
    "d4rl_entry",
    "minari_module",
    "ogbench_catalog",
    "ogbench_download_path",
    "ogbench_entry",
    "ogbench_file",
    "remote_access",
]


#: The URL prefix of every D4RL file; ``RBDATA_D4RL_MIRROR`` replaces it.
D4RL_PREFIX = "http://rail.eecs.berkeley.edu/datasets/offline_rl/"

_D4RL_COLUMNS = ["id", "url", "size_bytes", "sha256", "ref_min_score", "ref_max_score"]


@dataclass(frozen=True)
class D4RLEntry:
    """One D4RL dataset id of the catalog (``None``: no public source gives the value)."""

    id: str
    url: str
    size: int | None
    sha256: str | None
    ref_min_score: float | None
    ref_max_score: float | None

    @property
    def is_sample(self) -> bool:
        """Whether this is an rbdata sample (a relative URL, served by a mirror only)."""
        return "://" not in self.url

    @property
    def file(self) -> str:
        """The file's path below the D4RL mirror's root URL (ids that share a file share it).

        Examples:
            >>> d4rl_entry("hopper-medium-v2").file
            'gym_mujoco_v2/hopper_medium-v2.hdf5'
        """
        if self.url.startswith(D4RL_PREFIX):
            return self.url[len(D4RL_PREFIX) :]
        if self.is_sample:
            return self.url
        return self.url.rsplit("/", 1)[-1]


def _optional(text: str, kind: type) -> object:
    return kind(text) if text.strip() else None


@functools.lru_cache(maxsize=1)
def d4rl_catalog() -> dict[str, D4RLEntry]:
    """Every D4RL id of the catalog, keyed by id.

    Examples:
        >>> catalog = d4rl_catalog()
        >>> catalog["halfcheetah-medium-v2"].ref_max_score
        12135.0
        >>> sum(not entry.is_sample for entry in catalog.values())
        183
    """
    entries: dict[str, D4RLEntry] = {}
    for name in ("d4rl.tsv", "d4rl-samples.tsv"):
        entries.update(_read_tsv(name))
    return entries


def _read_tsv(name: str) -> dict[str, D4RLEntry]:
    path = catalog_path(name)
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader)
        if header != _D4RL_COLUMNS:
            raise ValueError(f"{path}: expected the columns {_D4RL_COLUMNS}, got {header}")
        entries = {}
        for row in reader:
            if len(row) != len(_D4RL_COLUMNS):
                raise ValueError(f"{path}: a row of {len(row)} fields: {row}")
            entries[row[0]] = D4RLEntry(
                id=row[0],
                url=row[1],
                size=_optional(row[2], int),  # type: ignore[arg-type]
                sha256=_optional(row[3], str.lower),  # type: ignore[arg-type]
                ref_min_score=_optional(row[4], float),  # type: ignore[arg-type]
                ref_max_score=_optional(row[5], float),  # type: ignore[arg-type]
            )
    return entries


def d4rl_entry(name: str) -> D4RLEntry:
    """The catalog entry of D4RL id ``name``.

    Raises:
        KeyError: an unknown id; the message suggests the closest known ids.

    Examples:
        >>> d4rl_entry("hopper-medium-v2").size
        152756557
        >>> d4rl_entry("hoper-medium-v2")
        Traceback (most recent call last):
        ...
        rbdata.errors.MissingKeyError: unknown D4RL dataset 'hoper-medium-v2'; did you mean ...
    """
    catalog = d4rl_catalog()
    if name in catalog:
        return catalog[name]
    close = difflib.get_close_matches(name, list(catalog), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(map(repr, close))}?" if close else "see `rbdata datasets list`"
    raise MissingKeyError(f"unknown D4RL dataset {name!r}; {hint}")


#: The URL prefix of every OGBench file (``ogbench.utils.DATASET_URL``);
#: ``RBDATA_OGBENCH_MIRROR`` replaces it.
OGBENCH_PREFIX = "https://rail.eecs.berkeley.edu/datasets/ogbench/"
#: The splits of a dataset; the validation file is ``<id>-val.npz``.
SPLITS = ("train", "val")
_VAL_SUFFIX = "-val"
FAMILY = "ogbench"

_OGBENCH_COLUMNS = [
    "id",
    "domain",
    "observations",
    "size_bytes",
    "sha256",
    "val_size_bytes",
    "val_sha256",
]


@dataclass(frozen=True)
class OGBenchFile:
    """One published file: a dataset id's split (``None``: no public source gives the value).

    Attributes:
        id: the name of the converted entry and of the file: ``<id>`` or ``<id>-val``.
        dataset: the OGBench dataset id.
        split: ``"train"`` or ``"val"``.
        url: where OGBench publishes the file.
        size: its length in bytes.
        sha256: its digest.
    """

    id: str
    dataset: str
    split: str
    url: str
    size: int | None
    sha256: str | None

    #: never an rbdata sample: every file is on the OGBench host (as a D4RL entry's ``is_sample``)
    is_sample = False

    @property
    def file(self) -> str:
        """The file's name below the OGBench prefix.

        Examples:
            >>> ogbench_file("antmaze-large-navigate-v0-val").file
            'antmaze-large-navigate-v0-val.npz'
        """
        return f"{self.id}.npz"


@dataclass(frozen=True)
class OGBenchEntry:
    """One OGBench dataset id of the catalog.

    Attributes:
        id: e.g. ``"antmaze-large-navigate-v0"``.
        domain: ``"locomotion"``, ``"manipulation"`` or ``"drawing"``.
        observations: ``"states"``, or ``"pixels"`` (uint8 images: the ``visual-*`` datasets
            and powderworld).
        train: the training file.
        val: the validation file.
    """

    id: str
    domain: str
    observations: str
    train: OGBenchFile
    val: OGBenchFile

    def split(self, split: str) -> OGBenchFile:
        """The file of ``split`` (``"train"`` or ``"val"``).

        Raises:
            ValueError: another split.
        """
        if split == "train":
            return self.train
        if split == "val":
            return self.val
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _optional_int(text: str) -> int | None:
    return int(text) if text.strip() else None


def _optional_sha(text: str) -> str | None:
    return text.strip().lower() or None


@functools.lru_cache(maxsize=1)
def ogbench_catalog() -> dict[str, OGBenchEntry]:
    """Every OGBench dataset id of the catalog, keyed by id, in OGBench's own order.

    Examples:
        >>> catalog = ogbench_catalog()
        >>> len(catalog), catalog["cube-double-play-v0"].domain
        (85, 'manipulation')
        >>> catalog["visual-antmaze-medium-navigate-v0"].val.url
        'https://rail.eecs.berkeley.edu/datasets/ogbench/visual-antmaze-medium-navigate-v0-val.npz'
    """
    path = catalog_path("ogbench.tsv")
    entries: dict[str, OGBenchEntry] = {}
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader)
        if header != _OGBENCH_COLUMNS:
            raise ValueError(f"{path}: expected the columns {_OGBENCH_COLUMNS}, got {header}")
        for row in reader:
            if len(row) != len(_OGBENCH_COLUMNS):
                raise ValueError(f"{path}: a row of {len(row)} fields: {row}")
            name = row[0]
            files = [
                OGBenchFile(
                    id=name + suffix,
                    dataset=name,
                    split=split,
                    url=f"{OGBENCH_PREFIX}{name}{suffix}.npz",
                    size=_optional_int(size),
                    sha256=_optional_sha(sha),
                )
                for split, suffix, size, sha in (
                    ("train", "", row[3], row[4]),
                    ("val", _VAL_SUFFIX, row[5], row[6]),
                )
            ]
            entries[name] = OGBenchEntry(name, row[1], row[2], files[0], files[1])
    return entries


def ogbench_entry(name: str) -> OGBenchEntry:
    """The catalog entry of OGBench id ``name``.

    Raises:
        KeyError: an unknown id; the message suggests the closest known ids.

    Examples:
        >>> ogbench_entry("pointmaze-medium-navigate-v0").observations
        'states'
        >>> ogbench_entry("antmaze-larg-navigate-v0")
        Traceback (most recent call last):
        ...
        rbdata.errors.MissingKeyError: unknown OGBench dataset 'antmaze-larg-navigate-v0'; ...
    """
    catalog = ogbench_catalog()
    if name in catalog:
        return catalog[name]
    close = difflib.get_close_matches(name, list(catalog), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(map(repr, close))}?" if close else "see `rbdata datasets list`"
    raise MissingKeyError(f"unknown OGBench dataset {name!r}; {hint}")


def ogbench_file(name: str) -> OGBenchFile:
    """The file of a command-line name: ``<id>`` (training split) or ``<id>-val``.

    Raises:
        KeyError: neither ``name`` nor ``name`` without ``-val`` is a catalog id.

    Examples:
        >>> f = ogbench_file("scene-play-v0-val")
        >>> f.dataset, f.split
        ('scene-play-v0', 'val')
        >>> ogbench_file("scene-play-v0").split
        'train'
    """
    catalog = ogbench_catalog()
    if name not in catalog and name.endswith(_VAL_SUFFIX) and name[: -len(_VAL_SUFFIX)] in catalog:
        return catalog[name[: -len(_VAL_SUFFIX)]].val
    return ogbench_entry(name).train


def ogbench_download_path(root: Path, file: OGBenchFile) -> Path:
    """Where ``file`` is downloaded below the cache root ``root``.

    Examples:
        >>> ogbench_download_path(Path("/c"), ogbench_file("scene-play-v0-val")).as_posix()
        '/c/ogbench/downloads/scene-play-v0-val.npz'
    """
    return root / FAMILY / "downloads" / file.file


#: what Minari's default remote (Hugging Face, ``hf://farama-minari``) needs
_REMOTE_PACKAGE = "huggingface_hub"


def minari_module(feature: str = "rbdata.datasets.Minari") -> Any:
    """The ``minari`` package, or a :class:`MissingExtraError` naming ``feature``."""
    try:
        import minari
    except ImportError as err:
        raise MissingExtraError("minari", "minari", feature) from err
    return minari


def _missing_module(err: BaseException) -> str | None:
    """The name of the module whose import failed somewhere in ``err``'s chain, if known."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ImportError) and current.name:
            return current.name
        current = current.__cause__ or current.__context__
    return None


@contextmanager
def remote_access(feature: str) -> Iterator[None]:
    """Turn Minari's ImportError for its remote's client into the ``rbdata[minari]`` line.

    Minari imports the client of its remote (``huggingface_hub`` for the default
    ``hf://farama-minari``) only when it lists or downloads remote datasets, and raises a bare
    ``ImportError`` without it. That client is part of ``rbdata[minari]``.

    Raises:
        rbdata.errors.MissingExtraError: the remote's client is missing; the message has
            ``pip install 'rbdata[minari]'``. Other remotes (``MINARI_REMOTE=gcp://...``) keep
            Minari's own message, which names their extra.
    """
    try:
        yield
    except ImportError as err:
        if isinstance(err, MissingExtraError):
            raise
        missing = _missing_module(err) or ""
        remote = os.environ.get("MINARI_REMOTE", "hf://")
        if missing.split(".")[0] == _REMOTE_PACKAGE or (
            not missing and remote.startswith("hf://") and _REMOTE_PACKAGE in str(err)
        ):
            raise MissingExtraError(_REMOTE_PACKAGE, "minari", feature) from err
        raise
