"""Conversion of a :class:`minari.MinariDataset` into a storage directory, episode by episode.

The keys and the rules (spaces, infos, metadata) are those of :mod:`rbdata.datasets.minari`;
memory holds one block of whole episodes (at most 65536 rows and ~32 MiB) or one episode.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rbdata.datasets._build import Block, write_blocks
from rbdata.datasets._json import json_safe

__all__ = ["convert_minari", "minari_metadata"]

_BLOCK_BYTES = 1 << 25  # a conversion block holds at most ~32 MiB of row data ...
_BLOCK_ROWS = 1 << 16  # ... and at most 65536 rows (one episode may exceed neither: it is split)
_NUMERIC = "biufc"

Parts = dict[tuple[str, ...], np.ndarray]


# --- metadata --------------------------------------------------------------------------------
def _space_json(value: Any) -> str | None:
    """A gymnasium space as Minari serializes it (as in its ``metadata.json``), else ``None``."""
    try:
        from gymnasium.spaces import Space
        from minari.serialization import serialize_space
    except ImportError:  # pragma: no cover - metadata comes from minari, which has both
        return None
    if not isinstance(value, Space):
        return None
    try:
        return str(serialize_space(value))
    except Exception:  # a space Minari cannot serialize: its description
        return str(value)


def minari_metadata(dataset: Any) -> dict[str, Any]:
    """The metadata of a :class:`minari.MinariDataset`, JSON-safe.

    Spaces are Minari's serialized JSON strings (as in its ``metadata.json``), sets (authors)
    sorted lists, numpy values Python numbers or lists.
    """
    meta = json_safe(dataset.storage.metadata, _space_json)
    if not isinstance(meta, dict):  # pragma: no cover - Minari's metadata is a dict
        raise ValueError(f"Minari metadata: expected a dict, got {type(meta).__name__}")
    return meta


# --- episodes to rows --------------------------------------------------------------------------
def _leaves(value: Any, key: tuple[str, ...], out: Parts, what: str) -> None:
    """Flatten a space's value (array, dict, tuple) into ``out``, keyed below ``key``."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            _leaves(v, (*key, str(k)), out, what)
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            _leaves(v, (*key, str(i)), out, what)
    elif isinstance(value, np.ndarray) and value.dtype.kind in _NUMERIC and value.ndim >= 1:
        out[key] = value
    else:
        kind = type(value).__name__
        if isinstance(value, np.ndarray):
            kind = f"an array of dtype {value.dtype} and shape {value.shape}"
        raise ValueError(
            f"{'/'.join((what, *key))}: expected a numeric array per step (Box, Discrete, "
            f"MultiDiscrete, MultiBinary, or Dict/Tuple of them), Minari returned {kind}"
        )


