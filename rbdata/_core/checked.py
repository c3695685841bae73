"""Checked reads of metadata files: regular files only, bounded JSON, typed fields.

The readers of checkpoints and of the storages' dumped directories go through these helpers:
JSON files are read without following symlinks and refused when nested too deeply; every
field is type- and range-checked with Python integers (no overflow); file names are plain
names inside their directory. A failure raises :class:`~rbdata.errors.CheckpointError`
naming the file and the field.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rbdata._core.files import inside, open_nofollow
from rbdata.errors import CheckpointError

__all__ = [
    "MAX_DEPTH",
    "check_depth",
    "check_int",
    "get",
    "get_dict",
    "get_int",
    "get_list",
    "leaf_path",
    "plain_file",
    "read_json",
    "read_small",
]

#: deepest nesting of lists and dicts accepted in a metadata file
MAX_DEPTH = 100


def check_depth(obj: Any, file: Path | str, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON values nested deeper than ``limit`` (checked without recursion)."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            raise CheckpointError(f"{file}: nested more than {limit} levels deep; corrupt")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def plain_file(path: Path, what: str) -> os.stat_result:
    """The ``lstat`` of ``path``, which must be a regular file (not a symlink, not missing)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; the checkpoint's {what} needs it") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err})") from err
    if stat.S_ISLNK(st.st_mode):
        raise CheckpointError(f"{path}: a symlink; checkpoint files may not be symlinks")
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path}: not a regular file")
    return st


def read_small(path: Path, what: str) -> bytes:
    """The bytes of regular file ``path``, opened without following a symlink."""
    plain_file(path, what)
    try:
        with open_nofollow(path, "rb") as f:
            return f.read()
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: cannot be read ({err})") from err


def read_json(path: Path, what: str) -> Any:
    """Parse JSON file ``path`` (no symlink, at most :data:`MAX_DEPTH` levels deep)."""
    raw = read_small(path, what)
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)[:200]
        raise CheckpointError(f"{path}: corrupt metadata file ({reason})") from None
    check_depth(obj, path)
    return obj


def get(obj: Any, key: str, file: Path | str, where: str) -> Any:
    """``obj[key]``; ``CheckpointError`` naming ``where.key`` if ``obj`` lacks it."""
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{file}: {where or 'the metadata'} must be an object")
    if key not in obj:
        raise CheckpointError(f"{file}: field {_join(where, key)!r} is missing")
    return obj[key]


def get_dict(obj: Any, key: str, file: Path | str, where: str) -> dict[str, Any]:
    """``obj[key]``, which must be a JSON object."""
    value = get(obj, key, file, where)
    if not isinstance(value, dict):
        raise CheckpointError(
            f"{file}: field {_join(where, key)!r} is not an object (got {type(value).__name__})"
        )
    return value


def get_list(obj: Any, key: str, file: Path | str, where: str) -> list[Any]:
    """``obj[key]``, which must be a JSON list."""
    value = get(obj, key, file, where)
    if not isinstance(value, list):
        raise CheckpointError(
            f"{file}: field {_join(where, key)!r} is not a list (got {type(value).__name__})"
        )
    return value


def get_int(
    obj: Any, key: str, file: Path | str, where: str, low: int = 0, high: int | None = None
) -> int:
    """``obj[key]``: an integer (not a bool) in ``[low, high]``."""
    return check_int(get(obj, key, file, where), file, _join(where, key), low, high)


def check_int(
    value: Any, file: Path | str, name: str, low: int = 0, high: int | None = None
) -> int:
    """``value`` itself: an integer (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{file}: field {name!r} must be an integer, got {value!r:.60}")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise CheckpointError(f"{file}: field {name!r} is {value}, expected {bound}")
    return value


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def leaf_path(root: Path, name: Any, file: Path, field: str) -> Path:
    """``root / name`` for a data file named in metadata: a plain name, no symlink."""
    try:
        return inside(root, name, "file")
    except ValueError as err:
        raise CheckpointError(f"{file}: field {field!r}: {err}") from None
