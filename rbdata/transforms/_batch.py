"""Batch access and argument checks of the transforms (``HindsightRelabel``, ``NStepReturn``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rbdata._core.layout import Key
from rbdata._core.layout.keys import key_name
from rbdata.errors import MissingKeyError

__all__ = [
    "check_probs",
    "check_ratio",
    "entry_of",
    "get_entry",
    "leaf_names",
    "put_entry",
    "sampled_index",
]


def get_entry(batch: TensorDictBase, key: Key) -> Any:
    """The entry at ``key``, or ``None`` (a plain TensorDict is walked without its checks)."""
    if type(batch) is not TensorDict:
        return batch.get(key, None)
    node: Any = batch
    for part in key:
        if type(node) is not TensorDict:
            return None
        node = node._tensordict.get(part)
    return node


def sampled_index(batch: Any, who: str) -> torch.Tensor:
    """The storage slot of each item of a sampled batch (its ``"index"``), checked for ``who``.

    Raises:
        TypeError: ``batch`` is not a TensorDict.
        MissingKeyError: it has no 1-D ``"index"`` tensor.
    """
    if not isinstance(batch, TensorDictBase):
        raise TypeError(
            f"{who} needs TensorDict batches (items with nested keys), got {type(batch).__name__}"
        )
    index = get_entry(batch, ("index",))
    if not isinstance(index, torch.Tensor) or index.dim() != 1:
        raise MissingKeyError(
            f"{who} needs the batch's 'index' (the storage slot of each item): sample "
            "through a ReplayBuffer, or add it"
        )
    return index


def entry_of(entries: dict[str, Any], key: Key) -> tuple[dict[str, Any] | None, Any]:
    """``(the entries holding key's last part, the value at key)`` in a plain TensorDict.

    ``entries``: a plain TensorDict's own entries; ``(None, None)`` where a part is missing
    or is not a plain TensorDict. Setting ``holder[key[-1]]`` then replaces the entry
    without TensorDict's checks (the caller checks shape and device).
    """
    holder = entries
    for part in key[:-1]:
        node = holder.get(part)
        if type(node) is not TensorDict:
            return None, None
        holder = node._tensordict
    return holder, holder.get(key[-1])


def put_entry(batch: TensorDictBase, key: Key, value: torch.Tensor) -> None:
    """Set ``key`` to ``value`` (one row per item, on the batch's device: checked by the caller).

    A plain TensorDict whose parent entry exists takes it without re-validation; anything
    else goes through ``set``.
    """
    parent = get_entry(batch, key[:-1]) if len(key) > 1 else batch
    if type(parent) is TensorDict and type(batch) is TensorDict:
        parent._tensordict[key[-1]] = value
    else:
        batch.set(key, value)


def leaf_names(batch: TensorDictBase) -> list[str]:
    """The batch's leaf keys, as sorted names (for error messages)."""
    return sorted(key_name(k) for k in batch.keys(include_nested=True, leaves_only=True))


def check_probs(goal_probs: Sequence[float]) -> tuple[float, float, float]:
    """OGBench's ``(p_cur, p_traj, p_random)``, checked to be probabilities summing to 1."""
    try:
        probs = tuple(float(p) for p in goal_probs)
    except (TypeError, ValueError):
        probs = ()
    if len(probs) != 3 or not all(0.0 <= p <= 1.0 for p in probs):
        raise ValueError(
            f"goal_probs must be three probabilities (p_cur, p_traj, p_random), got {goal_probs!r}"
        )
    if not math.isclose(sum(probs), 1.0, abs_tol=1e-6):
        raise ValueError(f"goal_probs must sum to 1, got {goal_probs!r} (sum {sum(probs)})")
    return probs[0], probs[1], probs[2]


def check_ratio(value: Any) -> float:
    """``her_ratio``, checked to be a number in ``[0, 1]`` (``nan`` refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"her_ratio must be a number in [0, 1], got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"her_ratio must be in [0, 1], got {value!r}")
    return float(value)
