"""``SliceSamplerWithoutReplacement``: every valid slice start once per epoch, in a seeded order.

An epoch is a permutation of the valid slice starts, kept as absolute *times* (the episode
index's coordinates, see :mod:`rbdata.samplers.slice`), so that it stays meaningful across
writes: a batch takes the next starts of the permutation and checks them against the current
episode index (one vectorised ``searchsorted``), skipping the starts that the ring has
overwritten since the epoch began. Starts that become valid during an epoch join the next one.
"""

from __future__ import annotations

import math
from collections.abc import Sized
from typing import Any

import numpy as np
import torch

from rbdata.samplers import _slice_starts
from rbdata.samplers._draw_state import check_generator_state
from rbdata.samplers.base import check_bool
from rbdata.samplers.slice import SliceSampler

__all__ = ["SliceSamplerWithoutReplacement"]


class SliceSamplerWithoutReplacement(SliceSampler):
    """Slices of one episode each; every valid slice start exactly once per epoch.

    Takes :class:`~rbdata.samplers.SliceSampler`'s arguments and its batch layout (flat,
    ``num_slices * slice_len`` items, ``"slice"`` and, with ``strict_length=False``,
    ``"mask"``). An epoch is a seeded permutation of all valid slice starts at its beginning
    (a start whose ``slice_len`` steps are retained and in one episode; with
    ``strict_length=False`` also the first step of each shorter episode); successive batches
    take consecutive starts of it. The epoch's last batch holds the starts that are left
    (fewer slices) unless ``drop_last``. Iterating the sampler, a
    :class:`~rbdata.samplers.BatchSampler` over it, or a :class:`~rbdata.ReplayBuffer` using
    it runs one epoch; ``sample`` goes on into the next. ``state_dict`` holds the epoch's
    permutation and position, so a restored sampler (or ``StatefulDataLoader``) continues
    mid-epoch with exactly the batches the original would have drawn.

    Writes during an epoch: starts that the ring overwrote are skipped; new starts join the
    next epoch. With ``num_slices`` the slice length comes from the batch size: an epoch is
    over when a batch asks for another length.

    Args:
        data_source: the storage (``None``: bound by the buffer).
        slice_len: steps per slice.
        num_slices: slices per batch.
        end_key: key of the per-step end flag.
        traj_key: key of a per-step episode id, used instead of ``end_key`` when given.
        strict_length: skip episodes shorter than ``slice_len`` (else: whole, padded).
        drop_last: skip the epoch's last batch when it has fewer than ``num_slices`` slices.
        generator: random generator (``None``: a private one seeded from torch's global RNG).

    Examples:
        >>> import torch
        >>> from rbdata import ReplayBuffer, TensorStorage
        >>> sampler = SliceSamplerWithoutReplacement(slice_len=3, generator=torch.Generator())
        >>> rb = ReplayBuffer(TensorStorage(100), sampler=sampler, batch_size=6)
        >>> done = torch.zeros(10, 1, dtype=torch.bool)
        >>> done[4] = done[9] = True  # two episodes of 5 steps: 3 starts each
        >>> _ = rb.extend({"t": torch.arange(10), "next": {"done": done}})
        >>> starts = sorted(int(b["t"][i]) for b in rb for i in (0, 3))  # one epoch
        >>> starts
        [0, 1, 2, 5, 6, 7]
    """

    epoch_based = True

    def __init__(
        self,
        data_source: Sized | None = None,
        *,
        slice_len: int | None = None,
        num_slices: int | None = None,
        end_key: str | tuple[str, ...] = ("next", "done"),
        traj_key: str | tuple[str, ...] | None = None,
        strict_length: bool = True,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        self.drop_last = check_bool(drop_last, "drop_last")
        self._epoch: torch.Tensor | None = None  # start times, in the epoch's order
        self._pos = 0
        self._epoch_len: int | None = None  # the slice length of the epoch's starts
        self._fresh = False  # begin_epoch asked for an epoch (built at the first batch)
        super().__init__(
            slice_len=slice_len,
            num_slices=num_slices,
            end_key=end_key,
            traj_key=traj_key,
            strict_length=strict_length,
            data_source=data_source,
            generator=generator,
        )

    # --- epochs ---------------------------------------------------------------------------
    def _starts(self, length: int) -> np.ndarray:
        """Every valid start time for slices of ``length`` steps, in time order."""
        times, spans = _slice_starts.all_spans(
            self._ends, self._time, self._capacity, length, self.strict_length
        )
        return times[spans > 0]

    def _new_epoch(self, length: int) -> None:
        starts = torch.from_numpy(self._starts(length))
        self._epoch = starts[torch.randperm(starts.shape[0], generator=self.generator)]
        self._pos, self._epoch_len, self._fresh = 0, length, False

    def begin_epoch(self) -> None:
        """Start a fresh epoch (its permutation is drawn at its first batch)."""
        self._length()
        self._epoch, self._pos, self._epoch_len, self._fresh = None, 0, None, True

    def epoch_over(self, batch_size: int) -> bool:
        """Whether the epoch has no batch of ``batch_size`` left (see the class doc)."""
        num_slices, length = self._shape(batch_size)
        if self._fresh:
            self._new_epoch(length)
        epoch = self._epoch
        if epoch is None or self._epoch_len != length:
            return True
        remaining = epoch.shape[0] - self._pos
        return remaining <= 0 or (self.drop_last and remaining < num_slices)

    def _epoch_batches(self, batch_size: int) -> int:
        num_slices, length = self._shape(batch_size)
        n = self._segments(length)[3] if self._base is not None else 0
        return n // num_slices if self.drop_last else math.ceil(n / num_slices)

    def reset(self) -> None:
        """Forget every episode and end the epoch."""
        super().reset()
        self._epoch, self._pos, self._epoch_len, self._fresh = None, 0, None, False

    # --- sampling -------------------------------------------------------------------------
    def _take(self, num_slices: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's next starts still valid, and their spans (skipping overwritten ones)."""
        epoch = self._epoch
        assert epoch is not None
        times, spans = [], []
        found = 0
        while found < num_slices and self._pos < epoch.shape[0]:
            chunk = epoch[self._pos : self._pos + num_slices - found].numpy()
            self._pos += chunk.shape[0]
            span = _slice_starts.spans(
                self._ends, self._time, self._capacity, length, self.strict_length, chunk
            )
            keep = span > 0
            times.append(chunk[keep])
            spans.append(span[keep])
            found += int(keep.sum())
        if not times:
            return np.zeros(0, np.int64), np.zeros(0, np.int32)
        return np.concatenate(times), np.concatenate(spans)

    def draw(self, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The epoch's next slices as one flat batch (a new epoch starts when it is over)."""
        num_slices, length = self._shape(batch_size)
        self._length()  # bound and non-empty
        if self.epoch_over(batch_size):
            if not self._segments(length)[3]:
                raise ValueError(
                    f"SliceSamplerWithoutReplacement: no episode in the buffer has {length} "
                    "steps (use strict_length=False to sample shorter ones)"
                )
            if self.drop_last and self._segments(length)[3] < num_slices:
                raise ValueError(
                    f"batch_size {batch_size}: {num_slices} slices per batch but only "
                    f"{self._segments(length)[3]} slice starts, so drop_last=True leaves no batch"
                )
            self._new_epoch(length)
        times, spans = self._take(num_slices, length)
        if not times.shape[0]:  # every start left was overwritten: the next epoch
            self._new_epoch(length)
            times, spans = self._take(num_slices, length)
        assert self._base is not None
        steps = torch.arange(length)
        span = torch.from_numpy(spans).long().unsqueeze(1)
        offset = torch.minimum(steps, span - 1)
        index = (torch.from_numpy(times).unsqueeze(1) + offset + self._base) % self._capacity
        extras = {"slice": self._slice_ids(times.shape[0], length)}
        if not self.strict_length:
            extras["mask"] = (steps < span).reshape(-1)
        return index.reshape(-1), extras

    # --- state ------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """:class:`SliceSampler`'s options and ``drop_last``."""
        return {**super().config(), "drop_last": self.drop_last}

    def state_dict(self) -> dict[str, Any]:
        """The episode index, the generator, and the epoch: its start times and position."""
        state = super().state_dict()
        epoch = None if self._epoch is None else self._epoch.clone()
        state.update(epoch=epoch, pos=self._pos, epoch_len=self._epoch_len, fresh=self._fresh)
        return state

    def draw_state(self) -> dict[str, Any]:
        """The generator and the epoch (start times, position): not the episode index."""
        epoch = None if self._epoch is None else self._epoch.clone()
        return {
            "generator": self.generator.get_state(),
            "epoch": epoch,
            "pos": self._pos,
            "epoch_len": self._epoch_len,
            "fresh": self._fresh,
        }

    def load_draw_state(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`draw_state` over this sampler's episode index (checked first)."""
        generator = check_generator_state(state)
        try:
            epoch, pos, length, fresh = self._check_epoch({**state, "time": self._time})
        except (KeyError, TypeError) as err:  # a missing or mistyped entry
            raise ValueError(f"draw state: {type(err).__name__}: {err}") from err
        self.generator.set_state(generator)
        self._epoch, self._pos, self._epoch_len, self._fresh = epoch, pos, length, fresh

    def _check_epoch(self, state: dict[str, Any]) -> tuple[Any, int, Any, bool]:
        """The epoch entries of a state, checked against its ``"time"`` (``ValueError``)."""
        epoch, pos, length = state["epoch"], int(state["pos"]), state["epoch_len"]
        fresh = check_bool(state["fresh"], "state: fresh")
        if epoch is not None:
            epoch = torch.as_tensor(epoch)
            if epoch.dim() != 1 or epoch.dtype != torch.long:
                raise ValueError(
                    f"state: epoch must be a 1-D LongTensor of start times, got {epoch.dtype} "
                    f"{tuple(epoch.shape)}"
                )
            if not 0 <= pos <= epoch.shape[0]:
                raise ValueError(f"state: pos {pos} is outside the epoch [0, {epoch.shape[0]}]")
            if epoch.numel() and bool(epoch.unique().numel() != epoch.numel()):
                raise ValueError("state: the epoch repeats a start")
            time = int(state["time"])
            if epoch.numel() and (int(epoch.min()) < 0 or int(epoch.max()) >= time):
                raise ValueError(f"state: epoch starts outside the steps [0, {time})")
            epoch = epoch.clone()
        if length is not None and (not isinstance(length, int) or length <= 0):
            raise ValueError(f"state: epoch_len must be a positive integer, got {length!r}")
        return epoch, pos, length, fresh

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (checked before anything changes)."""
        epoch, pos, length, fresh = self._check_epoch(state)
        super().load_state_dict(state)
        self._epoch, self._pos, self._epoch_len, self._fresh = epoch, pos, length, fresh
