"""Checkpoints of a mixture: the writable sources saved, the read-only ones recorded by identity.

A mixture's checkpoint directory (atomic like a buffer's: ``CURRENT`` names the live
subdirectory) holds ``state.json`` + ``state.bin`` (:mod:`rbdata.checkpoint.states`: the
format, the sources' names and kinds, the weights, the batch size, the options, each offline
dataset's identity and its sampler's class, config and state) and ``sources/<position>/``,
a buffer checkpoint for each :class:`~rbdata.ReplayBuffer` or storage source
(``rb.dumps``; a storage with its sampler). Offline datasets are not copied: their identity
(family, id, backend, number of transitions, the source file's sha256) and cache path are
recorded, and loading refuses a dataset whose identity differs.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rbdata import checkpoint
from rbdata._core.atomic import fsync_dir, new_staging, publish, read_live
from rbdata.checkpoint.states import class_name, read_state, write_state
from rbdata.datasets.base import OfflineDataset
from rbdata.errors import CheckpointError
from rbdata.mixed._sources import BUFFER, DATASET, STORAGE, Source
from rbdata.writers.immutable import ImmutableWriter

__all__ = [
    "FORMAT",
    "build",
    "check_dataset",
    "dataset_identity",
    "dump",
    "load_into",
    "read",
    "sources_dir",
]

FORMAT = "rbdata.mixed"
_VERSION = 1
_SOURCES = "sources"
T = TypeVar("T")


def dataset_identity(ds: OfflineDataset) -> dict[str, Any]:
    """What names an offline dataset's contents: family, id, backend, size, source sha256."""
    info = ds.info
    source = info.get("source") or {}
    return {
        "family": info.get("family"),
        "id": info.get("id"),
        "backend": info.get("backend"),
        "transitions": info.get("transitions"),
        "sha256": source.get("sha256") if isinstance(source, dict) else None,
    }


def sources_dir(live: Path, position: int) -> Path:
    """The checkpoint directory of the source at ``position``."""
    return live / _SOURCES / str(position)


def dump(mixed: Any, path: Any, fsync: bool = True) -> None:
    """Write ``mixed`` to directory ``path``, atomically (see the module documentation)."""
    root = Path(path)
    created = not root.exists()
    entries, samplers = [], {}
    for s in mixed._sources:
        entry: dict[str, Any] = {"name": s.name, "kind": s.kind}
        if s.kind == DATASET:
            entry["dataset"] = dataset_identity(s.obj)
            entry["path"] = str(s.obj.path)
            samplers[s.name] = {
                "class": class_name(s.sampler, "sampler"),
                "config": s.sampler.config(),
                "state": s.sampler.state_dict(),
            }
        entries.append(entry)
    keys = mixed._options["keys"]
    state = {
        "format": FORMAT,
        "version": _VERSION,
        "sources": entries,
        "weights": dict(mixed.weights),
        "batch_size": mixed.batch_size,
        "keys": None if keys is None else [list(k) for k in keys],
        "drop_info": mixed._options["drop_info"],
        "samplers": samplers,
    }
    staging = new_staging(root)
    try:
        write_state(staging, state, fsync)
        for s in mixed._sources:
            target = sources_dir(staging, s.position)
            if s.kind == BUFFER:
                s.obj.dumps(target, fsync=fsync)
            elif s.kind == STORAGE:
                checkpoint.dump(s.storage, s.sampler, ImmutableWriter(), None, target, fsync)
        fsync_dir(staging, fsync)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            shutil.rmtree(root, ignore_errors=True)
        raise
    publish(root, staging, fsync)


