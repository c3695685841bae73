"""The D4RL catalog: ids, download URLs, sizes, sha256 and reference scores.

The data lives in the top-level ``datasets/d4rl.tsv`` (shipped in the wheel, located through
:func:`rbdata._core.resources.catalog_path`); its provenance is in ``datasets/README.md``.
``datasets/d4rl-samples.tsv`` adds small sample datasets in the D4RL layout, built locally by
the recipes in ``datasets/samples/``: their ``url`` is a path relative to the D4RL prefix that
only a mirror (``RBDATA_D4RL_MIRROR``) serves.
"""

from __future__ import annotations

import csv
import difflib
import functools
from dataclasses import dataclass

from rbdata._core.resources import catalog_path

__all__ = ["D4RL_PREFIX", "D4RLEntry", "d4rl_catalog", "d4rl_entry"]

#: The URL prefix of every D4RL file; ``RBDATA_D4RL_MIRROR`` replaces it.
D4RL_PREFIX = "http://rail.eecs.berkeley.edu/datasets/offline_rl/"

_COLUMNS = ["id", "url", "size_bytes", "sha256", "ref_min_score", "ref_max_score"]


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
        if header != _COLUMNS:
            raise ValueError(f"{path}: expected the columns {_COLUMNS}, got {header}")
        entries = {}
        for row in reader:
            if len(row) != len(_COLUMNS):
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
        KeyError: "unknown D4RL dataset 'hoper-medium-v2'; did you mean 'hopper-medium-v2', ...
    """
    catalog = d4rl_catalog()
    if name in catalog:
        return catalog[name]
    close = difflib.get_close_matches(name, list(catalog), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(map(repr, close))}?" if close else "see `rbdata datasets list`"
    raise KeyError(f"unknown D4RL dataset {name!r}; {hint}")
