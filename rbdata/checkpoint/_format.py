"""The checkpoint format's names, torch-free (``rbdata inspect`` recognises checkpoints by them)."""

from __future__ import annotations

__all__ = [
    "ALIGN",
    "BUILTIN",
    "DIR",
    "FORMAT",
    "FORMAT_VERSION",
    "MARK",
    "META_FILE",
    "STATE_FORMAT",
    "TENSORS",
]

#: the version written to ``checkpoint.json``; loading refuses any other
FORMAT_VERSION = 1
FORMAT = "rbdata.checkpoint"
STATE_FORMAT = "rbdata.replay_buffer"
#: the file of a checkpoint's live directory that marks it (format, classes, configs, states)
META_FILE = "checkpoint.json"
TENSORS = "tensors.bin"
#: the subdirectory of a checkpoint that holds the storage's files
DIR = "storage"
#: the key that marks an encoded value (a tensor, a dtype...) in ``checkpoint.json``
MARK = "$rb"
#: the alignment of each tensor in ``tensors.bin``
ALIGN = 64
#: rbdata's own classes by component kind: registered in every process (``_registry``)
BUILTIN = {
    "storage": (
        "TensorStorage",
        "MemmapStorage",
        "ArrowStorage",
        "ListStorage",
        "FrameStackStorage",
    ),
    "sampler": (
        "UniformSampler",
        "SamplerWithoutReplacement",
        "PrioritizedSampler",
        "PrioritizedSliceSampler",
        "SequenceSampler",
        "SliceSampler",
        "SliceSamplerWithoutReplacement",
    ),
    "writer": ("RoundRobinWriter", "ImmutableWriter", "MaxValueWriter"),
}
