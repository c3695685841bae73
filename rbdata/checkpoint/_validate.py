"""Up-front checks of everything a checkpoint's metadata says, before anything is built.

Every reader of a checkpoint goes through these helpers (the generic ones live in
:mod:`!rbdata._core.checked`, shared with the storages' own checks): JSON files are read without
following symlinks and refused when nested too deeply; every field is type- and range-checked
with Python integers (no overflow); file names are plain names inside their directory. A
failure raises :class:`~rbdata.errors.CheckpointError` naming the file and the field.
"""

from __future__ import annotations

from typing import Any

import torch

from rbdata._core.checked import (
    MAX_DEPTH,
    check_depth,
    check_int,
    get,
    get_dict,
    get_int,
    get_list,
    leaf_path,
    plain_file,
    read_json,
    read_small,
)
from rbdata.checkpoint._meta import read_checkpoint_meta
from rbdata.errors import CheckpointError
from rbdata.samplers.prioritized import PrioritizedSampler
from rbdata.samplers.prioritized_slice import PrioritizedSliceSampler
from rbdata.writers.max_value import MaxValueWriter

__all__ = [
    "MAX_DEPTH",
    "check_component",
    "read_checkpoint_meta",
    "check_depth",
    "get",
    "get_dict",
    "get_int",
    "check_int",
    "get_list",
    "leaf_path",
    "plain_file",
    "read_json",
    "read_small",
]


def check_component(
    cls: type, config: dict[str, Any], state: Any, kind: str, capacity: int, where: str = ""
) -> None:
    """Check a sampler's or writer's sizes against the storage's, before it allocates anything.

    A :class:`PrioritizedSampler` allocates its trees in its constructor: its capacity must
    cover the storage's and fit the trees saved in ``tensors.bin`` (present, hence sized by
    the file; their exact shape is checked by ``load_state_dict``); a
    :class:`MaxValueWriter` keeps at most the storage's capacity. ``where`` (e.g. the
    metadata file) starts the error messages.
    """
    at = f"{where}: field '{kind}.config.capacity'" if where else f"{kind}: capacity"
    if issubclass(cls, (PrioritizedSampler, PrioritizedSliceSampler)):
        cap = config.get("capacity")
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < capacity:
            raise CheckpointError(
                f"{at}: {cap!r:.40}, expected an integer >= the storage capacity {capacity} "
                "(a PrioritizedSampler needs one slot per storage slot)"
            )
        saved = state.get("capacity") if isinstance(state, dict) else None
        if saved != cap:
            raise CheckpointError(f"{at}: {cap}, but the saved state is for {saved!r:.40} slots")
        # read from tensors.bin: sized by the file present (a slice sampler saves priorities)
        tree = state.get("sum_tree" if "sum_tree" in state else "priority")
        # a tree holds one leaf per slot (and at most ~10 elements per slot), so the trees
        # the constructor allocates are bounded by the bytes actually saved
        if not isinstance(tree, torch.Tensor) or tree.numel() < cap:
            got = tree.numel() if isinstance(tree, torch.Tensor) else type(tree).__name__
            raise CheckpointError(
                f"{at}: {cap}, but the saved sum_tree has {got} elements (one per slot at least)"
            )
    if issubclass(cls, MaxValueWriter):
        cap = config.get("capacity")
        bad = isinstance(cap, bool) or not isinstance(cap, int) or cap > capacity
        if cap is not None and bad:
            raise CheckpointError(
                f"{at}: {cap!r:.40}, expected an integer <= the storage capacity {capacity}"
            )
