"""``SequenceSampler``: windows for recurrent and multi-step learners (burn-in, bootstrap, masks).

A draw picks anchors (uniformly, or by priority), then lays a window of ``burn_in + length +
bootstrap`` records around each with :mod:`._sequences`. The episode index is the one of
:class:`~rbdata.samplers.SliceSampler` (time coordinates over the ring, updated from the end
flags of each write); prioritized anchors come from a
:class:`~rbdata.samplers.PrioritizedSliceSampler` of one-step (or learning-part) slices that
shares the sampler's generator and follows the same writes.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sized
from typing import Any

import numpy as np
import torch

from rbdata._core.shown import shown
from rbdata._core.torchrl_names import torchrl_keywords
from rbdata.samplers import _sequences
from rbdata.samplers._priority_input import device_index_and_priority
from rbdata.samplers.prioritized_slice import PrioritizedSliceSampler
from rbdata.samplers.slice import SliceSampler

__all__ = ["SequenceSampler"]

#: torchrl 0.15 ``Sequence(...)`` keywords spelled otherwise here
_TORCHRL_KEYWORDS = {
    "episode_boundary": "use `boundary=` ('pad', 'stop' or 'cross')",
    "slice_len": "a window is `burn_in + length + bootstrap` rows: use `length=`",
    "num_slices": "the batch size counts rows: rb.sample(B * sampler.window) draws B windows",
}


def _count(value: Any, name: str, low: int) -> int:
    """``value`` as an int ``>= low``, or ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {shown(value)}")
    return int(value)


def _exponents(prioritized: Any) -> tuple[float, float] | None:
    """``prioritized`` as ``(alpha, beta)`` floats (``None`` stays ``None``), else ValueError."""
    if prioritized is None:
        return None
    if isinstance(prioritized, (tuple, list)) and len(prioritized) == 2:
        alpha, beta = prioritized
        if all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 <= float(v) < math.inf
            for v in (alpha, beta)
        ):
            return float(alpha), float(beta)
    raise ValueError(
        f"prioritized must be None or (alpha, beta), two finite numbers >= 0, got "
        f"{shown(prioritized)}"
    )


