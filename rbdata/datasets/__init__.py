"""Offline RL datasets (D4RL, Minari, OGBench, DQN Replay) as downloadable, cached buffers.

Each dataset is converted once into a memory-mapped storage under a cache root (``root=``,
else ``$RBDATA_HOME``, else the user cache directory) and is then both a map-style
:class:`torch.utils.data.Dataset` and a read-only replay buffer. See ``docs/datasets.md``.

Besides the datasets, this package exports what the command line (``rbdata datasets ...``,
``rbdata inspect``, ``rbdata demo``) uses of it: the D4RL catalog (:func:`d4rl_entry`), the
cache (:func:`cache_root`, :func:`read_entry`, :data:`DATASET_FILE`, :data:`STORAGE_DIR`)
and one function per ``rbdata datasets`` action (:func:`list_command`...), which prints its
report and returns the exit status. The command functions import no torch; the datasets
(:class:`D4RL`, :class:`Minari`, :class:`OGBench`, :class:`AtariDQN`,
:class:`OfflineDataset`) are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rbdata._core.lazy import lazy_names
from rbdata.datasets import _cache
from rbdata.datasets._cache import cache_root, family_backend, read_entry
from rbdata.datasets._catalog import D4RLEntry, d4rl_entry
from rbdata.datasets._commands import (
    DatasetRef,
    download_command,
    error_line,
    human_size,
    list_command,
    parse_id,
    path_command,
    sample_command,
    write_sample,
)
from rbdata.datasets._entries import info_command, remove_command
from rbdata.errors import ChecksumError, DownloadError

if TYPE_CHECKING:  # the datasets import torch: on first use (see __getattr__)
    from rbdata.datasets.atari import AtariDQN
    from rbdata.datasets.base import OfflineDataset
    from rbdata.datasets.d4rl import D4RL
    from rbdata.datasets.minari import Minari
    from rbdata.datasets.ogbench import OGBench

__all__ = [
    "D4RL",
    "DATASET_FILE",
    "STORAGE_DIR",
    "AtariDQN",
    "ChecksumError",
    "D4RLEntry",
    "DatasetRef",
    "DownloadError",
    "Minari",
    "OGBench",
    "OfflineDataset",
    "cache_root",
    "d4rl_entry",
    "download_command",
    "error_line",
    "family_backend",
    "human_size",
    "info_command",
    "list_command",
    "parse_id",
    "path_command",
    "read_entry",
    "remove_command",
    "sample_command",
    "write_sample",
]

#: the metadata file of a converted dataset's cache entry (what :func:`read_entry` reads)
DATASET_FILE = _cache.DATASET_FILE
#: the entry's storage directory, next to :data:`DATASET_FILE`
STORAGE_DIR = _cache.STORAGE_DIR

#: the dataset classes (they import torch) → their modules, imported on first use
_LAZY = {
    "AtariDQN": "rbdata.datasets.atari",
    "D4RL": "rbdata.datasets.d4rl",
    "Minari": "rbdata.datasets.minari",
    "OGBench": "rbdata.datasets.ogbench",
    "OfflineDataset": "rbdata.datasets.base",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
