"""The D4RL catalog: the shipped table's invariants, read through the package."""

from __future__ import annotations

import csv
import re
from collections import defaultdict

from rbdata._core.resources import catalog_path
from rbdata.datasets._catalog import D4RL_PREFIX, d4rl_catalog, d4rl_entry


def test_every_row_of_the_table_is_in_the_catalog() -> None:
    with open(catalog_path("d4rl.tsv"), encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert len(rows) == 183
    catalog = d4rl_catalog()
    for row in rows:
        entry = catalog[row["id"]]
        assert entry.url == row["url"] and entry.url.startswith(D4RL_PREFIX)
        assert entry.size == (int(row["size_bytes"]) if row["size_bytes"] else None)
        assert entry.sha256 == (row["sha256"] or None)
        if entry.sha256 is not None:
            assert re.fullmatch(r"[0-9a-f]{64}", entry.sha256)
        if entry.ref_min_score is not None:
            assert entry.ref_max_score is not None and entry.ref_min_score < entry.ref_max_score


def test_shared_files_are_the_documented_ones() -> None:
    by_file = defaultdict(list)
    for entry in d4rl_catalog().values():
        if not entry.is_sample:
            by_file[entry.file].append(entry.id)
    shared = sorted(sorted(ids) for ids in by_file.values() if len(ids) > 1)
    assert ["carla-town-full-v0", "carla-town-render-v0"] in shared
    longhorizon = [ids for ids in shared if any("longhorizon" in i for i in ids)]
    assert len(longhorizon) == len(shared) - 1 == 8
    for ids in longhorizon:
        short, long = sorted(ids, key=len)
        assert long == short.replace("-human-", "-human-longhorizon-")


def test_sample_ids_are_relative() -> None:
    sample = d4rl_entry("cartpole-random-v0")
    assert sample.is_sample and sample.file == sample.url
