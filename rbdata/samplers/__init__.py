"""Samplers: seeded, stateful :class:`torch.utils.data.Sampler` s of storage indices.

The names below are imported on first use, as :mod:`rbdata`'s are: ``import
rbdata.samplers.saved`` (what ``rbdata inspect`` shows of a saved sampler) imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    """Import a lazy name on first use (PEP 562); it is a plain attribute afterwards."""
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'rbdata.samplers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
