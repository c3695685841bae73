"""Index and weight arithmetic of sharded buffers (pure functions, re-exported by the package)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["global_weights", "split_index"]


def split_index(index: Any, num_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode global indices into ``(shard, local)`` arrays (``global = local * k + shard``).

    Raises:
        ValueError: if an index is negative.

    Examples:
        >>> shard, local = split_index([0, 1, 6, 7], num_shards=2)
        >>> shard.tolist(), local.tolist()
        ([0, 1, 0, 1], [0, 0, 3, 3])
    """
    idx = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index)
    if idx.dtype.kind not in "iu" and idx.size:
        raise ValueError(f"index: expected integers, got an array of dtype {idx.dtype}")
    idx = idx.astype(np.int64, copy=False).reshape(-1)
    if idx.size and int(idx.min()) < 0:
        raise ValueError(f"index: global indices are >= 0, got {int(idx.min())}")
    return idx % num_shards, idx // num_shards


def global_weights(
    values: np.ndarray,
    shard: np.ndarray,
    share: np.ndarray,
    total: np.ndarray,
    vmin: np.ndarray,
    beta: float,
) -> np.ndarray:
    """Importance weights of a batch drawn across shards, normalised like the local sampler.

    Shard ``s`` was chosen for each item with probability ``share[s]``, then item ``i`` with
    probability ``values[i] / total[s]``; so ``P(i) = share[s] * values[i] / total[s]`` and
    ``w_i = (P(i) / P_min)^-beta`` with ``P_min`` the smallest probability of any item of a
    shard that could be chosen (``share > 0``). When ``share`` is ``total / total.sum()``
    this is exactly ``(values[i] / min_j v_j)^-beta`` over all shards, the local formula.

    Args:
        values: the stored value ``(p + eps)^alpha`` of each sampled item.
        shard: the shard of each sampled item.
        share: per shard, the probability it was chosen for an item.
        total: per shard, the sum of its stored values when it drew.
        vmin: per shard, the smallest positive stored value when it drew.
        beta: the importance-sampling exponent.

    Examples:
        >>> w = global_weights(
        ...     np.array([1.0, 4.0]), np.array([0, 1]), np.array([0.2, 0.8]),
        ...     np.array([1.0, 4.0]), np.array([1.0, 2.0]), beta=1.0)
        >>> w.tolist()
        [1.0, 0.25]
    """
    live = share > 0
    pmin = float(np.min(share[live] * vmin[live] / total[live]))
    prob = share[shard] * values / total[shard]
    return np.power(prob / pmin, -beta)


# --- wire format -----------------------------------------------------------------------------
# (kind, keys, leaves, batch_size): kind "td" (TensorDict), "dict" (nested mapping of
# tensors), "tensor" (one tensor) or "object" (anything else, pickled by Ray as it is).
Packed = tuple[str, list[Any], list[Any], tuple[int, ...] | None]
