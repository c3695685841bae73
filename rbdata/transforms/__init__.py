"""Transforms of sampled batches: hindsight goal relabeling and the episode index it reads.

A transform is a callable on a sampled batch, given to a buffer as
``ReplayBuffer(storage, sampler=..., transform=...)``.
"""

from rbdata.transforms.episodes import EpisodeIndex
from rbdata.transforms.hindsight import HindsightRelabel

__all__ = ["EpisodeIndex", "HindsightRelabel"]
