"""Checkpoint directories (:func:`dump`, :func:`load`) and state dicts; see rbdata.checkpoint.

See the package's doc for the format; its names are imported from here on first use.
"""

from __future__ import annotations

import contextlib
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rbdata._core.atomic import fsync_dir, new_staging, publish, read_live
from rbdata._core.files import atomic_write_json
from rbdata._core.ids import new_id
from rbdata.checkpoint._checksum import ALGORITHM, SMALL_FILE, add_tails
from rbdata.checkpoint._checksum import verify as verify_files
from rbdata.checkpoint._codec import check_table, decode, encode, read_tensors, write_tensors
from rbdata.checkpoint._format import FORMAT, FORMAT_VERSION, META_FILE, STATE_FORMAT, TENSORS
from rbdata.checkpoint._identity import check_identity, check_trailer, trailer
from rbdata.checkpoint._registry import class_name, component_class
from rbdata.checkpoint._storages import (
    check_storage,
    dump_storage,
    restore_storage,
    storage_from_state,
    storage_state,
)
from rbdata.checkpoint._validate import check_component, read_checkpoint_meta
from rbdata.errors import CheckpointError
from rbdata.samplers.base import Sampler
from rbdata.storages.base import Storage
from rbdata.writers.base import Writer

__all__ = ["Components", "dump", "from_state_dict", "load", "state_dict"]

#: a rebuilt buffer (storage, sampler, writer and batch size)
Components = tuple[Storage, Sampler, Writer, "int | None"]


def _build(cls: type, config: Any, state: Any, kind: str, storage: Storage) -> Any:
    if not isinstance(config, dict):
        raise CheckpointError(f"{kind}: the config must be a dict, got {type(config).__name__}")
    check_component(cls, config, state, kind, storage.capacity)
    # a sampler is bound before its state is loaded: the state is checked against the data
    obj = cls(**config, data_source=storage) if kind == "sampler" else cls(**config)
    obj.load_state_dict(state)
    cursor = getattr(obj, "cursor", None)
    if cursor is not None and not 0 <= cursor < storage.capacity:
        raise CheckpointError(f"{kind}: cursor {cursor} outside [0, {storage.capacity})")
    return obj


def _wrap(where: str, err: Exception) -> CheckpointError:
    return CheckpointError(f"{where}: invalid checkpoint ({type(err).__name__}: {err})")


# AssertionError: torch's "not compiled with CUDA" for a CUDA component on a CPU-only machine
_INVALID = (
    KeyError,
    TypeError,
    ValueError,
    RuntimeError,
    IndexError,
    AttributeError,
    AssertionError,
)


# --- checkpoint directories -----------------------------------------------------------------
def dump(
    storage: Storage,
    sampler: Sampler,
    writer: Writer,
    batch_size: int | None,
    path: Any,
    fsync: bool = True,
) -> Path:
    """Write a checkpoint of the components to directory ``path``, atomically.

    Every file's CRC-32 is recorded in ``checkpoint.json``, computed while the file is
    written (see :mod:`!rbdata.checkpoint._checksum`); ``load(..., verify=True)`` checks them.
    Returns the live subdirectory. See :meth:`rbdata.ReplayBuffer.dumps`.
    """
    root = Path(path)
    created = not root.exists()
    tensors: list[Any] = []
    parts: dict[str, Any] = {"sampler": sampler, "writer": writer}
    ident = new_id()  # names the live directory; in checkpoint.json and tensors.bin's trailer
    meta: dict[str, Any] = {"format": FORMAT, "version": FORMAT_VERSION, "id": ident}
    meta["batch_size"] = batch_size
    for kind, obj in parts.items():  # encode first: a bad component fails before any write
        meta[kind] = {
            "class": class_name(obj, kind),
            "config": encode(obj.config(), tensors, f"{kind} config"),
            "state": encode(obj.state_dict(), tensors, f"{kind} state"),
        }
    name = class_name(storage, "storage")
    # the state tensors are all known before the storage is written, unless the storage's
    # config holds tensors or its dump adds some (Storage.dump_adds_tensors): then tensors.bin
    # is written after the storage; else in a thread meanwhile (same bytes, same order)
    config_tensors: list[Any] = []
    config = encode(storage.config(), config_tensors, "storage config")
    early = not config_tensors and not type(storage).dump_adds_tensors
    staging = new_staging(root)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:  # its exit waits for the job
            tail = trailer(ident)
            table = (
                pool.submit(write_tensors, staging / TENSORS, tensors, fsync, tail)
                if early
                else None
            )
            state, sums = dump_storage(storage, staging, tensors, fsync)
        if table is not None:
            written = table.result()
        else:
            config = encode(storage.config(), tensors, "storage config")
            written = write_tensors(staging / TENSORS, tensors, fsync, tail)
        meta["storage"] = {"class": name, "config": config, "state": state}
        meta["tensors"], sums[TENSORS] = written
        add_tails(staging, sums)
        meta["checksums"] = {"algorithm": ALGORITHM, "files": sums}
        atomic_write_json(staging / META_FILE, meta, fsync)
        fsync_dir(staging, fsync)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        return publish(root, staging, fsync, ident)
    except BaseException:
        if created and not (root / "CURRENT").exists():
            shutil.rmtree(root, ignore_errors=True)
        raise


