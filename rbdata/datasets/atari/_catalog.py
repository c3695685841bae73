"""The DQN Replay Dataset catalog (games, runs, checkpoints, files, URLs) and its ``list`` rows.

The data lives in the top-level ``datasets/atari-dqn.tsv`` (shipped in the wheel, located
through :func:`rbdata._core.resources.catalog_path`); its provenance is in ``datasets/README.md``.
The DQN Replay Dataset (Agarwal et al., 2020) publishes, for each game and run, the replay
buffer of a DQN agent logged by Dopamine every time it filled, under
``<prefix><Game>/<run>/replay_logs/``: one file per array and checkpoint suffix ``N``, named
by Dopamine's ``OutOfGraphReplayBuffer._generate_filename`` as ``<name>_ckpt.<N>.gz``, where
``<name>`` is ``$store$_observation``, ``$store$_action``, ``$store$_reward``,
``$store$_terminal`` (the buffer's arrays, ``STORE_FILENAME_PREFIX`` + the key) and
``add_count``, ``invalid_range`` (its public attributes).

An entry of the cache is one game, one run and a set of checkpoints, named
``<Game>/<run>/<checkpoints>``: the checkpoints in increasing order, runs of consecutive ones
written ``a-b``, the others joined by ``+`` (``50``, ``40-50``, ``1+5+7-9``:
:func:`checkpoint_spec`). On the command line an id is ``atari-dqn/<Game>/<run>`` (checkpoint 50)
or ``atari-dqn/<Game>/<run>/<checkpoints>``, so ``atari-dqn/Pong/1`` is the entry ``Pong/1/50``.
:func:`atari_rows` (``rbdata datasets list``) reads the catalog and the cache's folders only.

This module imports neither torch nor numpy: ``rbdata datasets list`` reads it alone.
"""

from __future__ import annotations

import csv
import difflib
import functools
import os
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rbdata._core.resources import catalog_path

__all__ = [
    "ATARI_DQN_PREFIX",
    "AtariGame",
    "AtariSource",
    "BACKEND",
    "DEFAULT_CHECKPOINTS",
    "FAMILY",
    "ROLES",
    "atari_catalog",
    "atari_download_path",
    "atari_game",
    "atari_id",
    "atari_rows",
    "atari_source",
    "checkpoint_spec",
    "parse_checkpoints",
]


#: The URL prefix of every file (the public bucket ``gs://atari-replay-datasets/dqn/``);
#: ``RBDATA_ATARI_DQN_MIRROR`` replaces it.
ATARI_DQN_PREFIX = "https://storage.googleapis.com/atari-replay-datasets/dqn/"
FAMILY = "atari-dqn"
#: the backend of every entry: the kind of storage ``_convert.new_storage`` writes
BACKEND = "frames"
#: What ``AtariDQN(game, run)`` and the id ``atari-dqn/<Game>/<run>`` read.
DEFAULT_CHECKPOINTS = (50,)
#: A checkpoint's files: role -> Dopamine's name before ``_ckpt.<N>.gz``.
ROLES = {
    "observation": "$store$_observation",
    "action": "$store$_action",
    "reward": "$store$_reward",
    "terminal": "$store$_terminal",
    "add_count": "add_count",
    "invalid_range": "invalid_range",
}

_COLUMNS = ["game", "runs", "checkpoints"]


def _numbers(text: str, what: str) -> tuple[int, ...]:
    """``"1-5"`` -> (1, 2, 3, 4, 5); ``"1+3"`` -> (1, 3)."""
    out: list[int] = []
    for part in text.split("+"):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"{what}: {text!r} is not a list of numbers (e.g. 50, 40-50, 1+5)")
        a, b = int(low), int(high) if sep else int(low)
        if b < a:
            raise ValueError(f"{what}: {text!r} has a decreasing range {part!r}")
        out.extend(range(a, b + 1))
    return tuple(sorted(set(out)))


