"""``rbdata inspect PATH``: what a storage directory or checkpoint on disk holds, data unread.

:func:`inspect_path` recognises a :class:`~rbdata.storages.MemmapStorage` directory
(``layout.json``), an :class:`~rbdata.storages.ArrowStorage` directory (``_rbdata.json``), a
checkpoint written by :meth:`rbdata.ReplayBuffer.dumps` (``CURRENT``, or its live ``ckpt-*``
subdirectory) and a converted D4RL/Minari cache entry (``dataset.json``), and returns a
:class:`Summary`. Only metadata is read, through the readers that ``open``/``loads`` use (so
it is validated the same way): the JSON files, the 64-byte memmap header, the tensor table of
a checkpoint and the few saved state elements its sampler shows (the roots of a prioritized
sampler's trees; see :func:`rbdata.checkpoint.describe`). Data files
are never opened or mapped, only their sizes taken; no symlink is followed; nothing is
written. :func:`format_summary` renders the text report.
"""

from __future__ import annotations

import os
import reprlib
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rbdata._core.atomic import CURRENT
from rbdata._core.files import inside
from rbdata._core.spec import STRING, TENSOR
from rbdata.checkpoint import META_FILE
from rbdata.storages import KeyInfo, StorageInfo
from rbdata.storages.kinds import disk_kind, disk_kinds

__all__ = ["KeyInfo", "StorageInfo", "Summary", "format_summary", "inspect_path"]

_DATASET_FILE = "dataset.json"  # rbdata.datasets.DATASET_FILE (imported lazily)


