"""A stateful test of ``FrameStackStorage``: random operation sequences against the plain stacks.

Hypothesis draws sequences of extends (1 to ``N_ENVS`` env streams, random episode ends with
repeated-frame or zero-padded resets), ``set`` at random slots, ``clear``, a pickle round
trip, checkpoint ``dumps``/``loads`` (a new buffer, or into a storage of its own), and
``close``/``open`` of a storage with a path. The model is a plain ``TensorStorage`` of the
stacks written by the same operations. After every step each index reads back bit-exact, and
the frame pool is consistent: the frames held are exactly the distinct slots the stored steps
and the writer's pins refer to, every count is that number of references, and the free list
holds each free slot once and no slot in use.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tensordict import TensorDict

from rbdata import ReplayBuffer
from rbdata.storages import FrameStackStorage, TensorStorage

STACK, FRAME, N_ENVS = 3, (3, 4), 3


class Streams:
    """``N_ENVS`` env streams of small random frames (repeats, resets, episode ends)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.stacks: list[np.ndarray | None] = [None] * N_ENVS

    def frame(self) -> np.ndarray:
        return self.rng.integers(0, 4, FRAME, dtype=np.uint8)  # few values: repeats happen

    def step(self, env: int) -> tuple[np.ndarray, np.ndarray]:
        obs = self.stacks[env]
        if obs is None:  # an episode starts: repeated first frame, or zero padding
            first = self.frame()
            obs = np.stack([first] * STACK)
            if self.rng.random() < 0.3:
                obs[:-1] = 0
        new = obs[-1] if self.rng.random() < 0.15 else self.frame()
        nxt = np.concatenate([obs[1:], new[None]])
        self.stacks[env] = None if self.rng.random() < 0.2 else nxt
        return obs, nxt

    def batch(self, steps: int, streams: int) -> TensorDict:
        pairs = [self.step(e) for _ in range(steps) for e in range(streams)]
        n = len(pairs)
        return TensorDict(
            {
                "observation": torch.from_numpy(np.stack([p[0] for p in pairs])),
                ("next", "observation"): torch.from_numpy(np.stack([p[1] for p in pairs])),
                "reward": torch.from_numpy(self.rng.normal(size=(n, 1)).astype(np.float32)),
            },
            [n],
        )


def check_pool(storage: FrameStackStorage) -> None:
    """Counts, free list and frames held, recomputed from the stored steps and the pins."""
    pool, tracker = storage._pool, storage._tracker
    if pool is None:
        return
    refs = storage.steps.buffers[-1][: len(storage)].numpy().reshape(-1)
    pins = tracker.pinned().reshape(-1)
    count = np.zeros(pool.slots, np.int64)
    np.add.at(count, refs, 1)
    np.add.at(count, pins, 1)
    assert (count == pool._count).all(), "reference counts differ from the references"
    free = pool._free[: pool._nfree]
    assert np.unique(free).size == free.size, "a slot is free twice"
    assert (count[free] == 0).all(), "a slot in use is on the free list"
    assert storage.frames_stored == np.union1d(refs, pins).size


class FrameMachine(RuleBasedStateMachine):
    """Operations on a FrameStackStorage and the reference, checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="rbdata-frames-stateful-"))
        self.dirs = 0
        self.storage: FrameStackStorage | None = None

    def _dir(self) -> Path:
        self.dirs += 1
        return self.tmp / f"d{self.dirs}"

    @initialize(
        capacity=st.integers(4, 24),
        codec=st.sampled_from([None, "lz4", ("zstd", 1)]),
        on_disk=st.booleans(),
        seed=st.integers(0, 2**16),
    )
    def start(self, capacity: int, codec, on_disk: bool, seed: int) -> None:
        self.codec = codec
        path = self._dir() if on_disk else None
        self.storage = FrameStackStorage(capacity, STACK, codec=codec, path=path)
        self.reopenable = on_disk  # a directory of its own (not a private copy)
        self.ref = TensorStorage(capacity)
        self.streams = Streams(seed)
        self.spare = self.streams.batch(8, 1)  # rows for sets

    def teardown(self) -> None:
        if self.storage is not None:
            self.storage.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- operations ------------------------------------------------------------------------
    @rule(steps=st.integers(1, 6), streams=st.integers(1, N_ENVS))
    def extend(self, steps: int, streams: int) -> None:
        data = self.streams.batch(steps, streams)[: self.ref.capacity]
        ReplayBuffer(storage=self.storage).extend(data)
        ReplayBuffer(storage=self.ref).extend(data)

    @precondition(lambda self: len(self.ref) > 0)
    @rule(data=st.data())
    def set_slots(self, data: st.DataObject) -> None:
        n = len(self.ref)
        slots = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=5))
        rows = data.draw(st.lists(st.integers(0, 7), min_size=len(slots), max_size=len(slots)))
        items = self.spare[torch.tensor(rows)]
        self.storage.set(torch.tensor(slots), items)
        self.ref.set(torch.tensor(slots), items)

    @rule()
    def clear(self) -> None:
        self.storage.clear()
        self.ref.clear()

    @rule()
    def pickle_round_trip(self) -> None:
        copy = pickle.loads(pickle.dumps(self.storage))
        self.storage.close()
        self.storage, self.reopenable = copy, False  # a copy is in memory

    @rule(into=st.booleans())
    def checkpoint(self, into: bool) -> None:
        ck = self._dir()
        ReplayBuffer(storage=self.storage).dumps(ck, fsync=False)
        if into:  # loaded into a new storage with a path (reopenable afterwards)
            own = FrameStackStorage(self.ref.capacity, STACK, codec=self.codec, path=self._dir())
            ReplayBuffer(storage=own).loads(ck)
        else:  # a new buffer over a private copy of the checkpoint
            own = ReplayBuffer.loads(ck).storage
        self.storage.close()
        self.storage, self.reopenable = own, into

    @precondition(lambda self: self.reopenable)
    @rule()
    def close_and_open(self) -> None:
        path = self.storage.path
        self.storage.close()
        self.storage = FrameStackStorage.open(path)

    # --- what must hold after every step ----------------------------------------------------
    @invariant()
    def same_as_the_reference(self) -> None:
        storage = self.storage
        if storage is None:
            return
        assert len(storage) == len(self.ref) and storage.next_slot == self.ref.next_slot
        if len(self.ref):
            idx = torch.arange(len(self.ref))
            got, want = storage[idx], self.ref[idx]
            for key in want.keys(include_nested=True, leaves_only=True):
                assert torch.equal(got[key], want[key]), key
        check_pool(storage)


FrameMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFrameStorage = FrameMachine.TestCase
