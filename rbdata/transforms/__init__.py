"""Transforms of sampled batches: hindsight goal relabeling, n-step returns, and the episode
index they read.

A transform is a callable on a sampled batch, given to a buffer as
``ReplayBuffer(storage, sampler=..., transform=...)``.
"""

from rbdata.transforms.episodes import EpisodeIndex
from rbdata.transforms.hindsight import HindsightRelabel
from rbdata.transforms.nstep import NStepReturn

__all__ = ["EpisodeIndex", "HindsightRelabel", "NStepReturn"]
