"""File helpers shared by the on-disk storages: directories, atomic JSON, metadata checks."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_json", "read_meta", "remove_with", "storage_dir"]


def _remove_dir(path: str, owner_pid: int) -> None:
    # Forked DataLoader workers inherit the finalizer: only the creating process removes.
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)


def remove_with(owner: object, root: Path) -> weakref.finalize:
    """Remove directory ``root`` when ``owner`` is closed (call the result) or collected."""
    return weakref.finalize(owner, _remove_dir, str(root), os.getpid())


def storage_dir(
    owner: object, path: str | os.PathLike[str] | None, prefix: str
) -> tuple[Path, weakref.finalize | None]:
    """A new storage directory: temporary (removed with ``owner``) or an empty ``path``."""
    if path is None:
        root = Path(tempfile.mkdtemp(prefix=prefix))
        return root, remove_with(owner, root)
    root = Path(path)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        name = type(owner).__name__
        raise FileExistsError(
            f"path {str(root)!r} already holds data; reopen it with "
            f"{name}.open({str(root)!r}) or choose an empty directory"
        )
    root.mkdir(parents=True, exist_ok=True)
    return root, None


def atomic_write_json(path: Path, obj: Any, fsync: bool = True) -> None:
    """Write JSON to a temporary file (fsync'ed if ``fsync``), then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_meta(root: Path, name: str, fmt: str, version: int, what: str) -> dict[str, Any]:
    """Read and check the JSON metadata file ``name`` of a ``what`` directory."""
    meta_file = root / name
    if not meta_file.is_file():
        raise FileNotFoundError(f"{str(root)!r} is not a {what}: no {name}")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{meta_file}: corrupt metadata file ({err})") from err
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        raise ValueError(f"{meta_file}: not an {fmt} directory")
    if meta.get("version") != version:
        raise ValueError(f"{meta_file}: format version {meta.get('version')!r}, expected {version}")
    return meta