def _info_leaves(value: Any, key: tuple[str, ...], steps: int, out: Parts) -> None:
    """The numeric info arrays with ``steps + 1`` (cut to ``steps``) or ``steps`` rows."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            _info_leaves(v, (*key, str(k)), steps, out)
    elif (
        isinstance(value, np.ndarray)
        and value.dtype.kind in _NUMERIC
        and value.ndim >= 1
        and value.shape[0] in (steps, steps + 1)
    ):
        out[key] = value[:steps]


def _flags(value: Any, steps: int, name: str, episode: int) -> np.ndarray:
    array = np.asarray(value)
    if array.size != steps:
        raise ValueError(
            f"episode {episode}: {name} has shape {array.shape}, expected {steps} steps"
        )
    return array.reshape(steps, 1).astype(bool, copy=False)


def _episode_rows(episode: Any) -> tuple[int, Parts]:
    """One Minari episode as rows: its steps ``T`` and the flat key -> ``[T, ...]`` arrays."""
    eid = int(episode.id)
    rewards = np.asarray(episode.rewards)
    steps = len(rewards)
    if rewards.size != steps:
        raise ValueError(f"episode {eid}: rewards have shape {rewards.shape}, expected [T]")
    obs: Parts = {}
    _leaves(episode.observations, (), obs, "observation")
    act: Parts = {}
    _leaves(episode.actions, (), act, "action")
    for name, parts, expected in (("observations", obs, steps + 1), ("actions", act, steps)):
        for key, array in parts.items():
            if array.shape[0] != expected:
                raise ValueError(
                    f"episode {eid}: {name}{list(key) if key else ''} has {array.shape[0]} "
                    f"entries, expected {expected} (the episode has {steps} rewards)"
                )
    term = _flags(episode.terminations, steps, "terminations", eid)
    trunc = _flags(episode.truncations, steps, "truncations", eid)
    rows: Parts = {}
    # (keys built first: mypy reads `rows[("a", *key)]` as 3.11-only syntax)
    for key, array in obs.items():
        now = ("observation", *key)
        rows[now] = array[:steps]
    for key, array in obs.items():
        nxt = ("next", "observation", *key)
        rows[nxt] = array[1 : steps + 1]
    for key, array in act.items():
        act_key = ("action", *key)
        rows[act_key] = array
    rows[("next", "reward")] = rewards.reshape(steps, 1)
    rows[("next", "terminated")] = term
    rows[("next", "truncated")] = trunc
    rows[("next", "done")] = term | trunc
    rows[("episode",)] = np.full(steps, eid, dtype=np.int64)
    infos: Parts = {}
    _info_leaves(episode.infos or {}, ("info",), steps, infos)
    rows.update(infos)
    return steps, rows


def _signature(rows: Parts) -> dict[tuple[str, ...], tuple[tuple[int, ...], np.dtype[Any]]]:
    return {key: (tuple(a.shape[1:]), a.dtype) for key, a in rows.items()}


class _Counts:
    """Filled in while blocks stream: the episodes and steps seen so far."""

    episodes = 0
    steps = 0


def _blocks(
    episodes: Iterator[Any],
    total: int,
    lengths: Mapping[int, int],
    counts: _Counts,
    source: str,
    rows: int,
    nbytes: int,
) -> Iterator[Block]:
    """Blocks of whole episodes (up to ``rows`` rows / ``nbytes``); a big episode is split."""
    layout: dict[tuple[str, ...], tuple[tuple[int, ...], np.dtype[Any]]] | None = None
    pending: list[Parts] = []
    pending_rows = pending_bytes = 0

    def flush() -> Block:
        nonlocal pending_rows, pending_bytes
        block = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
        pending.clear()
        pending_rows = pending_bytes = 0
        return block

    for episode in episodes:
        steps, part = _episode_rows(episode)
        eid = int(episode.id)
        if eid in lengths and lengths[eid] != steps:
            raise ValueError(
                f"{source}: episode {eid} has {steps} steps, its metadata says {lengths[eid]}"
            )
        signature = _signature(part)
        if layout is None:
            layout = signature
        elif signature != layout:
            diff = sorted(set(signature.items()) ^ set(layout.items()), key=repr)
            raise ValueError(
                f"{source}: episode {eid} differs from the first episode in its keys, shapes "
                f"or dtypes (key, (shape, dtype)): {diff}"
            )
        counts.episodes += 1
        counts.steps += steps
        if counts.steps > total:
            raise ValueError(
                f"{source}: the episodes hold more than the {total} steps of total_steps"
            )
        if steps == 0:
            continue
        size = sum(a.nbytes for a in part.values())
        if pending and (pending_rows + steps > rows or pending_bytes + size > nbytes):
            yield flush()
        if steps >= rows or size >= nbytes:  # alone, in slices of at most rows / nbytes
            step = max(1, min(rows, nbytes * steps // max(1, size)))
            for start in range(0, steps, step):  # (write_blocks copies read-only arrays)
                yield {k: a[start : start + step] for k, a in part.items()}
        else:
            pending.append(part)
            pending_rows += steps
            pending_bytes += size
    if pending:
        yield flush()
    if counts.steps != total:
        raise ValueError(
            f"{source}: the episodes hold {counts.steps} steps, total_steps says {total}"
        )


def convert_minari(
    dataset: Any,
    path: str | os.PathLike[str],
    backend: str = "memmap",
    *,
    rows: int | None = None,
    progress: bool = True,
    desc: str = "converting",
) -> dict[str, Any]:
    """Convert a :class:`minari.MinariDataset` into a new storage directory, episode by episode.

    Memory holds one block (whole episodes up to ``rows`` rows and ~32 MiB) or one episode.

    Args:
        dataset: the Minari dataset (e.g. from :func:`minari.load_dataset`).
        path: the new storage directory.
        backend: ``"memmap"`` or ``"arrow"``.
        rows: rows per block (default 65536).
        progress: show a progress bar.
        desc: label of the progress bar.

    Returns:
        ``{"transitions", "episodes", "metadata", "keys"}`` (keys: name -> [shape, dtype]).

    Raises:
        ValueError: the episodes do not add up to ``dataset.total_steps``, an episode's arrays
            disagree in length, episodes differ in keys, shapes or dtypes, or a space is not
            numeric.
    """
    if rows is not None and (not isinstance(rows, int) or rows <= 0):
        raise ValueError(f"rows: expected a positive integer, got {rows!r}")
    source = f"Minari dataset {dataset.id!r}"
    total = int(dataset.total_steps)
    indices = [int(i) for i in dataset.episode_indices]
    lengths: dict[int, int] = {}
    for index, meta in zip(indices, dataset.storage.get_episode_metadata(indices), strict=True):
        if "total_steps" in meta:
            lengths[index] = int(meta["total_steps"])
    counts = _Counts()
    layout = write_blocks(
        _blocks(
            iter(dataset.iterate_episodes()),
            total,
            lengths,
            counts,
            source,
            rows or _BLOCK_ROWS,
            _BLOCK_BYTES,
        ),
        total,
        Path(path),
        backend,
        desc=desc,
        progress=progress,
    )
    keys = {"/".join(leaf.key): [list(leaf.shape), str(leaf.dtype)[6:]] for leaf in layout.leaves}
    return {
        "transitions": total,
        "episodes": counts.episodes,
        "metadata": minari_metadata(dataset),
        "keys": keys,
    }