def read(path: Any, use: Callable[[Path, dict[str, Any]], T]) -> T:
    """``use(live, state)``: the live directory of a mixture checkpoint and its checked state.

    A ``dumps`` by another process that replaces the generation while ``use`` reads it makes
    ``use`` run again on the new one (:func:`rbdata._core.atomic.read_live`): ``use`` must change
    nothing outside what it returns.

    Raises:
        FileNotFoundError: ``path`` is not a directory.
        rbdata.errors.CheckpointError: not a mixture checkpoint, or a malformed one.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"no checkpoint directory at {str(root)!r}")
    return read_live(root, lambda live: use(live, _checked_state(live)))


def _checked_state(live: Path) -> dict[str, Any]:
    """The checked state of the mixture checkpoint in its live directory ``live``."""
    state = read_state(live)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{live}: not a MixedBuffer checkpoint")
    if state.get("version") != _VERSION:
        raise CheckpointError(f"{live}: format version {state.get('version')!r}, expected 1")
    entries = state.get("sources")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict)
        and isinstance(e.get("name"), str)
        and e.get("kind") in (BUFFER, DATASET, STORAGE)
        for e in entries
    ):
        raise CheckpointError(f"{live}: field 'sources': expected a list of named sources")
    if not isinstance(state.get("weights"), dict) or not isinstance(state.get("samplers"), dict):
        raise CheckpointError(f"{live}: fields 'weights' and 'samplers' must be dicts")
    return state


def check_dataset(name: str, entry: dict[str, Any], ds: Any) -> None:
    """Refuse a dataset whose identity differs from the one the checkpoint recorded."""
    saved = entry.get("dataset")
    if not isinstance(ds, OfflineDataset):
        raise ValueError(
            f"sources[{name!r}]: the checkpoint recorded an offline dataset, got "
            f"{type(ds).__name__}"
        )
    mine = dataset_identity(ds)
    if saved != mine:
        diff = sorted(
            k for k in mine.keys() | (saved or {}).keys() if mine.get(k) != (saved or {}).get(k)
        )
        what = ", ".join(f"{k}={(saved or {}).get(k)!r} (this one: {mine.get(k)!r})" for k in diff)
        raise ValueError(f"sources[{name!r}]: a different dataset than the checkpoint's: {what}")


def _check_sampler(name: str, saved: Any, sampler: Any) -> None:
    if not isinstance(saved, dict) or saved.get("class") != class_name(sampler, "sampler"):
        got = saved.get("class") if isinstance(saved, dict) else saved
        raise ValueError(
            f"samplers[{name!r}]: the checkpoint holds a {got}, this mixture has a "
            f"{type(sampler).__name__}"
        )
    if saved.get("config") != sampler.config():
        raise ValueError(
            f"samplers[{name!r}]: the checkpoint's config {saved.get('config')} differs from "
            f"this sampler's {sampler.config()}"
        )


def load_into(mixed: Any, path: Any, verify: bool = False) -> None:
    """Load a mixture checkpoint into ``mixed``: everything is checked before anything changes.

    The sources must match by name, kind and order; datasets by identity; samplers by class
    and config; buffers and storages by class and configuration (as ``rb.load``).

    Raises:
        ValueError: anything differs (``mixed`` is left as it was).
        rbdata.errors.CheckpointError: a missing, tampered or foreign checkpoint.
    """
    # everything is read and checked from one generation (again if a dump replaces it),
    # then applied from what was read: nothing is read from the directory after a change
    live, state, parts = read(
        path, lambda live, state: (live, state, _load_checked(mixed, live, state, verify))
    )
    try:
        for s in mixed._sources:
            if s.kind == DATASET:
                s.sampler.load_state_dict(state["samplers"][s.name]["state"])
            elif s.kind == BUFFER:
                s.obj.load_components(parts[s.name], str(live))  # what s.obj.load(directory) does
            else:
                loaded = parts[s.name]
                checkpoint.load_into(loaded, s.storage, s.sampler, ImmutableWriter(), str(live))
        mixed.weights = state["weights"]
    finally:
        _close(parts)


def _close(parts: dict[str, checkpoint.Components]) -> None:
    for loaded in parts.values():
        close = getattr(loaded[0], "close", None)
        if close is not None:
            close()


def _load_checked(
    mixed: Any, live: Path, state: dict[str, Any], verify: bool
) -> dict[str, checkpoint.Components]:
    """The saved buffers and storages of ``live``, loaded, each checked against ``mixed``'s."""
    sources: list[Source] = mixed._sources
    saved = [(e["name"], e["kind"]) for e in state["sources"]]
    mine = [(s.name, s.kind) for s in sources]
    if saved != mine:
        raise ValueError(
            f"sources: the checkpoint holds the sources (name, kind) {saved}, this mixture "
            f"has {mine}: build the mixture with the same sources, in the same order, as "
            "when it was saved (or MixedBuffer.loads(path) to rebuild it)"
        )
    parts = {}
    try:
        for s, entry in zip(sources, state["sources"], strict=True):
            if s.kind == DATASET:
                check_dataset(s.name, entry, s.obj)
                _check_sampler(s.name, state["samplers"].get(s.name), s.sampler)
                continue
            loaded = checkpoint.load(sources_dir(live, s.position), verify=verify)
            parts[s.name] = loaded
            writer = s.obj.writer if s.kind == BUFFER else ImmutableWriter()
            for kind, theirs, own in zip(
                ("storage", "sampler", "writer"),
                loaded[:3],
                (s.storage, s.sampler, writer),
                strict=True,
            ):
                a, b = theirs.config(), own.config()  # type: ignore[attr-defined]
                if kind == "storage":  # a tensor storage may load onto another device
                    a.pop("device", None), b.pop("device", None)
                if type(theirs) is not type(own) or a != b:
                    raise ValueError(
                        f"sources[{s.name!r}]: the checkpoint's {kind} is a "
                        f"{type(theirs).__name__} {a}, this one a {type(own).__name__} {b}"
                    )
        weights = state["weights"]
        mixed.sampler._check_state(
            {"weights": weights, "samplers": dict.fromkeys(mixed.sampler.names)}
        )
    except BaseException:
        _close(parts)
        raise
    return parts


