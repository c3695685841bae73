"""Samplers: seeded, stateful :class:`torch.utils.data.Sampler` s of storage indices."""

from rbdata.samplers.base import BatchSampler, Sampler
from rbdata.samplers.prioritized import PrioritizedSampler
from rbdata.samplers.prioritized_slice import PrioritizedSliceSampler
from rbdata.samplers.sequence import SequenceSampler
from rbdata.samplers.slice import SliceSampler
from rbdata.samplers.slice_without_replacement import SliceSamplerWithoutReplacement
from rbdata.samplers.uniform import UniformSampler
from rbdata.samplers.without_replacement import SamplerWithoutReplacement

__all__ = [
    "BatchSampler",
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "Sampler",
    "SamplerWithoutReplacement",
    "SequenceSampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "UniformSampler",
]
