"""The draw state of samplers whose ``state_dict`` also holds the buffer's data.

A :class:`~rbdata.samplers.PrioritizedSampler`'s priorities and a
:class:`~rbdata.samplers.SliceSampler`'s episode index are the buffer's data, like its items:
they are saved with the buffer (``rb.dumps``), not with a pipeline. Their draw state
(:meth:`~rbdata.samplers.Sampler.draw_state`, what :class:`~rbdata.nodes.BufferSource` saves)
is the generator alone, so restoring a pipeline never rolls the data back.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GeneratorDrawState", "check_generator_state"]


def check_generator_state(state: Any) -> torch.Tensor:
    """The ``"generator"`` entry of a draw state, checked (``ValueError`` naming it).

    Examples:
        >>> check_generator_state({"generator": torch.Generator().get_state()}).dtype
        torch.uint8
    """
    if not isinstance(state, dict) or "generator" not in state:
        raise ValueError(f"a draw state is a dict with a 'generator' entry, got {type(state)}")
    generator = state["generator"]
    if not isinstance(generator, torch.Tensor) or generator.dtype != torch.uint8:
        raise ValueError(
            "['generator']: expected a uint8 tensor (a generator state), got "
            f"{type(generator).__name__}"
        )
    return generator


class GeneratorDrawState:
    """Mixin: the draw state is the generator's state (the data stays the buffer's)."""

    generator: torch.Generator

    def draw_state(self) -> dict[str, Any]:
        """The generator's state: the priorities or episode index are the buffer's data."""
        return {"generator": self.generator.get_state()}

    def load_draw_state(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`draw_state`: the generator only (checked first)."""
        self.generator.set_state(check_generator_state(state))
