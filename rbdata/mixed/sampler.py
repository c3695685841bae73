"""``MixedSampler``: draws a batch from several sources, a fixed count from each.

It is an rbdata :class:`~rbdata.samplers.Sampler` over the combined index space of a
:class:`~rbdata.MixedBuffer` (source ``i``'s row ``r`` is combined index ``offset_i + r``,
``offset_i`` the sum of the capacities of the sources before it), so it plugs into
:class:`~rbdata.samplers.BatchSampler`, ``DataLoader(mixed.dataset, batch_sampler=...)`` and
``StatefulDataLoader`` like any rbdata sampler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sized
from typing import Any

import torch

from rbdata._core.layout import Key, Layout
from rbdata.errors import EmptyBufferError
from rbdata.mixed._batch import combine, fill_extras
from rbdata.mixed._counts import check_weights, largest_remainder
from rbdata.mixed._sources import Source, check_layout
from rbdata.samplers.base import Sampler, check_batch_size

__all__ = ["MixedSampler"]


class MixedSampler(Sampler):
    """Each batch of ``B``: ``largest_remainder(weights, B)`` items from the sources, in order.

    Built by :class:`~rbdata.MixedBuffer` (``mixed.sampler``). :meth:`draw` returns the
    combined indices, source after source, and the extras ``"source"`` (each row's source
    position, int64) and those of the sources' samplers (e.g. ``"weight"``, see
    :func:`~rbdata.mixed.fill_extras`). An empty source counts as weight 0 until it has data:
    its share goes to the others.

    Args:
        sources: the mixture's sources (built by :class:`~rbdata.MixedBuffer`).
        weights: one weight per source name.
        data_source: the combined view (``mixed.dataset``).
        layout: the batches' layout, ``None`` while every source is empty.
        keys: the ``keys`` option of the mixture (normalised).
        drop_info: the ``drop_info`` option of the mixture.
    """

    def __init__(
        self,
        sources: list[Source],
        weights: Mapping[str, float],
        data_source: Sized,
        layout: Layout | None = None,
        keys: tuple[Key, ...] | None = None,
        drop_info: bool = False,
    ) -> None:
        super().__init__(data_source, torch.Generator())  # draws use the sources' generators
        self.sources = sources
        self.names = [s.name for s in sources]
        self._weights = check_weights(weights, self.names)
        self.layout = layout
        self._keys, self._drop_info = keys, drop_info
        self.weighted = any(callable(getattr(s.sampler, "update_priority", None)) for s in sources)
        self._counts: dict[tuple[int, tuple[bool, ...]], Any] = {}

    # --- weights and counts ----------------------------------------------------------------
    @property
    def weights(self) -> dict[str, float]:
        """The weights by source name, as a new dict; assign a dict to change them."""
        return dict(zip(self.names, self._weights, strict=True))

    @weights.setter
    def weights(self, weights: Mapping[str, float]) -> None:
        self._weights = check_weights(weights, self.names)
        self._counts.clear()

    def check_layouts(self) -> list[bool]:
        """Which sources hold data; check the layout of any that got its first data."""
        filled = []
        for source in self.sources:
            full = len(source) > 0
            if full and source.columns is None:
                self.layout = check_layout(
                    source, self.layout, self.sources, self._keys, self._drop_info
                )
            filled.append(full)
        return filled

    def plan(self, batch_size: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Counts of a batch of ``batch_size`` now, its ``"source"`` and offset columns.

        Raises:
            ~rbdata.errors.EmptyBufferError: no source with a positive weight holds data.
        """
        filled = tuple(self.check_layouts())
        key = (batch_size, filled)
        cached = self._counts.get(key)
        if cached is not None:
            return cached
        effective = [w if full else 0.0 for w, full in zip(self._weights, filled, strict=True)]
        if not any(effective):
            state = ", ".join(
                f"{n!r} (weight {w:g}, {'has data' if f else 'empty'})"
                for n, w, f in zip(self.names, self._weights, filled, strict=True)
            )
            raise EmptyBufferError(
                f"cannot sample: no source with a positive weight holds data: {state}"
            )
        counts = largest_remainder(effective, batch_size)
        sizes = torch.tensor(counts, dtype=torch.long)
        column = torch.repeat_interleave(torch.arange(len(counts)), sizes)
        offsets = torch.tensor([s.offset for s in self.sources], dtype=torch.long)
        offset_column = torch.repeat_interleave(offsets, sizes)
        if len(self._counts) > 64:  # batch sizes seen: a handful
            self._counts.clear()
        self._counts[key] = (counts, column, offset_column)
        return counts, column, offset_column

    # --- drawing ---------------------------------------------------------------------------
    def draw_parts(
        self, batch_size: int
    ) -> tuple[list[tuple[Source, torch.Tensor]], list[dict[str, torch.Tensor]], list[int], Any]:
        """Each source's draw: ``(source, local indices)`` pairs, extras, counts, and more.

        The last item is the batch's cached ``"source"`` and offset columns (see
        :meth:`plan`), which ``rbdata.mixed._batch.combine`` turns into the batch's
        combined indices and ``"source"`` column.

        A draw that raises (e.g. a :class:`~rbdata.samplers.SliceSampler` given a count
        that is no multiple of its slice length) leaves every source's generator as it was.
        """
        counts, column, offset_column = self.plan(batch_size)
        drawing = [(s, c) for s, c in zip(self.sources, counts, strict=True) if c]
        # the last draw's own failure changes nothing of it: only the earlier ones are saved
        saved = [s.sampler.generator.get_state() for s, _ in drawing[:-1]]
        parts, extras = [], []
        try:
            for source, count in drawing:
                idx, extra = source.sampler.draw(count)
                parts.append((source, idx))
                extras.append(extra)
        except BaseException:
            for (source, _), state in zip(drawing, saved, strict=False):
                source.sampler.generator.set_state(state)
            raise
        return parts, extras, [c for _, c in drawing], (column, offset_column)

    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Combined indices of one batch, and ``"source"`` and the samplers' extras."""
        parts, extras, counts, plan = self.draw_parts(check_batch_size(batch_size))
        out = fill_extras(extras, counts, self.weighted)
        index, out["source"] = combine(parts, plan)
        return index, out

    def __len__(self) -> int:
        return sum(len(s) for s in self.sources)

    # --- pipeline state (rbdata.nodes) ------------------------------------------------------
    def draw_state(self) -> dict[str, Any]:
        """The weights and each source sampler's :meth:`~rbdata.samplers.Sampler.draw_state`.

        What :class:`~rbdata.nodes.BufferSource` saves: what decides the next draws, not the
        buffers' data (priorities, episode index).
        """
        return self._states(_draw)

    def load_draw_state(self, state: Any) -> None:
        """Restore a :meth:`draw_state`: all of it, or nothing (``ValueError`` says why)."""
        self._load(state, _load_draw, _draw)

    def _states(self, rule: Callable[[Sampler], Any]) -> dict[str, Any]:
        return {
            "weights": self.weights,
            "samplers": {s.name: rule(s.sampler) for s in self.sources},
        }

    def _load(
        self, state: Any, load: Callable[[Sampler, Any], None], rule: Callable[[Sampler], Any]
    ) -> None:
        """Restore the states with ``load``; on a refusal, the loaded ones go back (``rule``)."""
        weights, states = self._check_state(state)
        saved = [rule(s.sampler) for s in self.sources]
        for source, own in zip(self.sources, saved, strict=True):
            _check_kind(source, own, states[source.name])
        done = 0
        try:
            for source in self.sources:
                load(source.sampler, states[source.name])
                done += 1
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:
            for source, old in zip(self.sources[:done], saved, strict=False):
                load(source.sampler, old)
            raise ValueError(
                f"state['samplers'][{self.sources[done].name!r}]: {type(err).__name__}: {err}"
            ) from err
        self.weights = weights

    # --- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The weights and every source sampler's :meth:`state_dict`, by source name."""
        return self._states(_full)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`: all of it, or nothing (``ValueError`` says why)."""
        self._load(state, _load_full, _full)

    def _check_state(self, state: Any) -> tuple[dict[str, float], dict[str, Any]]:
        if not isinstance(state, Mapping) or set(state) != {"weights", "samplers"}:
            got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"state: expected a dict with 'weights' and 'samplers', got {got}")
        states = state["samplers"]
        if not isinstance(states, Mapping):
            raise ValueError(
                f"state['samplers']: expected a dict of the sources' sampler states, got "
                f"{type(states).__name__}"
            )
        if set(states) != set(self.names):
            got = list(states)
            raise ValueError(
                f"state['samplers']: the state was saved from a mixture of the sources {got}, "
                f"this one has {self.names}: load it into a mixture built with the same "
                "sources as when the state was saved"
            )
        weights = state["weights"]
        try:
            check_weights(weights, self.names)
        except (TypeError, ValueError) as err:
            raise ValueError(f"state['weights']: {err}") from err
        return dict(weights), dict(states)


def _check_kind(source: Source, own: Any, given: Any) -> None:
    """Refuse a source's state saved from another kind of sampler (other state entries).

    A sampler of another kind could take part of it (a uniform sampler the generator of a
    prioritized one's state) and silently leave the rest (the priorities) behind.
    """
    if not isinstance(given, Mapping) or not isinstance(own, Mapping):
        return  # the sampler's own load refuses it (or takes it as it is)
    if set(given) != set(own):
        raise ValueError(
            f"state['samplers'][{source.name!r}]: expected the state of a "
            f"{type(source.sampler).__name__} (entries {sorted(own)}), got one with the "
            f"entries {sorted(given)}, saved from another kind of sampler: build the mixture "
            "with the samplers it was saved with"
        )


def _full(sampler: Sampler) -> Any:
    return sampler.state_dict()


def _load_full(sampler: Sampler, state: Any) -> None:
    sampler.load_state_dict(state)


def _draw(sampler: Sampler) -> Any:
    return sampler.draw_state()


def _load_draw(sampler: Sampler, state: Any) -> None:
    sampler.load_draw_state(state)
