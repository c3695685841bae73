"""One cache entry from a source file: local or cached/downloaded, verified, converted.

The steps every file-based dataset family (D4RL, OGBench) takes to build an entry: a local
file (``file=``, a ``file://`` URL or mirror) is verified in place; otherwise the cache's
download is verified or fetched (the family's ``cached_file``); the file is converted into the
entry's storage, and the entry's metadata records where the bytes came from. A failure leaves
nothing behind: no entry, no lock file, no empty folder (a partial download with bytes in it
stays, for the next call to resume).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rbdata.datasets._cache import STORAGE_DIR, build_entry, prune_empty_dirs
from rbdata.datasets._download import Downloaded, verify_file

__all__ = ["LOCAL_HINT", "prepare_entry"]

#: what a refused local file's message advises
LOCAL_HINT = "the file is left as it is; pass sha256= (--sha256) with its digest to use it anyway"


def prepare_entry(
    target: Path,
    base: Path,
    cached: Path,
    *,
    name: str,
    local: tuple[Path, str] | None,
    cached_file: Callable[[], tuple[Downloaded, dict[str, Any]]],
    convert: Callable[[Path, Path], dict[str, Any]],
    fields: tuple[dict[str, Any], dict[str, Any]],
    sha256: str | None,
    size: int | None,
) -> None:
    """Build the entry ``target`` (below the cache ``base``) from the family's source file.

    Args:
        target: the entry's folder.
        base: the cache root (empty folders are pruned up to it on failure).
        cached: where the family keeps its download of the file.
        name: the dataset id, for messages.
        local: ``(path, url)`` of a local file to use instead of the cache, or ``None``.
        cached_file: verifies (or fetches) ``cached``; returns it and where it came from
            (``{"url": ...}``, possibly empty).
        convert: ``convert(source_file, storage_dir)`` writes the storage; returns metadata.
        fields: metadata entries before the conversion's and after the source's.
        sha256: the expected digest (``None``: unknown, recorded as computed).
        size: the expected size in bytes (``None``: unknown).
    """

    def build(tmp: Path) -> dict[str, Any]:
        if local is not None:
            path, href = local
            got = verify_file(path, name=name, sha256=sha256, size=size, hint=LOCAL_HINT)
            where: dict[str, Any] = {"url": href, "path": str(path)}
        else:
            got, where = cached_file()
            where = {**where, "file": got.path.relative_to(base).as_posix()}
        info = convert(got.path, tmp / STORAGE_DIR)
        head, tail = fields
        source = {
            **where,
            "size": got.size,
            "sha256": got.sha256,
            "sha256_verified": sha256 is not None,
        }
        return {**head, **info, "source": source, **tail}

    try:
        build_entry(target, build)
    except BaseException:
        prune_empty_dirs(target.parent, base)
        prune_empty_dirs(cached.parent, base)
        raise
