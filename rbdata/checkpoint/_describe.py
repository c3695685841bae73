"""What a checkpoint on disk holds, its data unread: :func:`describe` (``rbdata inspect``).

Only metadata is read, through the readers that :func:`~rbdata.checkpoint.load` uses (so it
is validated the same way): ``checkpoint.json``, the tensor table of ``tensors.bin``, the
storage's own metadata (:meth:`~rbdata.storages.Storage.describe`) and the few elements of
saved state tensors a sampler asks for (:meth:`~rbdata.samplers.base.Sampler.describe_state`,
one ``pread`` each). Data files are never opened or mapped; nothing is written.

No torch is imported for rbdata's own classes that describe their dumps without it (a
memmap-dumped ``TensorStorage``/``MemmapStorage``: :func:`rbdata.storages.kinds.saved_kind`;
samplers: :mod:`rbdata.samplers.saved`): the same checks run through torch-free readers
(:mod:`!rbdata.checkpoint._meta`). Other storage classes, and classes registered by a
program (which has imported torch already), are asked through their class as ``load`` does.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rbdata._core.atomic import CURRENT, live_dir, read_live
from rbdata._core.files import open_nofollow
from rbdata._core.spec import DTYPES
from rbdata.checkpoint._format import (
    BUILTIN,
    DIR,
    FORMAT,
    FORMAT_VERSION,
    MARK,
    META_FILE,
    TENSORS,
)
from rbdata.checkpoint._meta import check_table, read_checkpoint_meta
from rbdata.errors import CheckpointError
from rbdata.samplers.saved import describe_saved
from rbdata.storages import StorageInfo
from rbdata.storages.kinds import saved_kind

__all__ = ["CheckpointInfo", "describe"]

_MAX_LIST = 16  # longer lists of a component's state are shown by their length


@dataclass(frozen=True)
class CheckpointInfo:
    """What :func:`describe` read of a checkpoint.

    ``sampler`` and ``writer`` hold the component's ``class``, ``config`` and ``state`` as
    JSON-able values for display (a tensor shown as ``<tensor dtype [shape]>``, a list longer
    than 16 by its length), ``"registered": False`` for a class unknown here, and a sampler's
    :meth:`~rbdata.samplers.base.Sampler.describe_state` values added to its state.
    ``problems`` lists what :func:`~rbdata.checkpoint.load` would refuse although the
    metadata is readable (a truncated ``tensors.bin``, a storage file cut short...).
    """

    #: the live subdirectory's name (the directory itself when given one)
    live: str
    batch_size: int | None
    #: whether ``checkpoint.json`` records checksums (``dump(..., checksums=True)``)
    checksums: bool
    storage_class: str
    storage: StorageInfo
    sampler: dict[str, Any]
    writer: dict[str, Any]
    problems: tuple[str, ...] = ()


def describe(path: str | os.PathLike[str]) -> CheckpointInfo:
    """Describe the checkpoint at ``path`` (with ``CURRENT``, or its live subdirectory).

    Raises:
        CheckpointError: its metadata is missing or corrupt (the message names the file and
            the field), or a component class is not registered.
        OSError: a metadata file cannot be read.

    Examples:
        >>> import tempfile, torch
        >>> from rbdata import ReplayBuffer, TensorStorage
        >>> rb = ReplayBuffer(storage=TensorStorage(8), batch_size=2)
        >>> rb.extend(torch.zeros(3, 2))
        tensor([0, 1, 2])
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     rb.dumps(tmp + "/ckpt")
        ...     info = describe(tmp + "/ckpt")
        >>> info.storage_class, info.storage.length, info.batch_size, info.sampler["class"]
        ('TensorStorage', 3, 2, 'UniformSampler')
    """
    root = Path(path)
    if not os.path.lexists(root / CURRENT):
        return _describe_live(root)

    def read(live: Path) -> CheckpointInfo:
        info = _describe_live(live)
        if info.problems and live_dir(root) != live:  # removed by a dump while read
            raise CheckpointError(f"{live}: replaced while it was read")
        return info

    return read_live(root, read)  # a dump meanwhile: the new generation is described


def _describe_live(live: Path) -> CheckpointInfo:
    """:func:`describe` of one live checkpoint directory."""
    file = live / META_FILE
    meta = read_checkpoint_meta(file, FORMAT, FORMAT_VERSION)
    try:
        table = check_table(live / TENSORS, meta["tensors"])
    except CheckpointError as err:
        table, problems = [], [str(err)]
    else:
        problems = []
    entry = meta["storage"]
    storage_class = entry["class"]
    try:  # the storage class reads what its own dump wrote (metadata only)
        info, more = _storage(storage_class, entry["config"], entry["state"], live)
    except CheckpointError:
        raise
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    problems += more
    parts = {}
    for kind in ("sampler", "writer"):
        part = meta[kind]
        parts[kind] = _component(part, kind, live / TENSORS, table)
    return CheckpointInfo(
        live=live.name,
        batch_size=meta["batch_size"],
        checksums=isinstance(meta.get("checksums"), dict),
        storage_class=storage_class,
        storage=info,
        sampler=parts["sampler"],
        writer=parts["writer"],
        problems=tuple(problems),
    )


def _storage(name: Any, config: Any, state: Any, live: Path) -> tuple[StorageInfo, list[str]]:
    """The storage's ``check_dump`` (what load checks first), then its ``describe``."""
    file, directory = live / META_FILE, live / DIR
    saved = saved_kind(name) if isinstance(name, str) else None
    if saved is not None:  # rbdata's class: the functions its hooks call, torch-free
        saved.check(directory, config, state, file)
        return saved.describe(directory, config, state, file)
    # another class (ListStorage, ArrowStorage, a program's own): asked as load asks it
    from rbdata.checkpoint._registry import component_class
    from rbdata.checkpoint._storage_checks import check_storage
    from rbdata.storages.base import Storage

    cls = component_class(name, "storage")
    check_storage(cls, config, state, live)
    storage_cls: type[Storage] = cls
    info, more = storage_cls.describe(directory, config, state, file)
    return info, list(more)