def build(path: Any, datasets: Any = None, verify: bool = False) -> tuple[dict[str, Any], Any]:
    """The arguments of a new mixture from a checkpoint, and the dataset samplers' states.

    Offline datasets are reopened from their recorded cache path, or taken from
    ``datasets`` (name -> dataset); either way their identity must match the record.

    Raises:
        ValueError: a dataset that differs from the recorded one.
        rbdata.errors.CheckpointError: a missing, tampered or foreign checkpoint.
    """
    chosen = {} if datasets is None else dict(datasets)
    return read(path, lambda live, state: _build(live, state, chosen, verify))


def _build(
    live: Path, state: dict[str, Any], datasets: dict[str, Any], verify: bool
) -> tuple[dict[str, Any], Any]:
    """:func:`build` from the live directory ``live`` and its checked ``state``."""
    from rbdata.buffer import ReplayBuffer

    unknown = sorted(set(datasets) - {e["name"] for e in state["sources"] if e["kind"] == DATASET})
    if unknown:
        raise ValueError(f"datasets: the checkpoint has no dataset source called {unknown}")
    sources: dict[str, Any] = {}
    samplers: dict[str, Any] = {}
    states: dict[str, Any] = {}
    for position, entry in enumerate(state["sources"]):
        name = entry["name"]
        if entry["kind"] == BUFFER:
            sources[name] = ReplayBuffer.loads(sources_dir(live, position), verify=verify)
        elif entry["kind"] == STORAGE:
            storage, sampler, _, _ = checkpoint.load(sources_dir(live, position), verify=verify)
            sources[name], samplers[name] = storage, sampler
        else:
            ds = datasets.get(name)
            if ds is None:
                where = entry.get("path")
                if not isinstance(where, str):
                    raise CheckpointError(f"{live}: sources[{name!r}] has no dataset path")
                ds = OfflineDataset.open(where)
            check_dataset(name, entry, ds)
            saved = state["samplers"].get(name)
            if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict):
                raise CheckpointError(f"{live}: samplers[{name!r}]: no class and config")
            cls = checkpoint.component_class(saved.get("class"), "sampler")
            sources[name], samplers[name] = ds, cls(**saved["config"])
            states[name] = saved.get("state")
    keys = state.get("keys")
    kwargs = {
        "sources": sources,
        "weights": state["weights"],
        "samplers": samplers,
        "batch_size": state.get("batch_size"),
        "keys": None if keys is None else [tuple(k) for k in keys],
        "drop_info": bool(state.get("drop_info", False)),
    }
    return kwargs, states
