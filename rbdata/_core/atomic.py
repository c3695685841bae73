"""Atomic checkpoint directories: write a staging directory, then switch one pointer file.

A checkpoint path holds ``CURRENT`` (a one-line file naming the live subdirectory) and the
subdirectories themselves. A new checkpoint is written to a fresh ``.tmp-*`` subdirectory,
fsync'ed, renamed to ``ckpt-*``, and made live by replacing ``CURRENT`` with an atomic file
rename. At every moment ``CURRENT`` names a complete checkpoint: a process killed midway
leaves the previous one live, and its leftovers are removed by the next successful write.

A reader resolves ``CURRENT`` once and reads that one subdirectory (:func:`read_live`): it
never mixes two generations. A writer publishing meanwhile removes the generation the reader
is reading; the reader then fails on a missing file, sees that ``CURRENT`` moved, and reads
the new generation instead (an error while ``CURRENT`` stays put is the checkpoint's own).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rbdata._core.files import open_nofollow
from rbdata.errors import CheckpointError

__all__ = ["CURRENT", "fsync_dir", "live_dir", "new_staging", "publish", "read_live"]

CURRENT = "CURRENT"
_LIVE = "ckpt-"
_STAGING = ".tmp-"
_LIVE_NAME = re.compile(r"ckpt-[0-9a-f]{1,40}")
#: how many generations a reader tries before giving up on a path that keeps changing
_READ_TRIES = 100

T = TypeVar("T")


def fsync_dir(path: Path, fsync: bool = True) -> None:
    """Make the entries of directory ``path`` durable (nothing if not ``fsync``)."""
    if not fsync:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ours(name: str) -> bool:
    return name == CURRENT or name.startswith((_LIVE, _STAGING, f".{CURRENT}."))


def new_staging(path: Path) -> Path:
    """Create ``path`` if needed and a fresh staging subdirectory in it.

    Raises:
        FileExistsError: if ``path`` is a file, or a directory holding other files than a
            checkpoint's (nothing of the user's is ever removed).
    """
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"path {str(path)!r} is a file, not a checkpoint directory")
    path.mkdir(parents=True, exist_ok=True)
    foreign = sorted(child.name for child in path.iterdir() if not _ours(child.name))
    if foreign:
        raise FileExistsError(
            f"path {str(path)!r} holds files that are not part of an rbdata checkpoint "
            f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); choose an "
            "empty or new directory"
        )
    return Path(tempfile.mkdtemp(prefix=_STAGING, dir=path))


def publish(path: Path, staging: Path, fsync: bool = True, ident: str | None = None) -> Path:
    """Make the complete ``staging`` directory the live checkpoint of ``path``.

    Returns the live directory, named ``ckpt-<ident>`` (``ident``: the checkpoint's id, up
    to 40 hex digits; by default one made of the time and the process id). Older
    checkpoints and leftover staging directories are removed afterwards. ``fsync=False``
    skips the fsyncs (safe if the process dies, not if the machine loses power).
    """
    name = f"{_LIVE}{ident}" if ident else f"{_LIVE}{time.time_ns():x}{os.getpid():x}"
    if not _LIVE_NAME.fullmatch(name):
        raise ValueError(f"ident: expected up to 40 hex digits, got {ident!r:.60}")
    live = path / name
    pointer = path / f".{CURRENT}.{os.getpid():x}"
    try:
        os.rename(staging, live)
        fsync_dir(path, fsync)
        with open(pointer, "w", encoding="utf-8") as f:
            f.write(name + "\n")
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(pointer, path / CURRENT)  # the single atomic switch
    except BaseException:  # the previous checkpoint is still live: drop the new one
        for leftover in (staging, live):
            shutil.rmtree(leftover, ignore_errors=True)
        pointer.unlink(missing_ok=True)
        raise
    # from here the new checkpoint is live; an error below says it may not be durable yet
    fsync_dir(path, fsync)
    for child in path.iterdir():
        if child.name not in (CURRENT, name) and _ours(child.name):
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    return live


def live_dir(path: Path) -> Path:
    """The live checkpoint directory of ``path`` (named by its ``CURRENT`` file).

    Neither ``CURRENT`` nor the live directory may be a symlink: a checkpoint never reaches
    outside ``path``.
    """
    pointer = path / CURRENT
    if pointer.is_symlink():
        raise CheckpointError(f"{pointer}: a symlink; checkpoint files may not be symlinks")
    if not pointer.is_file():
        raise CheckpointError(f"{str(path)!r} is not an rbdata checkpoint: no {CURRENT} file")
    try:
        with open_nofollow(pointer, "rb") as f:
            name = f.read(256).decode("utf-8").strip()
    except (OSError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"{pointer}: corrupt ({err})") from err
    if not _LIVE_NAME.fullmatch(name):
        raise CheckpointError(f"{pointer}: names {name[:80]!r}, not a checkpoint subdirectory")
    live = path / name
    if live.is_symlink():
        raise CheckpointError(f"{live}: a symlink; checkpoint directories may not be symlinks")
    if not live.is_dir():
        raise CheckpointError(f"{pointer}: names {name!r}, which is missing")
    return live


def _pointer(path: Path) -> str | None:
    """The name ``CURRENT`` holds now (``None`` if it cannot be read)."""
    try:
        with open_nofollow(path / CURRENT, "rb") as f:
            return f.read(256).decode("utf-8").strip()
    except (OSError, ValueError):
        return None


def read_live(path: Path, read: Callable[[Path], T]) -> T:
    """``read(live)`` on the live directory of ``path``; again if ``CURRENT`` moved meanwhile.

    A ``dumps`` in another process that publishes while ``read`` runs removes the directory
    being read: ``read`` fails (a missing file, most often). If ``CURRENT`` then names
    another directory, ``read`` runs again on that one, so a reader gets one whole
    generation, old or new, and an error only for a checkpoint that is itself broken.

    Raises:
        CheckpointError: what :func:`live_dir` raises; or ``CURRENT`` moved during each of
            100 reads in a row (the message says so).
        Exception: what ``read`` raised, while ``CURRENT`` still names the same directory.
    """
    for _ in range(_READ_TRIES):
        seen = _pointer(path)
        try:
            return read(live_dir(path))
        except Exception:
            now = _pointer(path)
            if seen is None or now is None or now == seen:
                raise
    raise CheckpointError(
        f"{str(path)!r}: the checkpoint changed during each of {_READ_TRIES} reads in a row "
        "(another process dumps to it continuously); load it when the writer pauses"
    )
