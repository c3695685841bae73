"""``OfflineDataset``: a converted dataset in the cache, as a map-style dataset *and* a buffer.

An offline dataset is a read-only :class:`~rbdata.ReplayBuffer` over a memory-mapped storage
(:class:`~rbdata.storages.MemmapStorage` or :class:`~rbdata.storages.ArrowStorage`) plus the
metadata of its source. ``len``, ``ds[i]`` and the batched ``__getitems__`` make it a map-style
:class:`torch.utils.data.Dataset` (``DataLoader(ds, batch_size=256, shuffle=True)`` gathers
each batch in one read); ``sample``, iteration and ``sampler=`` give the buffer's semantics.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from rbdata.buffer import ReplayBuffer
from rbdata.datasets._cache import STORAGE_DIR, read_entry
from rbdata.errors import ReadOnlyError
from rbdata.samplers.base import Sampler
from rbdata.storages import wrap_for_collate
from rbdata.storages.arrow import ArrowStorage
from rbdata.storages.base import Storage
from rbdata.storages.frames import FrameStackStorage
from rbdata.storages.memmap import MemmapStorage
from rbdata.writers.immutable import ImmutableWriter

__all__ = ["OfflineDataset"]


def _open_storage(entry: Path, backend: str) -> Storage:
    """The entry's storage, opened read-only: no file in the entry is opened for writing.

    A converted entry never changes, and may sit on a read-only file system (a shared cluster
    cache, a container image): a memmap storage is opened ``read_only`` (mapped
    copy-on-write, writes refused, pickled as its path), an Arrow storage as a reading copy
    (no journal; closing it writes nothing).
    """
    path = entry / STORAGE_DIR
    if path.is_symlink() or not path.is_dir():
        raise FileNotFoundError(f"{entry}: no storage directory")
    if backend == "memmap":
        return MemmapStorage.open(path, read_only=True)
    if backend == "arrow":
        return ArrowStorage.open(path, recover=False)
    if backend == "frames":
        return FrameStackStorage.open(path, read_only=True)
    raise ValueError(f"{entry}: unknown backend {backend!r}")


class OfflineDataset(Dataset[Any]):
    """A converted offline dataset: read-only items, metadata and a sampler.

    Use :class:`~rbdata.datasets.D4RL` or :class:`~rbdata.datasets.Minari` to download and
    convert; :meth:`open` reopens a converted entry by its directory.

    Args:
        path: a converted entry's directory (it holds ``dataset.json`` and ``storage/``).
        sampler: the sampler of :meth:`sample` and iteration (default: uniform with
            replacement). Any rbdata sampler works, e.g.
            :class:`~rbdata.samplers.SliceSampler` (``traj_key="episode"``) or
            :class:`~rbdata.samplers.PrioritizedSampler`.
        batch_size: default batch size of :meth:`sample` and iteration.
        transform: applied to batches of :meth:`sample` and iteration (not to ``ds[i]`` or
            ``__getitems__``).

    Pickling (``DataLoader`` workers) sends the entry's path and the batch size: the receiving
    process maps the same files (nothing is copied) with a default sampler.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        sampler: Sampler | None = None,
        batch_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        entry = Path(path)
        self._info = read_entry(entry)
        self._path = entry
        storage = _open_storage(entry, str(self._info.get("backend")))
        expected = self._info.get("transitions")
        if len(storage) != expected:
            raise ValueError(
                f"{entry}: the storage holds {len(storage)} transitions, dataset.json says "
                f"{expected}; remove the entry and convert again"
            )
        self.buffer = ReplayBuffer(
            storage, sampler, ImmutableWriter(), transform=transform, batch_size=batch_size
        )

    @classmethod
    def open(cls, path: str | os.PathLike[str], **kwargs: Any) -> OfflineDataset:
        """Open the converted entry at ``path`` (no network, no conversion)."""
        self = OfflineDataset.__new__(OfflineDataset)
        OfflineDataset.__init__(self, path, **kwargs)
        return self

    # --- what it is ------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The entry's directory in the cache."""
        return self._path

    @property
    def storage(self) -> Storage:
        """The rbdata storage holding the transitions."""
        return self.buffer.storage

    @property
    def sampler(self) -> Any:
        """The sampler of :meth:`sample` and iteration."""
        return self.buffer.sampler

    @property
    def batch_size(self) -> int | None:
        """The default batch size."""
        return self.buffer.batch_size

    @property
    def metadata(self) -> dict[str, Any]:
        """The source's metadata (D4RL ``metadata/*``, Minari dataset metadata), from JSON."""
        return dict(self._info.get("metadata", {}))

    @property
    def info(self) -> dict[str, Any]:
        """Everything ``dataset.json`` records (id, backend, counts, source URL, sha256...)."""
        return dict(self._info)

    @property
    def num_episodes(self) -> int:
        """Number of episodes (a last, unfinished one included)."""
        return int(self._info.get("episodes", 0))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self._info.get('id')!r}, transitions={len(self)}, "
            f"episodes={self.num_episodes}, backend={self._info.get('backend')!r})"
        )

    # --- map-style dataset -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.buffer.storage)

    def __getitem__(self, index: Any) -> Any:
        return self.buffer.storage[index]

    def __getitems__(self, indices: Any) -> Any:
        """The items at ``indices`` as one batch, gathered in one read (see storages)."""
        batch = self.buffer.storage.__getitems__(indices)
        return wrap_for_collate(batch, sys._getframe(1))

    # --- buffer ------------------------------------------------------------------------------
    def sample(self, batch_size: int | None = None) -> Any:
        """Draw one batch with the sampler (see :meth:`rbdata.ReplayBuffer.sample`)."""
        return self.buffer.sample(batch_size)

    def __iter__(self) -> Iterator[Any]:
        """Batches of ``batch_size``: endless, or one epoch for epoch samplers."""
        return iter(self.buffer)

    def update_priority(self, index: Any, priority: Any) -> None:
        """Set priorities of items (with a :class:`~rbdata.samplers.PrioritizedSampler`)."""
        self.buffer.update_priority(index, priority)

    def add(self, item: Any) -> int:
        """Raise :class:`~rbdata.errors.ReadOnlyError`: offline datasets are read-only."""
        raise ReadOnlyError(f"{type(self).__name__} is read-only: add is not allowed")

    def extend(self, data: Any) -> torch.Tensor:
        """Raise :class:`~rbdata.errors.ReadOnlyError`: offline datasets are read-only."""
        raise ReadOnlyError(f"{type(self).__name__} is read-only: extend is not allowed")

    # --- scores ------------------------------------------------------------------------------
    def normalized_score(self, returns: Any) -> Any:
        """``(returns - ref_min) / (ref_max - ref_min)``, D4RL's normalized score (x100 in papers).

        Args:
            returns: an episode return: a float, a list, a numpy array or a tensor.

        Returns:
            A float for a number, an array for a list or an array, a tensor for a tensor.

        Raises:
            ValueError: the dataset has no reference scores.
        """
        lo, hi = self._info.get("ref_min_score"), self._info.get("ref_max_score")
        if lo is None or hi is None or not math.isfinite(hi - lo) or hi == lo:
            raise ValueError(
                f"{self._info.get('id')!r} has no reference scores (ref_min_score={lo}, "
                f"ref_max_score={hi}): no normalized score"
            )
        if isinstance(returns, torch.Tensor):
            return (returns - lo) / (hi - lo)
        if isinstance(returns, numbers.Real) and not isinstance(returns, bool):
            return (float(returns) - lo) / (hi - lo)
        if isinstance(returns, (list, tuple, np.ndarray)):
            return (np.asarray(returns, dtype=np.float64) - lo) / (hi - lo)
        raise TypeError(
            f"returns: expected a number, list, array or tensor, got {type(returns).__name__}"
        )

    # --- pickling: by reference --------------------------------------------------------------
    def __reduce__(self) -> Any:
        return (_reopen, (str(self._path), self.buffer.batch_size))

    def close(self) -> None:
        """Unmap the storage's files (the entry stays in the cache)."""
        close = getattr(self.buffer.storage, "close", None)
        if close is not None:
            close()


def _reopen(path: str, batch_size: int | None) -> OfflineDataset:
    return OfflineDataset.open(path, batch_size=batch_size)