class SequenceSampler(SliceSampler):
    """Sequences of ``burn_in + length + bootstrap`` records around anchors, with masks.

    **Windows.** A draw picks ``B`` *anchors* (held steps). The window of anchor ``a`` holds
    the records at times ``a + dilation * k`` for ``k`` in ``[-burn_in, length + bootstrap)``:
    ``burn_in`` records before the anchor (to warm a recurrent state), ``length`` learning
    records from the anchor, ``bootstrap`` records after them (targets). A batch is **flat**:
    ``B * (burn_in + length + bootstrap)`` rows, each window's rows in time order, windows one
    after another, so ``batch.reshape(B, -1)`` gives the 2-D view. The batch size counts rows
    and must be a multiple of :attr:`window` (``rb.sample(B * sampler.window)``), as
    :class:`~rbdata.samplers.SliceSampler`'s counts items.

    **Masks.** ``"validity_mask"`` is ``True`` where a record lies in the anchor's allowed
    region; ``"learning_mask"`` is ``True`` on the valid records among the ``length`` learning
    ones. A record outside the region is masked and *repeats the nearest valid record of its
    window* (before the first valid record: the first; after the last: the last), so every
    index is a held slot. ``"slice"`` numbers the windows, and a prioritized sampler adds
    ``"weight"`` (the importance weight of the window's anchor, on every row).

    **Boundaries.** The ring's write seam and unwritten slots are never crossed: the allowed
    region never extends past the oldest held step nor the newest. Within that:

    - ``"pad"``: any held step is an anchor; records outside the anchor's episode (before its
      first step in the burn-in, after its last step) are invalid.
    - ``"stop"``: the same masks, but an anchor must have its whole learning part, ``dilation *
      (length - 1) + 1`` steps, inside its episode; only burn-in and bootstrap records can be
      masked (torchrl's strict slices).
    - ``"cross"``: records continue into the previous and next episodes (they are valid); any
      held step is an anchor.

    An episode is a run of steps between two end flags (``end_key``) or of one episode id
    (``traj_key``); the running episode and the oldest held steps (whose start was overwritten)
    are episodes too.

    **Priorities** (``prioritized=(alpha, beta)``). Each storage item has a priority ``p``
    (new items get the highest seen so far, 1 at first); an anchor ``a`` is drawn with
    probability ``v_a / sum v`` over the valid anchors, ``v = (p + 1e-8) ** alpha``, and its
    window carries ``w = (v_a / v_min) ** -beta``, ``v_min`` the smallest ``v`` over valid
    anchors (:class:`~rbdata.samplers.PrioritizedSampler`'s normalisation).
    :meth:`update_priority` sets per-item priorities (of duplicates, the last wins); the
    anchor tree lives on the CPU.

    torchrl 0.15's ``Sequence(length, burn_in=, bootstrap=, dilation=, episode_boundary=)``
    maps to ``SequenceSampler(storage, length, burn_in=, bootstrap=, dilation=, boundary=)``.

    Args:
        data_source: the storage (``None``: bound by the buffer).
        length: learning records per window.
        burn_in: records before the anchor.
        bootstrap: records after the learning part.
        dilation: time step between consecutive records of a window.
        boundary: ``"pad"``, ``"stop"`` or ``"cross"`` (above).
        end_key: key of the per-step end flag.
        traj_key: key of a per-step episode id, used instead of ``end_key`` when given.
        prioritized: ``None`` (uniform anchors) or ``(alpha, beta)``.
        generator: random generator (``None``: a private one seeded from torch's global RNG).

    Raises:
        ValueError: for ``length < 1``, ``burn_in < 0``, ``bootstrap < 0``, ``dilation < 1``,
            an unknown ``boundary`` or a bad ``prioritized``, naming the argument.

    Examples:
        >>> import torch
        >>> from rbdata import ReplayBuffer, TensorStorage
        >>> sampler = SequenceSampler(length=3, burn_in=2, bootstrap=1)
        >>> rb = ReplayBuffer(TensorStorage(100), sampler=sampler)
        >>> done = torch.zeros(20, 1, dtype=torch.bool)
        >>> done[9] = done[19] = True  # two episodes of 10 steps
        >>> _ = rb.extend({"t": torch.arange(20), "next": {"done": done}})
        >>> index, valid, learn = sampler.windows(torch.tensor([10]))  # anchor: step 10
        >>> index.tolist()  # burn-in before the episode start repeats the anchor
        [10, 10, 10, 11, 12, 13]
        >>> valid.tolist(), learn.tolist()
        ([False, False, True, True, True, True], [False, False, True, True, True, False])
        >>> batch = rb.sample(4 * sampler.window).reshape(4, -1)
        >>> batch.batch_size, batch["learning_mask"].sum(1).tolist()
        (torch.Size([4, 6]), [3, 3, 3, 3])
    """

    @torchrl_keywords(_TORCHRL_KEYWORDS)
    def __init__(
        self,
        data_source: Sized | None = None,
        length: int | None = None,
        *,
        burn_in: int = 0,
        bootstrap: int = 0,
        dilation: int = 1,
        boundary: str = "pad",
        end_key: str | tuple[str, ...] = ("next", "done"),
        traj_key: str | tuple[str, ...] | None = None,
        prioritized: tuple[float, float] | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if isinstance(data_source, numbers.Number):
            raise TypeError(
                f"SequenceSampler's first argument is the storage it reads, got "
                f"{shown(data_source)}: give the length after it or by keyword "
                f"(SequenceSampler(length={shown(data_source)}))"
            )
        if length is None:
            raise ValueError("length: the number of learning records per window is required")
        self.length = _count(length, "length", 1)
        self.burn_in = _count(burn_in, "burn_in", 0)
        self.bootstrap = _count(bootstrap, "bootstrap", 0)
        self.dilation = _count(dilation, "dilation", 1)
        if boundary not in _sequences.BOUNDARIES:
            raise ValueError(
                f"boundary must be one of 'pad', 'stop', 'cross', got {shown(boundary)}"
            )
        self.boundary = boundary
        self.prioritized = _exponents(prioritized)
        self._anchors: PrioritizedSliceSampler | None = None
        self._anchor_state: dict[str, Any] | None = None  # loaded before the storage was bound
        self._span = _sequences.anchor_span(boundary, self.length, self.dilation)
        super().__init__(
            data_source,
            slice_len=self.window,
            end_key=end_key,
            traj_key=traj_key,
            generator=generator,
        )
        if data_source is not None and self.prioritized is not None:
            self._anchors = self._new_anchors()

    @property
    def window(self) -> int:
        """The number of rows in a window, ``burn_in + length + bootstrap``."""
        return self.burn_in + self.length + self.bootstrap

    # --- the anchor tree ------------------------------------------------------------------
    def _new_anchors(self) -> PrioritizedSliceSampler:
        assert self.prioritized is not None
        alpha, beta = self.prioritized
        anchors = PrioritizedSliceSampler(
            self._capacity,
            alpha,
            beta,
            slice_len=self._span,
            end_key=self.end_key,
            traj_key=self.traj_key,
            device="cpu",
            generator=self.generator,
        )
        if self._anchor_state is not None:
            anchors.load_state_dict(self._anchor_state)
            self._anchor_state = None
        return anchors

    def attach(self, storage: Sized) -> None:
        """Bind to a storage and index the episodes already in it."""
        super().attach(storage)
        if self.prioritized is not None:
            if self._anchors is None:
                self._anchors = self._new_anchors()
            self._anchors.attach(storage)

    def reset(self) -> None:
        """Forget every episode (and priority)."""
        super().reset()
        anchors = getattr(self, "_anchors", None)
        if anchors is not None:
            anchors.reset()

    def check_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Refuse a write that breaks the time order or lacks the episode key."""
        super().check_write(index, data)
        if self._anchors is not None:
            self._anchors.check_write(index, data)

    def on_write(self, index: int | torch.Tensor, data: Any) -> None:
        """Index the new steps (and give them the highest priority seen)."""
        super().on_write(index, data)
        if self._anchors is not None:
            self._anchors.on_write(index, data)

    # --- windows --------------------------------------------------------------------------
    def _times(self, slots: np.ndarray) -> np.ndarray:
        """Absolute times of held ``slots``."""
        assert self._base is not None
        capacity = self._capacity
        oldest = max(0, self._time - capacity)
        return oldest + (slots - self._base - oldest) % capacity

    def _ready(self) -> None:
        self._length()  # bound and non-empty
        if self._base is None and self._unindexed:  # SequenceSampler(filled_storage, ...)
            self.attach(self.data_source)  # type: ignore[arg-type]

    def _anchor_table(self, empty_ok: bool = False) -> tuple[torch.Tensor, torch.Tensor, int]:
        cumsum, shift, _, total = self._segments(self._span)
        if total == 0 and not empty_ok:
            raise ValueError(
                f"SequenceSampler: no episode in the buffer has the {self._span} steps of a "
                f"learning part (length {self.length}, dilation {self.dilation}); "
                "boundary='pad' anchors anywhere"
            )
        return cumsum, shift, total

    def anchors(self) -> torch.Tensor:
        """The slots that can be anchors now, in time order (oldest first; may be empty)."""
        self._ready()
        cumsum, shift, total = self._anchor_table(empty_ok=True)
        r = np.arange(total, dtype=np.int64)
        times = r + shift.numpy()[np.searchsorted(cumsum.numpy(), r, side="right")]
        assert self._base is not None
        return torch.from_numpy((self._base + times) % self._capacity)

    def _windows(self, times: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        assert self._base is not None
        shape = (self.burn_in, self.length, self.bootstrap, self.dilation)
        return _sequences.windows(
            self._ends, self._time, self._capacity, self._base, times, shape, self.boundary
        )

    def windows(self, anchor: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The flat window indices, validity and learning masks of the anchors at ``anchor``.

        What a draw that picked those anchors returns. ``anchor`` holds slots of valid
        anchors (:meth:`anchors`); others raise ``ValueError``.
        """
        self._ready()
        slots = torch.as_tensor(anchor)
        if slots.dtype is torch.bool or slots.is_floating_point() or slots.is_complex():
            raise TypeError(f"anchor: expected integer slots, got dtype {slots.dtype}")
        slots = slots.reshape(-1).long()
        valid = torch.zeros(max(len(self.data_source), 1), dtype=torch.bool)  # type: ignore[arg-type]
        valid[self.anchors()] = True
        bad = (slots < 0) | (slots >= valid.shape[0])
        bad |= ~valid[slots.clamp(0, valid.shape[0] - 1)]
        if bool(bad.any()):
            raise ValueError(
                f"anchor: slot {int(slots[bad][0])} is not a valid anchor "
                f"(boundary={self.boundary!r}; see anchors())"
            )
        return self._windows(self._times(slots.numpy()))

    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Draw ``batch_size // window`` windows as one flat batch (see the class doc)."""
        width = self.window
        if batch_size % width:
            raise ValueError(
                f"batch_size {batch_size} is not a multiple of the window, burn_in + length + "
                f"bootstrap = {width}"
            )
        count = batch_size // width
        self._ready()
        cumsum, shift, total = self._anchor_table()
        extras: dict[str, torch.Tensor] = {}
        if self._anchors is None:
            r = torch.randint(total, (count,), generator=self.generator).numpy()
            times = r + shift.numpy()[np.searchsorted(cumsum.numpy(), r, side="right")]
        else:
            slots, weight = self._anchors.draw_starts(count)
            times = self._times(slots.numpy())
            extras["weight"] = weight.unsqueeze(1).expand(count, width).reshape(-1)
        index, valid, learn = self._windows(times)
        extras.update(slice=self._slice_ids(count, width), validity_mask=valid, learning_mask=learn)
        return index, extras

    # --- priorities -----------------------------------------------------------------------
    def _tree(self) -> PrioritizedSliceSampler:
        if self.prioritized is None:
            raise TypeError(
                "SequenceSampler has no priorities: pass prioritized=(alpha, beta) to draw "
                "anchors by priority"
            )
        if self._anchors is None:
            raise RuntimeError("SequenceSampler has no data_source: use it in a ReplayBuffer")
        return self._anchors

    def _per_start(self, index: Any, priority: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-item priorities as the anchor tree's slices (each item repeated ``span``)."""
        idx, prio = device_index_and_priority(index, priority, torch.device("cpu"))
        span = self._span
        return idx.repeat_interleave(span), prio.repeat_interleave(span)

    def update_priority(self, index: Any, priority: Any) -> None:
        """Set the priority of the storage items at ``index`` (one per index, or one for all).

        Raises:
            TypeError: without ``prioritized``, or for non-integer indices.
            ValueError: an index outside the filled range, a NaN, infinite or negative
                priority (nothing changes).
        """
        self._tree().update_priority(*self._per_start(index, priority))

    def check_priority(self, index: Any, priority: Any) -> None:
        """Raise what :meth:`update_priority` would; change nothing."""
        self._tree().check_priority(*self._per_start(index, priority))

    def priorities(self, index: Any = None) -> torch.Tensor:
        """The items' priorities at ``index`` (default: every slot)."""
        return self._tree().priorities(index)

    @property
    def max_priority(self) -> float:
        """The highest priority seen so far."""
        return self._tree().max_priority

    # --- state ----------------------------------------------------------------------------
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self._anchors is not None:  # one generator for both, as before pickling
            self._anchors.generator = self.generator

    def config(self) -> dict[str, Any]:
        """The window, boundary, episode keys and priority exponents."""
        return {
            "length": self.length,
            "burn_in": self.burn_in,
            "bootstrap": self.bootstrap,
            "dilation": self.dilation,
            "boundary": self.boundary,
            "end_key": self.end_key,
            "traj_key": self.traj_key,
            "prioritized": self.prioritized,
        }

    def state_dict(self) -> dict[str, Any]:
        """Generator state, the episode index and (prioritized) the anchor tree's state."""
        state = super().state_dict()
        if self._anchors is not None:
            state["anchors"] = self._anchors.state_dict()
        elif self._anchor_state is not None:
            state["anchors"] = self._anchor_state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (checked before anything changes)."""
        anchors = state.get("anchors")
        if (anchors is None) != (self.prioritized is None):
            raise ValueError(
                "state: the anchor priorities do not match prioritized="
                f"{self.prioritized!r} (a state of another SequenceSampler)"
            )
        before = super().state_dict()
        super().load_state_dict(state)
        if anchors is None:
            return
        if self._anchors is None:
            self._anchor_state = anchors
            return
        try:
            self._anchors.load_state_dict(anchors)
        except Exception:
            super().load_state_dict(before)
            raise