def _registered(name: Any, kind: str) -> type | None:
    """A program's own class registered as ``name`` in this process, if any.

    Such a class was registered through ``rbdata.checkpoint.register``, so the registry
    (and torch) is imported already; nothing is imported here otherwise.
    """
    registry = sys.modules.get("rbdata.checkpoint._registry")
    if registry is None or not isinstance(name, str) or not registry.is_registered(name):
        return None
    try:
        cls: type = registry.component_class(name, kind)
    except CheckpointError:
        return None
    return cls


def _component(entry: dict[str, Any], kind: str, file: Path, table: list[Any]) -> Any:
    """Class, config and state of a sampler or writer; tensors shown by dtype and shape."""
    name = entry["class"]
    builtin = isinstance(name, str) and name in BUILTIN[kind]
    cls = None if builtin else _registered(name, kind)
    out: dict[str, Any] = {"class": name}
    if not builtin and cls is None:
        out["registered"] = False  # a custom class of another program
    out["config"] = _plain(entry["config"], table)
    state = entry["state"]
    out["state"] = shown = _plain(state, table)
    if kind == "sampler" and (builtin or cls is not None) and isinstance(shown, dict):

        def read(value: Any, i: int) -> float | None:
            return _element(file, table, value, i)

        if builtin:  # rbdata's sampler: the function its describe_state calls, torch-free
            shown.update(describe_saved(name, state, read))
        else:  # a program's own sampler (torch is imported already)
            from rbdata.samplers.base import Sampler

            if cls is not None and issubclass(cls, Sampler):
                shown.update(cls.describe_state(state, read))
    return out


def _plain(value: Any, table: list[Any]) -> Any:
    """An encoded config/state value for display: tensors as ``<tensor dtype [shape]>``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        if len(value) > _MAX_LIST:
            return f"<list of {len(value)}>"
        return [_plain(v, table) for v in value]
    if not isinstance(value, dict):
        return value
    mark = value.get(MARK)
    if mark is None:
        return {str(k): _plain(v, table) for k, v in value.items()}
    if mark == "tensor":
        i = value.get("i")
        if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(table):
            dtype, shape = table[i][0], table[i][1]
            return f"<tensor {str(dtype).removeprefix('torch.')} {list(shape)}>"
        return "<tensor>"
    if mark in ("dtype", "device"):
        return str(value.get("name"))
    if mark == "tuple":
        return _plain(value.get("items"), table)
    return f"<{mark}>"


def _element(file: Path, table: list[Any], ref: Any, index: int) -> float | None:
    """Element ``index`` of the saved 1-D floating tensor ``ref`` (one ``pread``), if any."""
    i = ref.get("i") if isinstance(ref, dict) and ref.get(MARK) == "tensor" else None
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(table):
        return None
    name, shape, offset, _ = table[i]
    dtype = DTYPES[name]
    if not dtype.floating or len(shape) != 1 or not 0 <= index < shape[0]:
        return None
    with open_nofollow(file, "rb") as f:
        raw = os.pread(f.fileno(), dtype.itemsize, offset + index * dtype.itemsize)
    if len(raw) != dtype.itemsize:
        return None
    value = _float(raw, name)
    return value if math.isfinite(value) else None


def _float(raw: bytes, name: str) -> float:
    """The float in ``raw`` bytes of dtype ``name`` (native byte order, as written)."""
    if name in ("float16", "float32", "float64"):
        return float(np.frombuffer(raw, dtype=name)[0])
    if name == "bfloat16":  # the upper half of a float32
        return float(
            np.frombuffer(raw, dtype=np.uint16).astype(np.uint32).__lshift__(16).view(np.float32)[0]
        )
    import torch  # float8 and the like: numpy has no such dtype (never a sampler's tree)

    return float(torch.frombuffer(bytearray(raw), dtype=getattr(torch, name))[0])
