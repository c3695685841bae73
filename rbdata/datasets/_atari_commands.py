"""``rbdata datasets ...`` for the ``atari-dqn/`` family: its rows of ``list``, its download.

An id is ``atari-dqn/<Game>/<run>`` (checkpoint 50) or ``atari-dqn/<Game>/<run>/<checkpoints>``
(``40-50``, ``1+5+7-9``: :func:`~rbdata.datasets._atari_catalog.checkpoint_spec`); the cache
names every entry by its checkpoints, so ``atari-dqn/Pong/1`` is the entry ``Pong/1/50``. The
listing reads the catalog and the cache's folders only (no torch, no data).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rbdata.datasets._atari_catalog import (
    BACKEND,
    ROLES,
    atari_catalog,
    atari_download_path,
    atari_id,
    atari_source,
)

__all__ = ["atari_rows", "open_atari"]


def _downloaded(folder: Path) -> list[int]:
    """The checkpoints whose six files are all in ``folder``."""
    try:
        names = set(os.listdir(folder))
    except OSError:
        return []
    found: dict[int, int] = {}
    for name in names:
        head, sep, tail = name.partition("_ckpt.")
        if sep and head in ROLES.values() and tail.endswith(".gz") and tail[:-3].isdigit():
            found[int(tail[:-3])] = found.get(int(tail[:-3]), 0) + 1
    return sorted(k for k, n in found.items() if n == len(ROLES))


def atari_rows(
    root: Path, cached: dict[str, list[str]], downloaded: bool
) -> list[tuple[str, str, str, str]]:
    """The ``list`` rows: one per game and run (``ID SIZE FILES CONVERTED``).

    ``FILES`` counts the checkpoints whose files are all downloaded; ``CONVERTED`` names the
    checkpoint sets converted (``cached``: the family's entries, name -> backends).

    Examples:
        >>> rows = atari_rows(Path("/nonexistent"), {"Pong/1/50": ["memmap"]}, False)
        >>> len(rows), rows[0][0], [r for r in rows if r[0] == "atari-dqn/Pong/1"]
        (300, 'atari-dqn/AirRaid/1', [('atari-dqn/Pong/1', '?', 'remote', '50')])
    """
    converted: dict[str, list[str]] = {}
    for name in cached:
        game_run, _, spec = name.rpartition("/")
        converted.setdefault(game_run, []).append(spec)
    rows = []
    for game in atari_catalog().values():
        for run in game.runs:
            folder = atari_download_path(root, atari_source(game.game, run), "x").parent
            files = _downloaded(folder) if folder.is_dir() else []
            specs = converted.get(f"{game.game}/{run}", [])
            if downloaded and not (files or specs):
                continue
            where = f"{len(files)} ckpt{'s' if len(files) != 1 else ''}" if files else "remote"
            rows.append((f"atari-dqn/{game.game}/{run}", "?", where, ",".join(specs) or "-"))
    return rows


def open_atari(
    root: Path, name: str, *, backend: str, url: str | None, sha256: str | None, file: str | None
) -> Any:
    """``rbdata datasets download atari-dqn/<name>``: the converted dataset, opened.

    Raises:
        ValueError: ``--url`` or ``--sha256`` (not for this family), or another backend.
    """
    if url is not None or sha256 is not None:
        raise ValueError(
            "--url and --sha256 do not apply to atari-dqn ids (many files each): set "
            "RBDATA_ATARI_DQN_MIRROR to a mirror (a URL or a file:// folder), or pass "
            "--file DIR (a folder of the files); in Python, AtariDQN(..., sha256={name: hex})"
        )
    if backend != BACKEND:
        raise ValueError(f"--backend: atari-dqn entries are stored as {BACKEND}, not {backend}")
    from rbdata.datasets.atari import AtariDQN

    source = atari_id(name)
    return AtariDQN(source.game, source.run, source.checkpoints, root, file=file, progress=True)
