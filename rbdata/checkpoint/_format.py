"""The checkpoint format's names, torch-free (``rbdata inspect`` recognises checkpoints by them)."""

from __future__ import annotations

__all__ = ["FORMAT", "FORMAT_VERSION", "META_FILE", "STATE_FORMAT", "TENSORS"]

#: the version written to ``checkpoint.json``; loading refuses any other
FORMAT_VERSION = 1
FORMAT = "rbdata.checkpoint"
STATE_FORMAT = "rbdata.replay_buffer"
#: the file of a checkpoint's live directory that marks it (format, classes, configs, states)
META_FILE = "checkpoint.json"
TENSORS = "tensors.bin"
