"""Samplers: seeded, stateful :class:`torch.utils.data.Sampler` s of storage indices.

The names below are imported on first use, as :mod:`rbdata`'s are: ``import
rbdata.samplers.saved`` (what ``rbdata inspect`` shows of a saved sampler) imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rbdata._core.lazy import lazy_names

if TYPE_CHECKING:  # what the lazy names below are, for type checkers
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

#: each lazy name → the module that defines it
_LAZY = {
    "BatchSampler": "rbdata.samplers.base",
    "Sampler": "rbdata.samplers.base",
    "PrioritizedSampler": "rbdata.samplers.prioritized",
    "PrioritizedSliceSampler": "rbdata.samplers.prioritized_slice",
    "SequenceSampler": "rbdata.samplers.sequence",
    "SliceSampler": "rbdata.samplers.slice",
    "SliceSamplerWithoutReplacement": "rbdata.samplers.slice_without_replacement",
    "UniformSampler": "rbdata.samplers.uniform",
    "SamplerWithoutReplacement": "rbdata.samplers.without_replacement",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
