"""``Minari``: Minari datasets, read with Minari's own API, converted once, memory-mapped.

The episodes are read with :meth:`minari.MinariDataset.iterate_episodes` (so JPEG-encoded image
spaces come back decoded exactly as Minari decodes them, ``[H, W, C]`` or ``[H, W]`` uint8) and
flattened into transitions, episode by episode, in Minari's episode order. Every dtype is the
one Minari returns (Discrete spaces: int64). An episode of ``T`` steps has ``T + 1``
observations and gives ``T`` rows:

======================================  ===================================================
key                                     from the episode (``t = 0 .. T-1``)
======================================  ===================================================
``"observation"``                       ``observations[t]``
``("next", "observation")``             ``observations[t + 1]``
``"action"``                            ``actions[t]``
``("next", "reward")`` ``[N, 1]``       ``rewards[t]``
``("next", "terminated")`` ``[N, 1]``   ``terminations[t]`` (bool)
``("next", "truncated")`` ``[N, 1]``    ``truncations[t]`` (bool)
``("next", "done")`` ``[N, 1]``         terminated | truncated
``"episode"`` ``[N]`` int64             Minari's episode id
``("info", name, ...)``                 ``infos[name][t]`` (see below)
======================================  ===================================================

Spaces become keys by their structure: a ``Box``, ``Discrete``, ``MultiDiscrete`` or
``MultiBinary`` is one leaf (``"observation"``); a ``Dict`` gives one key per entry
(``("observation", "image")``, ``("next", "observation", "image")``); a ``Tuple`` gives keys
``"0"``, ``"1"``, ...; nested spaces nest the keys. Spaces Minari returns as non-numeric values
(``Text``) cannot be converted (``ValueError``).

Infos: every numeric array in an episode's (nested) ``infos`` whose leading dimension is
``T + 1`` is stored as ``infos[name][:T]``, the info that came with observation ``t`` (D4RL's
``infos/*`` meaning); one whose leading dimension is ``T`` is stored as is. Infos that are not
numeric arrays (text, objects, scalars) or have another leading dimension are skipped; with
the ``arrow``/``parquet`` formats Minari returns nested info dicts as object arrays, so they are
skipped too. Every episode must give the same info keys, shapes and dtypes (else
``ValueError``).

The Minari dataset metadata (spaces as Minari's serialized JSON strings, sets as sorted lists)
is kept in :attr:`OfflineDataset.metadata`; its ``ref_min_score``/``ref_max_score``, when
present, give :meth:`OfflineDataset.normalized_score`.

The conversion (:func:`convert_minari`) goes episode by episode; memory holds one block of whole
episodes (at most 65536 rows and ~32 MiB) or one episode.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rbdata.datasets._build import Block, json_safe, write_blocks
from rbdata.datasets._cache import (
    DATASET_FILE,
    STORAGE_DIR,
    build_entry,
    cache_root,
    entry_dir,
    prune_empty_dirs,
)
from rbdata.datasets._catalog import minari_module as _minari
from rbdata.datasets._catalog import remote_access
from rbdata.datasets.base import OfflineDataset
from rbdata.samplers.base import Sampler

__all__ = ["Minari", "convert_minari", "minari_metadata", "prepare", "remote_access"]


FAMILY = "minari"


def _score(value: Any) -> float | None:
    if value is None:
        return None
    try:
        score = float(value)
    except (TypeError, ValueError):
        return None
    return score if math.isfinite(score) else None


class Minari(OfflineDataset):
    """A Minari dataset: loaded with ``minari``, converted once, memory-mapped.

    The first construction loads the dataset with :func:`minari.load_dataset` (Minari looks
    for it under ``$MINARI_DATASETS_PATH``, else ``~/.minari/datasets``, and downloads it there
    with ``download=True``), converts it episode by episode into a storage in the cache
    (``root``, else ``$RBDATA_HOME``, else the user cache directory) and opens it; later
    constructions open the converted entry in milliseconds, without ``minari`` or its data.
    See the module documentation for the keys.

    Args:
        dataset_id: the Minari id, e.g. ``"mujoco/hopper/medium-v0"``.
        root: the cache root.
        download: let Minari download the dataset if it is not local (else raise).
        backend: ``"memmap"`` or ``"arrow"`` storage.
        sampler: sampler of :meth:`~OfflineDataset.sample` and iteration (default uniform).
        batch_size: default batch size of :meth:`~OfflineDataset.sample` and iteration.
        transform: applied to sampled batches.
        progress: show a progress bar for the conversion.

    Raises:
        ValueError: a malformed id or unknown backend, or data that cannot be converted.
        FileNotFoundError: ``download=False`` and the dataset is neither converted nor local.
        rbdata.errors.MissingExtraError: the dataset must be converted and ``minari`` is not
            installed, or must be downloaded and Minari's remote client (``huggingface_hub``)
            is not; the message has ``pip install 'rbdata[minari]'``.
    """

    def __init__(
        self,
        dataset_id: str,
        root: str | os.PathLike[str] | None = None,
        *,
        download: bool = True,
        backend: str = "memmap",
        sampler: Sampler | None = None,
        batch_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        progress: bool = True,
    ) -> None:
        base = cache_root(root)
        target = entry_dir(base, FAMILY, dataset_id, backend)
        if not (target / DATASET_FILE).is_file():
            prepare(dataset_id, target, backend, download=download, progress=progress, root=base)
        super().__init__(target, sampler=sampler, batch_size=batch_size, transform=transform)


def prepare(
    dataset_id: str,
    target: Path,
    backend: str,
    *,
    download: bool,
    progress: bool,
    root: Path | None = None,
) -> None:
    """Load ``dataset_id`` with Minari (downloading it if allowed) and convert it to ``target``.

    A failure leaves no entry, and no empty folder below ``root`` (the cache root).
    """
    if root is None:
        root = target.parents[len(dataset_id.split("/"))]  # <root>/minari/<id...>/<backend>

    def build(tmp: Path) -> dict[str, Any]:
        minari = _minari()
        try:
            with remote_access(f"downloading the Minari dataset {dataset_id!r}"):
                dataset = minari.load_dataset(dataset_id, download=download)
        except FileNotFoundError as err:
            if download:
                raise
            raise FileNotFoundError(
                f"Minari dataset {dataset_id!r} is not local (MINARI_DATASETS_PATH="
                f"{os.environ.get('MINARI_DATASETS_PATH')!r}) and not converted in the cache "
                f"({target}); pass download=True or run `minari download {dataset_id}`"
            ) from err
        info = convert_minari(
            dataset, tmp / STORAGE_DIR, backend, progress=progress, desc=f"{dataset_id} ({backend})"
        )
        metadata = info["metadata"]
        return {
            "family": FAMILY,
            "id": dataset_id,
            "backend": backend,
            **info,
            "source": {
                "data_format": metadata.get("data_format"),
                "minari_version": metadata.get("minari_version"),
                "reader_version": str(minari.__version__),
                "jpeg_encoding": bool(dataset.storage.jpeg_encoding),
                "path": str(dataset.storage.data_path),
            },
            "ref_min_score": _score(metadata.get("ref_min_score")),
            "ref_max_score": _score(metadata.get("ref_max_score")),
        }

    try:
        build_entry(target, build)
    except BaseException:
        prune_empty_dirs(target.parent, root)
        raise


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
