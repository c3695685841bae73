"""rbdata: replay buffers and offline RL datasets as first-class PyTorch datasets.

Storages are map-style :class:`torch.utils.data.Dataset` s, samplers are
:class:`torch.utils.data.Sampler` s, writers choose slots, and :class:`ReplayBuffer`
composes them.

The names below are imported on first use (``rbdata.ReplayBuffer``, ``from rbdata import
TensorStorage``): ``import rbdata`` alone does not import torch, so the ``rbdata`` command's
help and ``rbdata datasets list`` start in a fraction of torch's import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rbdata import errors
from rbdata._core.lazy import lazy_names
from rbdata.errors import EmptyBufferError, MissingExtraError, ReadOnlyError, StorageInUseError

if TYPE_CHECKING:  # what the lazy names below are, for type checkers
    from rbdata import samplers, storages, transforms, writers
    from rbdata.buffer import ReplayBuffer
    from rbdata.mixed import MixedBuffer
    from rbdata.samplers import (
        BatchSampler,
        PrioritizedSampler,
        PrioritizedSliceSampler,
        SamplerWithoutReplacement,
        SequenceSampler,
        SliceSampler,
        SliceSamplerWithoutReplacement,
        UniformSampler,
    )
    from rbdata.storages import (
        ArrowStorage,
        ListStorage,
        MemmapStorage,
        TensorStorage,
        tensordict_collate,
    )
    from rbdata.transforms import HindsightRelabel, NStepReturn
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
    "MixedBuffer",
    "MissingExtraError",
    "NStepReturn",
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "ReadOnlyError",
    "ReplayBuffer",
    "RoundRobinWriter",
    "SamplerWithoutReplacement",
    "SequenceSampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "StorageInUseError",
    "TensorStorage",
    "UniformSampler",
    "__version__",
    "errors",
    "samplers",
    "storages",
    "tensordict_collate",
    "transforms",
    "writers",
]

#: each lazy name → the module that defines it (a subpackage stands for itself)
_LAZY = {
    "ReplayBuffer": "rbdata.buffer",
    "MixedBuffer": "rbdata.mixed",
    "HindsightRelabel": "rbdata.transforms",
    "NStepReturn": "rbdata.transforms",
    **dict.fromkeys(
        (
            "BatchSampler",
            "PrioritizedSampler",
            "PrioritizedSliceSampler",
            "SamplerWithoutReplacement",
            "SequenceSampler",
            "SliceSampler",
            "SliceSamplerWithoutReplacement",
            "UniformSampler",
        ),
        "rbdata.samplers",
    ),
    **dict.fromkeys(
        (
            "ArrowStorage",
            "ListStorage",
            "MemmapStorage",
            "TensorStorage",
            "tensordict_collate",
        ),
        "rbdata.storages",
    ),
    **dict.fromkeys(("ImmutableWriter", "MaxValueWriter", "RoundRobinWriter"), "rbdata.writers"),
    "samplers": "rbdata.samplers",
    "storages": "rbdata.storages",
    "transforms": "rbdata.transforms",
    "writers": "rbdata.writers",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
