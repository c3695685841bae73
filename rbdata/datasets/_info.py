"""``rbdata datasets info``: what a converted entry records, or how to get it."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from rbdata.datasets._cache import DATASET_FILE, read_entry
from rbdata.datasets._catalog import D4RLEntry, OGBenchFile
from rbdata.datasets._commands import (
    DatasetRef,
    catalog_entry,
    entry_path,
    human_size,
    pick_backend,
    print_table,
    tree_size,
)
from rbdata.datasets.atari._catalog import AtariSource

__all__ = ["advice", "info_command"]

_WIDTH = 72  # longest metadata value shown by `info`


def advice(
    ref: DatasetRef, entry: D4RLEntry | OGBenchFile | AtariSource | None, backend: str
) -> str:
    """The commands that get ``ref`` converted, as one sentence (they work from a wheel).

    Examples:
        >>> from rbdata.datasets._catalog import d4rl_entry
        >>> ref = DatasetRef("d4rl", "cartpole-random-v0")
        >>> print(advice(ref, d4rl_entry(ref.name), "memmap"))
        it is an rbdata sample, built locally: run
        `rbdata datasets sample d4rl/cartpole-random-v0 --out cartpole-random-v0.hdf5`, then
        `rbdata datasets download d4rl/cartpole-random-v0 --file cartpole-random-v0.hdf5`
    """
    option = "" if backend == "memmap" else f" --backend {backend}"
    if entry is not None and entry.is_sample:
        out = f"{entry.id}.hdf5"
        return (
            f"it is an rbdata sample, built locally: run `rbdata datasets sample {ref} --out "
            f"{out}`, then `rbdata datasets download {ref} --file {out}{option}`"
        )
    if ref.family == "atari-dqn":
        return f"run `rbdata datasets download {ref}` (with the files in a folder: `--file DIR`)"
    if ref.family in ("d4rl", "ogbench"):
        return (
            f"run `rbdata datasets download {ref}{option}` (with a local copy of the file, "
            f"add `--file PATH`)"
        )
    return f"run `rbdata datasets download {ref}{option}`"


def _summary(value: Any) -> str:
    """A short text for a metadata value: long lists by their shape, long text truncated."""
    shape: list[int] = []
    item: Any = value
    while isinstance(item, list):
        shape.append(len(item))
        item = item[0] if item else None
    if shape and math.prod(shape) > 16:  # never serialise a big list (policy weights...)
        return f"<list {'x'.join(map(str, shape))}>"
    text = " ".join((value if isinstance(value, str) else json.dumps(value)).split())
    return text if len(text) <= _WIDTH else text[: _WIDTH - 3] + "..."


def info_command(root: Path, ref: DatasetRef, *, backend: str | None) -> int:
    """``rbdata datasets info``: what ``dataset.json`` of a converted entry records."""
    entry = catalog_entry(ref, root)
    backend = pick_backend(root, ref, backend)
    path = entry_path(root, ref, backend)
    if not (path / DATASET_FILE).is_file():
        print(f"id:           {ref}")
        print(f"converted:    no ({backend}; {path})")
        if entry is not None:
            url = entry.url if not entry.is_sample else "- (an rbdata sample, built locally)"
            print(f"url:          {url}")
            print(f"size:         {human_size(entry.size)}")
            print(f"sha256:       {entry.sha256 or '? (not in the catalog)'}")
        print(
            f"rbdata: {ref} is not converted ({backend}): {advice(ref, entry, backend)}",
            file=sys.stderr,
        )
        return 1
    info = read_entry(path)
    source = dict(info.get("source") or {})
    print(f"id:           {ref}")
    print(f"backend:      {info.get('backend')}")
    print(f"path:         {path}")
    print(f"transitions:  {info.get('transitions', 0):,}")
    print(f"episodes:     {info.get('episodes', 0):,}")
    for key in ("split", "layout", "checkpoints", "codec"):  # OGBench's, DQN Replay's
        if key in info:
            print(f"{key + ':':<13} {info[key]}")
    print(f"size on disk: {human_size(tree_size(path))}")
    if "url" in source:
        print(f"source:       {source.pop('url')}")
    if "sha256" in source:
        print(f"sha256:       {source.pop('sha256')} ({_verified(entry, info, source)})")
    source.pop("sha256_verified", None)
    for name, file in (source.pop("files", None) or {}).items():  # DQN Replay: one per file
        checked = "verified" if file.get("sha256_verified") else "computed"
        size = human_size(file.get("size"))
        print(f"{'source.file:':<13} {name} {size} {file.get('sha256')} ({checked})")
    for key, value in source.items():  # paths in full: they are for copying
        text = value if isinstance(value, str) else _summary(value)
        print(f"{'source.' + key + ':':<13} {text}")
    lo, hi = info.get("ref_min_score"), info.get("ref_max_score")
    print(f"ref scores:   min {'-' if lo is None else lo}, max {'-' if hi is None else hi}")
    keys = info.get("keys") or {}
    print(f"keys ({len(keys)}):")
    print_table(
        [(f"  {k}", f"[{', '.join(map(str, v[0]))}]", str(v[1])) for k, v in keys.items()],
        ("  KEY", "SHAPE", "DTYPE"),
    )
    metadata = info.get("metadata") or {}
    print(f"metadata ({len(metadata)}):")
    for key, value in metadata.items():
        print(f"  {key}: {_summary(value)}")
    return 0


def _verified(
    entry: D4RLEntry | OGBenchFile | AtariSource | None,
    info: dict[str, Any],
    source: dict[str, Any],
) -> str:
    if not source.get("sha256_verified"):
        return "not verified: no digest was expected"
    if entry is not None and entry.sha256 == info["source"]["sha256"]:
        return "verified: the catalog's digest"
    return "verified: the digest given with --sha256"