@dataclass(frozen=True)
class AtariGame:
    """One game of the catalog.

    Attributes:
        game: the name in the bucket, e.g. ``"Pong"``.
        runs: the runs published (``1..5``).
        checkpoints: the checkpoint suffixes of each run (``0..50``).
    """

    game: str
    runs: tuple[int, ...]
    checkpoints: tuple[int, ...]


@functools.lru_cache(maxsize=1)
def atari_catalog() -> dict[str, AtariGame]:
    """Every game of the catalog, keyed by name, in alphabetical order.

    Examples:
        >>> catalog = atari_catalog()
        >>> len(catalog), catalog["Pong"].runs, catalog["Pong"].checkpoints[-1]
        (60, (1, 2, 3, 4, 5), 50)
    """
    path = catalog_path("atari-dqn.tsv")
    games: dict[str, AtariGame] = {}
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader)
        if header != _COLUMNS:
            raise ValueError(f"{path}: expected the columns {_COLUMNS}, got {header}")
        for row in reader:
            if len(row) != len(_COLUMNS):
                raise ValueError(f"{path}: a row of {len(row)} fields: {row}")
            games[row[0]] = AtariGame(
                row[0], _numbers(row[1], f"{path} runs"), _numbers(row[2], f"{path} checkpoints")
            )
    return games


def atari_game(name: str) -> AtariGame:
    """The catalog entry of game ``name`` (case-sensitive, as in the bucket).

    Raises:
        KeyError: an unknown game; the message suggests the closest names.

    Examples:
        >>> atari_game("Breakout").game
        'Breakout'
        >>> atari_game("pong")
        Traceback (most recent call last):
        ...
        rbdata.errors.MissingKeyError: unknown DQN Replay game 'pong'; did you mean 'Pong'?
    """
    catalog = atari_catalog()
    if name in catalog:
        return catalog[name]
    lower = {g.lower(): g for g in catalog}
    close = [lower[name.lower()]] if name.lower() in lower else []
    close = close or difflib.get_close_matches(name, list(catalog), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(map(repr, close))}?" if close else "see `rbdata datasets list`"
    from rbdata.errors import MissingKeyError  # here: the catalog imports the stdlib only

    raise MissingKeyError(f"unknown DQN Replay game {name!r}; {hint}")


def checkpoint_spec(checkpoints: Iterable[int]) -> str:
    """The name of a set of checkpoints: increasing, consecutive ones as ``a-b``, joined by ``+``.

    Examples:
        >>> checkpoint_spec([50]), checkpoint_spec(range(40, 51)), checkpoint_spec([9, 1, 5, 7, 8])
        ('50', '40-50', '1+5+7-9')
    """
    numbers = sorted(set(checkpoints))
    parts: list[str] = []
    start = 0
    for i in range(1, len(numbers) + 1):
        if i == len(numbers) or numbers[i] != numbers[i - 1] + 1:
            a, b = numbers[start], numbers[i - 1]
            parts.append(str(a) if a == b else f"{a}-{b}")
            start = i
    return "+".join(parts)


def parse_checkpoints(text: str) -> tuple[int, ...]:
    """The checkpoints a name of :func:`checkpoint_spec` stands for.

    Raises:
        ValueError: not such a name.

    Examples:
        >>> parse_checkpoints("1+5+7-9")
        (1, 5, 7, 8, 9)
    """
    return _numbers(text, "checkpoints")


