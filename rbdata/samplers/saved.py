"""What ``rbdata inspect`` shows of a saved sampler state, without torch.

:meth:`Sampler.describe_state <rbdata.samplers.base.Sampler.describe_state>` adds summary
values to the view of a saved state; for rbdata's own samplers it calls the functions here
(:func:`tree_totals` for :class:`~rbdata.samplers.PrioritizedSampler`), which
:func:`describe_saved` finds by class name, so a checkpoint is described without importing
torch. :data:`TREE_ARITY` and :data:`TREE_ROOT` are the priority trees' shape
(``_trees.sumtree`` uses them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["TREE_ARITY", "TREE_ROOT", "describe_saved", "tree_totals"]

#: children per node of the sum and min trees
TREE_ARITY = 8
#: the root's index: padding before it aligns every block of children to the arity
TREE_ROOT = TREE_ARITY - 1

Read = Callable[[Any, int], "float | None"]


def tree_totals(state: Mapping[str, Any], read: Read) -> dict[str, Any]:
    """The saved trees' totals: ``total_priority`` and ``min_priority`` (their roots).

    Each is ``None`` when its tree is not a saved floating tensor.

    Examples:
        >>> tree_totals({"sum_tree": [0.0] * 7 + [3.5], "min_tree": None},
        ...             lambda t, i: None if t is None else t[i])
        {'total_priority': 3.5, 'min_priority': None}
    """
    return {
        "total_priority": read(state.get("sum_tree"), TREE_ROOT),
        "min_priority": read(state.get("min_tree"), TREE_ROOT),
    }


#: rbdata's sampler classes that add values, by name
_SHOWN: dict[str, Callable[[Mapping[str, Any], Read], dict[str, Any]]] = {
    "PrioritizedSampler": tree_totals,
}


def describe_saved(class_name: str, state: Mapping[str, Any], read: Read) -> dict[str, Any]:
    """``describe_state`` of rbdata's sampler class ``class_name`` (``{}`` for the others)."""
    shown = _SHOWN.get(class_name)
    return {} if shown is None else shown(state, read)
