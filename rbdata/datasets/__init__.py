"""Offline RL datasets (D4RL, Minari) as downloadable, checksummed, memory-mapped buffers.

Each dataset is converted once into a memory-mapped storage under a cache root (``root=``,
else ``$RBDATA_HOME``, else the user cache directory) and is then both a map-style
:class:`torch.utils.data.Dataset` and a read-only replay buffer. See ``docs/datasets.md``.
"""

from rbdata.datasets._errors import ChecksumError, DownloadError
from rbdata.datasets.base import OfflineDataset
from rbdata.datasets.d4rl import D4RL
from rbdata.datasets.minari import Minari

__all__ = ["D4RL", "ChecksumError", "DownloadError", "Minari", "OfflineDataset"]