@dataclass(frozen=True)
class AtariSource:
    """The files of one entry: a game, a run and checkpoints (see :func:`atari_source`).

    Attributes:
        game: the game's name in the bucket.
        run: the run, 1 to 5.
        checkpoints: the checkpoint suffixes, increasing.
    """

    game: str
    run: int
    checkpoints: tuple[int, ...]

    #: never an rbdata sample: every file is in the public bucket (as a D4RL entry's is_sample)
    is_sample = False
    #: the bucket publishes no sha256; sizes vary by file (a catalog entry's size and sha256)
    size = None
    sha256 = None

    @property
    def id(self) -> str:
        """The entry's name in the cache and after ``atari-dqn/`` on the command line.

        Examples:
            >>> atari_source("Pong", 2, (49, 50)).id
            'Pong/2/49-50'
        """
        return f"{self.game}/{self.run}/{checkpoint_spec(self.checkpoints)}"

    @property
    def folder(self) -> str:
        """The files' folder below the bucket's prefix (and below a mirror)."""
        return f"{self.game}/{self.run}/replay_logs/"

    @property
    def url(self) -> str:
        """The files' folder in the public bucket."""
        return ATARI_DQN_PREFIX + self.folder

    def files(self, checkpoint: int) -> dict[str, str]:
        """The file names of ``checkpoint``, by role (the keys of :data:`ROLES`).

        Examples:
            >>> atari_source("Pong").files(50)["observation"]
            '$store$_observation_ckpt.50.gz'
        """
        return {role: f"{name}_ckpt.{checkpoint}.gz" for role, name in ROLES.items()}

    def file_url(self, name: str) -> str:
        """The URL of file ``name`` in the bucket (``$`` escaped as ``%24``).

        Examples:
            >>> url = atari_source("Pong").file_url("$store$_action_ckpt.50.gz")
            >>> url[len(ATARI_DQN_PREFIX) :]
            'Pong/1/replay_logs/%24store%24_action_ckpt.50.gz'
        """
        return self.url + urllib.parse.quote(name)


def atari_source(
    game: str, run: int = 1, checkpoints: int | Iterable[int] = DEFAULT_CHECKPOINTS
) -> AtariSource:
    """Check a game, a run and checkpoints against the catalog.

    Raises:
        KeyError: an unknown game.
        ValueError: a run or a checkpoint the catalog does not have, or no checkpoint.

    Examples:
        >>> atari_source("Pong", 1, 50)
        AtariSource(game='Pong', run=1, checkpoints=(50,))
        >>> atari_source("Pong", 6)
        Traceback (most recent call last):
        ...
        ValueError: run: expected one of 1-5 for 'Pong', got 6
    """
    entry = atari_game(game)
    if isinstance(run, bool) or not isinstance(run, int) or run not in entry.runs:
        raise ValueError(
            f"run: expected one of {checkpoint_spec(entry.runs)} for {game!r}, got {run!r}"
        )
    numbers: list[Any] = [checkpoints] if isinstance(checkpoints, int) else list(checkpoints)
    bad = [c for c in numbers if isinstance(c, bool) or not isinstance(c, int)]
    bad += [c for c in numbers if c not in bad and c not in entry.checkpoints]
    if bad or not numbers:
        raise ValueError(
            f"checkpoints: expected checkpoints among {checkpoint_spec(entry.checkpoints)}, "
            f"got {bad or 'none'}"
        )
    return AtariSource(entry.game, run, tuple(sorted(set(numbers))))


def atari_id(name: str) -> AtariSource:
    """The entry a command-line name stands for: ``<Game>/<run>[/<checkpoints>]``.

    Raises:
        KeyError: an unknown game.
        ValueError: a malformed name, or a run or checkpoint the catalog does not have.

    Examples:
        >>> atari_id("Pong/1").id, atari_id("Breakout/3/40-50").checkpoints[:2]
        ('Pong/1/50', (40, 41))
    """
    parts = name.split("/")
    if len(parts) not in (2, 3) or not parts[1].isdigit():
        raise ValueError(
            f"{name!r} is not a DQN Replay id: expected <Game>/<run>[/<checkpoints>], "
            "e.g. Pong/1 or Pong/1/40-50"
        )
    checkpoints = parse_checkpoints(parts[2]) if len(parts) == 3 else DEFAULT_CHECKPOINTS
    return atari_source(parts[0], int(parts[1]), checkpoints)


def atari_download_path(root: Path, source: AtariSource, name: str) -> Path:
    """Where file ``name`` of ``source`` is downloaded below the cache root ``root``.

    Examples:
        >>> path = atari_download_path(Path("/c"), atari_source("Pong"), "add_count_ckpt.50.gz")
        >>> path.as_posix()
        '/c/atari-dqn/downloads/Pong/1/replay_logs/add_count_ckpt.50.gz'
    """
    return root / FAMILY / "downloads" / source.game / str(source.run) / "replay_logs" / name


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