def load(path: Any, verify: bool = False) -> Components:
    """Rebuild the components saved in checkpoint directory ``path`` (lazily for the data).

    Everything the metadata says is checked before anything is built: field types and
    ranges, file names (plain names inside the checkpoint; symlinks refused), file sizes
    against the metadata, and component sizes against the data actually present.

    A :func:`dump` to ``path`` by another process during the load is safe: the load
    returns one whole generation, the one ``CURRENT`` named when it started or a later one
    (it reads again when the generation it read was replaced meanwhile).

    Args:
        path: the checkpoint directory.
        verify: also check every file against the checksum recorded by :func:`dump`
            (reads every byte once; default ``False`` keeps loading lazy).

    Raises:
        FileNotFoundError: if ``path`` is not a directory.
        CheckpointError: if the checkpoint is incomplete, tampered with, corrupt (with
            ``verify``), of another format version, or names an unknown class; the message
            names the file and the field. With ``verify=True``, also for a checkpoint
            written without checksums (by an older rbdata).
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"no checkpoint directory at {str(root)!r}")
    # another process may publish a new generation meanwhile: read_live reads it instead
    return read_live(root, lambda live: _load_live(live, verify))


def _load_live(live: Path, verify: bool) -> Components:
    """:func:`load` of the live directory ``live``."""
    meta = read_checkpoint_meta(live / META_FILE, FORMAT, FORMAT_VERSION)
    kinds = ("storage", "sampler", "writer")
    classes = {kind: component_class(meta[kind]["class"], kind) for kind in kinds}
    storage_meta = meta["storage"]
    check_identity(live, meta)  # O(1): the directory's name
    try:
        plan = check_storage(
            classes["storage"], storage_meta["config"], storage_meta["state"], live
        )
        check_table(live / TENSORS, meta["tensors"])
        if verify:
            verify_files(live, meta, live / META_FILE)
        elif "checksums" in meta:  # the small files only (headers, metadata): O(1)
            verify_files(live, meta, live / META_FILE, SMALL_FILE)
        check_trailer(meta, live / TENSORS)  # O(1): 32 bytes
        tensors = read_tensors(live / TENSORS, meta["tensors"])
        decoded = {
            kind: (
                decode(meta[kind]["config"], tensors, f"{kind} config"),
                decode(meta[kind]["state"], tensors, f"{kind} state"),
            )
            for kind in ("sampler", "writer")
        }
        for kind, (config, state) in decoded.items():  # before the storage maps or copies
            check_component(classes[kind], config, state, kind, plan[0], str(live / META_FILE))
        config = decode(storage_meta["config"], tensors, "storage config")
        storage = restore_storage(
            classes["storage"], config, storage_meta["state"], live, tensors, plan
        )
        parts: dict[str, Any] = {"storage": storage}
        try:
            for kind, (config, state) in decoded.items():
                parts[kind] = _build(classes[kind], config, state, kind, storage)
        except BaseException:
            _close(storage)
            raise
    except CheckpointError:
        raise
    except (*_INVALID, OSError) as err:
        raise _wrap(str(live), err) from err
    return parts["storage"], parts["sampler"], parts["writer"], meta["batch_size"]


def _close(storage: Storage) -> None:
    """Release a storage built for a load that then failed (its private copy, its maps)."""
    close = getattr(storage, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            close()


# --- state dicts ---------------------------------------------------------------------------------
def state_dict(
    storage: Storage, sampler: Sampler, writer: Writer, batch_size: int | None
) -> dict[str, Any]:
    """The components as one dict of tensors and plain values.

    ``torch.load(..., weights_only=True)`` reads it. See :meth:`rbdata.ReplayBuffer.state_dict`.
    """
    out: dict[str, Any] = {"format": STATE_FORMAT, "version": FORMAT_VERSION}
    out["batch_size"] = batch_size
    parts: dict[str, Any] = {"storage": storage, "sampler": sampler, "writer": writer}
    for kind, obj in parts.items():
        name = class_name(obj, kind)
        config = obj.config()
        encode(config, [], f"{kind} config")  # the same checks as a checkpoint
        if kind == "storage":
            state = storage_state(obj)  # encoded already where needed (ListStorage items)
        else:
            state = obj.state_dict()
            encode(state, [], f"{kind} state")
        out[kind] = {"class": name, "config": config, "state": state}
    return out


def from_state_dict(state: Any) -> Components:
    """Rebuild the components of a :func:`state_dict`."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise CheckpointError("state: not a ReplayBuffer state dict")
    if state.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"state: version {state.get('version')!r}, expected {FORMAT_VERSION}")
    try:
        parts: dict[str, Any] = {}
        for kind in ("storage", "sampler", "writer"):
            entry = state[kind]
            cls = component_class(entry["class"], kind)
            if kind == "storage":
                parts[kind] = storage_from_state(cls, entry["config"], entry["state"])
            else:
                parts[kind] = _build(cls, entry["config"], entry["state"], kind, parts["storage"])
    except CheckpointError:
        raise
    except (*_INVALID, OSError) as err:
        raise _wrap("state", err) from err
    return parts["storage"], parts["sampler"], parts["writer"], state["batch_size"]
