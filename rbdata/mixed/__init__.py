"""Mixtures of sources: batches drawn from offline datasets and live buffers in set proportions.

:class:`MixedBuffer` joins offline datasets (:class:`~rbdata.datasets.D4RL`,
:class:`~rbdata.datasets.Minari`), live :class:`~rbdata.ReplayBuffer` s and storages: each
batch of ``B`` takes exactly :func:`largest_remainder` ``(weights, B)`` items from the
sources, each drawn by its own sampler (RLPD's symmetric sampling, offline-to-online
fine-tuning). :class:`MixedSampler` is its sampler over combined indices and
:class:`MixedDataset` its map-style view, for ``DataLoader``. See
``docs/offline_to_online.md``.
"""

from rbdata.mixed._batch import fill_extras
from rbdata.mixed._counts import check_weights, largest_remainder
from rbdata.mixed.buffer import MixedBuffer
from rbdata.mixed.dataset import MixedDataset
from rbdata.mixed.sampler import MixedSampler

__all__ = [
    "MixedBuffer",
    "MixedDataset",
    "MixedSampler",
    "check_weights",
    "fill_extras",
    "largest_remainder",
]