@dataclass(frozen=True)
class Summary:
    """What :func:`inspect_path` found at ``path``.

    ``kind`` is ``"memmap"``, ``"arrow"``, ``"checkpoint"`` or ``"dataset"``;
    ``checkpoint`` (batch size, sampler and writer: class, config, state) and ``dataset``
    (family, id, backend, counts) are set for those kinds. ``problems`` lists what ``open``
    or ``loads`` would refuse although the metadata is readable (a truncated data file...).
    """

    path: str
    kind: str
    storage_class: str
    storage: StorageInfo
    size_bytes: int
    allocated_bytes: int
    checkpoint: dict[str, Any] | None = None
    dataset: dict[str, Any] | None = None
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON-able values (what ``rbdata inspect --json`` prints)."""
        return asdict(self)


def inspect_path(path: str | os.PathLike[str]) -> Summary:
    """Summarise the storage directory, checkpoint or dataset entry at ``path``, data unread.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: ``path`` is a symlink, a file, or a directory that is none of these, or
            its metadata is corrupt (:class:`~rbdata.errors.CheckpointError` for a
            checkpoint); the message names the file and the field.
        OSError: a metadata file cannot be read (permissions...).

    Examples:
        >>> import tempfile, torch
        >>> from rbdata import MemmapStorage
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     storage = MemmapStorage(10, path=tmp + "/st")
        ...     storage.set(slice(0, 3), torch.zeros(3, 2))
        ...     storage.close()
        ...     s = inspect_path(tmp + "/st")
        >>> s.kind, s.storage.capacity, s.storage.length, s.storage.keys[0].shape
        ('memmap', 10, 3, (2,))
    """
    root = Path(path)
    if root.is_symlink():
        raise ValueError(f"{str(root)!r}: a symlink; rbdata inspect does not follow symlinks")
    if not root.exists():
        raise FileNotFoundError(f"{str(root)!r}: no such file or directory")
    if not root.is_dir():
        raise ValueError(f"{str(root)!r} is a file, not a storage directory or checkpoint")
    names = {entry.name for entry in os.scandir(root)}
    if CURRENT in names or META_FILE in names:
        kind = "checkpoint"
        info, storage_class, extra, problems = _checkpoint(root)
    elif _DATASET_FILE in names:
        kind = "dataset"
        info, storage_class, extra, problems = _dataset(root)
    elif (entry := disk_kind(names=names)) is not None:
        kind = entry.kind
        info, problems = entry.describe(root)
        storage_class, extra = entry.class_name, None
    else:
        what = "an empty directory" if not names else "a directory"
        markers = " or ".join(k.marker_file for k in disk_kinds().values())
        raise ValueError(
            f"{str(root)!r} is {what}, not a storage directory or checkpoint (no {CURRENT}, "
            f"{META_FILE}, {_DATASET_FILE}, {markers})"
        )
    where = (extra if kind == "checkpoint" else None, extra if kind == "dataset" else None)
    path = os.path.abspath(root)
    return Summary(path, kind, storage_class, info, *_tree_size(root), *where, tuple(problems))


# --- storage directories ---------------------------------------------------------------------
def _bad_field(file: Path, field: str, value: Any, expected: str) -> ValueError:
    return ValueError(f"{file}: field {field!r} is {reprlib.repr(value)}, expected {expected}")


def _tree_size(root: Path) -> tuple[int, int]:
    """Apparent and allocated bytes of the regular files below ``root`` (no symlink)."""
    size = allocated = 0
    for dirpath, _, files in os.walk(root):  # os.walk does not descend into symlinks
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                size += st.st_size
                allocated += getattr(st, "st_blocks", 0) * 512
    return size, allocated


# --- checkpoints -----------------------------------------------------------------------------
def _checkpoint(root: Path) -> tuple[StorageInfo, str, dict[str, Any], list[str]]:
    from rbdata.checkpoint import describe as describe_checkpoint

    c = describe_checkpoint(root)  # the checkpoint package reads its own format
    extra: dict[str, Any] = {"live": c.live, "batch_size": c.batch_size}
    extra.update(checksums=c.checksums, sampler=c.sampler, writer=c.writer)
    return c.storage, c.storage_class, extra, list(c.problems)


# --- offline dataset cache entries -------------------------------------------------------------
def _dataset(root: Path) -> tuple[StorageInfo, str, dict[str, Any], list[str]]:
    from rbdata.datasets import STORAGE_DIR, read_entry

    meta = read_entry(root)
    file = root / _DATASET_FILE
    backend = meta.get("backend")
    entry = disk_kind(backend) if isinstance(backend, str) else None
    if entry is None:
        kinds = " or ".join(repr(kind) for kind in disk_kinds())
        raise _bad_field(file, "backend", backend, kinds)
    storage = inside(root, STORAGE_DIR, "storage directory")
    if not storage.is_dir():
        raise FileNotFoundError(f"{str(root)!r}: a dataset entry without its {STORAGE_DIR}/")
    info, problems = entry.describe(storage)
    extra = {k: meta.get(k) for k in ("family", "id", "backend", "transitions", "episodes")}
    if extra["transitions"] != info.length:
        problems.append(
            f"{_DATASET_FILE} says {extra['transitions']!r} transitions, the storage holds "
            f"{info.length}"
        )
    return info, entry.class_name, extra, problems


# --- text report ---------------------------------------------------------------------------
_TITLES = {
    "memmap": "MemmapStorage directory",
    "arrow": "ArrowStorage directory",
    "frames": "FrameStackStorage directory",
    "checkpoint": "ReplayBuffer checkpoint",
    "dataset": "offline dataset cache entry",
}


def _key_row(k: KeyInfo) -> tuple[str, str, str]:
    name = ".".join(k.key) or "(tensor)"
    dims = ", ".join(map(str, k.shape))
    shape = f"[*{', ' + dims if dims else ''}]" if k.kind != TENSOR else f"[{dims}]"
    return name, "-" if k.kind == STRING else shape, "str" if k.kind == STRING else k.dtype


def format_summary(summary: Summary) -> str:
    """The text report of ``rbdata inspect``: one ``name: value`` line per field, then keys.

    Examples:
        >>> info = StorageInfo("memmap", 8, 3, 3, (KeyInfo(("obs",), (2,), "float32"),))
        >>> print(format_summary(Summary("/d", "memmap", "MemmapStorage", info, 64, 64)))
        path:         /d
        kind:         MemmapStorage directory
        capacity:     8
        length:       3
        next slot:    3
        size on disk: 64 B (apparent 64 B)
        keys (1):
          KEY  SHAPE  DTYPE
          obs  [2]    float32
    """
    from rbdata.datasets import human_size

    s, st = summary, summary.storage
    kind = _TITLES[s.kind]
    if s.kind == "checkpoint" and s.checkpoint is not None:
        kind += f" (live: {s.checkpoint['live']})"
    lines = [f"path:         {s.path}", f"kind:         {kind}"]
    if s.kind in ("checkpoint", "dataset"):
        lines.append(f"storage:      {s.storage_class} ({st.format})")
    for key, value in (s.dataset or {}).items():
        lines.append(f"{key + ':':<13} {value if value is not None else '-'}")
    lines += [f"capacity:     {st.capacity:,}", f"length:       {st.length:,}"]
    lines.append(f"next slot:    {st.next_slot:,}")
    for key, value in st.details.items():
        lines.append(f"{key.replace('_', ' ') + ':':<13} {value}")
    used, apparent = human_size(s.allocated_bytes), human_size(s.size_bytes)
    lines.append(f"size on disk: {used} (apparent {apparent})")
    lines.append(f"keys ({len(st.keys)}):")
    rows = [("KEY", "SHAPE", "DTYPE"), *map(_key_row, st.keys)]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    if st.keys:
        lines += [f"  {a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in rows]
    if s.checkpoint is not None:
        lines.append(f"batch size:   {s.checkpoint['batch_size']}")
        for kind in ("sampler", "writer"):
            part = s.checkpoint[kind]
            note = "" if part.get("registered", True) else " (not registered here)"
            lines.append(f"{kind + ':':<13} {part['class']}{note}")
            for section in ("config", "state"):
                values = part[section]
                if isinstance(values, dict) and values:
                    lines.append(f"  {section}:")
                    lines += [f"    {name}: {value}" for name, value in values.items()]
                elif values not in ({}, None):
                    lines.append(f"  {section}: {values}")
    lines += [f"problem:      {p}" for p in s.problems]
    return "\n".join(lines)
