"""Transforms of sampled batches: hindsight goal relabeling and n-step returns.

Both read an episode index of the storage they sample from.

A transform is a callable on a sampled batch, given to a buffer as
``ReplayBuffer(storage, sampler=..., transform=...)``.
"""

from rbdata.transforms.episodes import EpisodeIndex
from rbdata.transforms.hindsight import HindsightRelabel
from rbdata.transforms.nstep import NStepReturn

__all__ = ["EpisodeIndex", "HindsightRelabel", "NStepReturn"]
