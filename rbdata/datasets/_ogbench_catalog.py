"""The OGBench catalog: dataset ids, their two files (train and ``-val``), sizes and sha256.

The data lives in the top-level ``datasets/ogbench.tsv`` (shipped in the wheel, located through
:func:`rbdata._core.resources.catalog_path`); its provenance is in ``datasets/README.md``. OGBench
publishes each dataset as two files below one URL prefix, ``<id>.npz`` (the training split)
and ``<id>-val.npz`` (the validation split), as ``ogbench.utils.download_datasets`` fetches
them. In the cache and on the command line the validation split is the id ``<id>-val``.

This module imports neither torch nor numpy: ``rbdata datasets list`` reads it alone.
"""

from __future__ import annotations

import csv
import difflib
import functools
from dataclasses import dataclass
from pathlib import Path

from rbdata._core.resources import catalog_path

__all__ = [
    "OGBENCH_PREFIX",
    "SPLITS",
    "OGBenchEntry",
    "OGBenchFile",
    "ogbench_catalog",
    "ogbench_download_path",
    "ogbench_entry",
    "ogbench_file",
]

#: The URL prefix of every OGBench file (``ogbench.utils.DATASET_URL``);
#: ``RBDATA_OGBENCH_MIRROR`` replaces it.
OGBENCH_PREFIX = "https://rail.eecs.berkeley.edu/datasets/ogbench/"
#: The splits of a dataset; the validation file is ``<id>-val.npz``.
SPLITS = ("train", "val")
_VAL_SUFFIX = "-val"
FAMILY = "ogbench"

_COLUMNS = ["id", "domain", "observations", "size_bytes", "sha256", "val_size_bytes", "val_sha256"]


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
        if header != _COLUMNS:
            raise ValueError(f"{path}: expected the columns {_COLUMNS}, got {header}")
        for row in reader:
            if len(row) != len(_COLUMNS):
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
        KeyError: "unknown OGBench dataset 'antmaze-larg-navigate-v0'; did you mean ...
    """
    catalog = ogbench_catalog()
    if name in catalog:
        return catalog[name]
    close = difflib.get_close_matches(name, list(catalog), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(map(repr, close))}?" if close else "see `rbdata datasets list`"
    raise KeyError(f"unknown OGBench dataset {name!r}; {hint}")


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
