"""rbdata: replay buffers and offline RL datasets as first-class PyTorch datasets.

Storages are map-style :class:`torch.utils.data.Dataset` s, samplers are
:class:`torch.utils.data.Sampler` s, writers choose slots, and :class:`ReplayBuffer`
composes them.
"""

from rbdata import errors, samplers, storages, transforms, writers
from rbdata.buffer import ReplayBuffer
from rbdata.errors import EmptyBufferError, MissingExtraError, ReadOnlyError
from rbdata.samplers import (
    BatchSampler,
    PrioritizedSampler,
    SamplerWithoutReplacement,
    SliceSampler,
    UniformSampler,
)
from rbdata.storages import ArrowStorage, ListStorage, MemmapStorage, TensorStorage
from rbdata.transforms import HindsightRelabel
from rbdata.writers import ImmutableWriter, MaxValueWriter, RoundRobinWriter

__version__ = "0.1.0"

__all__ = [
    "BatchSampler",
    "EmptyBufferError",
    "HindsightRelabel",
    "ImmutableWriter",
    "ArrowStorage",
    "ListStorage",
    "MaxValueWriter",
    "MemmapStorage",
    "MissingExtraError",
    "PrioritizedSampler",
    "ReadOnlyError",
    "ReplayBuffer",
    "RoundRobinWriter",
    "SamplerWithoutReplacement",
    "SliceSampler",
    "TensorStorage",
    "UniformSampler",
    "__version__",
    "errors",
    "samplers",
    "storages",
    "transforms",
    "writers",
]
