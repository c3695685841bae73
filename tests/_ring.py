"""Test helper: a per-step Python model of a ring storage's episodes (the brute force)."""

from __future__ import annotations

__all__ = ["Ring"]


class Ring:
    """Every step ever written, and which slot holds which step (brute force)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.done: list[bool] = []
        self.episode: list[int] = []
        self.slot_time: dict[int, int] = {}

    def write(self, done: list[bool]) -> None:
        for d in done:
            t = len(self.done)
            self.episode.append(self.episode[-1] + self.done[-1] if t else 0)
            self.done.append(d)
            self.slot_time[t % self.capacity] = t

    def held(self) -> range:
        return range(max(0, len(self.done) - self.capacity), len(self.done))

    def bounds(self, slot: int) -> tuple[int, int, bool]:
        """(first slot, last slot, finished) of the step at ``slot``, by scanning the flags."""
        t = self.slot_time[slot]
        held = self.held()
        first = t
        while first - 1 in held and not self.done[first - 1]:
            first -= 1
        last = t
        while not self.done[last] and last + 1 in held:
            last += 1
        return first % self.capacity, last % self.capacity, self.done[last]

    def times(self, slot: int) -> tuple[int, int, int]:
        """(time, first time, last time held) of the step at ``slot`` and of its episode."""
        first, last, _ = self.bounds(slot)
        t = self.slot_time[slot]
        return t, self.slot_time[first], self.slot_time[last]
