"""rbdata: replay buffers and offline RL datasets as first-class PyTorch datasets.

Storages are map-style :class:`torch.utils.data.Dataset` s, samplers are
:class:`torch.utils.data.Sampler` s, writers choose slots, and :class:`ReplayBuffer`
composes them.
"""

from rbdata import errors, samplers, storages, writers
from rbdata.buffer import ReplayBuffer
from rbdata.errors import EmptyBufferError, MissingExtraError, ReadOnlyError
from rbdata.samplers import (
    BatchSampler,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    UniformSampler,
)
from rbdata.storages import ArrowStorage, ListStorage, MemmapStorage, TensorStorage
from rbdata.writers import ImmutableWriter, MaxValueWriter, RoundRobinWriter

__version__ = "0.1.0"

__all__ = [
    "BatchSampler",
    "EmptyBufferError",
    "ImmutableWriter",
    "ArrowStorage",
    "ListStorage",
    "MaxValueWriter",
    "MemmapStorage",
    "MissingExtraError",
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "ReadOnlyError",
    "ReplayBuffer",
    "RoundRobinWriter",
    "SamplerWithoutReplacement",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "TensorStorage",
    "UniformSampler",
    "__version__",
    "errors",
    "samplers",
    "storages",
    "writers",
]
