"""FrameStackStorage buffers through ``MixedBuffer``, ``rbdata.nodes`` and ``DataLoader`` workers.

Every row read is identified by its ``"id"`` and compared bit-exactly with the transition
that was written (both stacks), whichever path read it: a mixture of a frame buffer (on disk)
and a plain one, a ``BufferSource`` pipeline with prefetching, ``DataLoader`` with two
worker processes over the mixture's dataset and over a frame storage, and the mixture's own
checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _frames_data import rollout
from tensordict import TensorDict
from torch.utils.data import DataLoader
from torchdata.nodes import Loader, Prefetcher

from rbdata import MixedBuffer, PrioritizedSampler, ReplayBuffer, TensorStorage, UniformSampler
from rbdata.nodes import BufferSource
from rbdata.storages import FrameStackStorage

pytestmark = pytest.mark.usefixtures("collect_pipelines")

STEPS, ENVS = 120, 2
DATA = rollout(STEPS, ENVS, seed=11)
DATA["id"] = torch.arange(STEPS * ENVS)


def assert_rows(batch: TensorDict) -> None:
    """Every row is the written transition its ``"id"`` names (stacks bit-exact)."""
    want = DATA[batch["id"]]
    for key in ("observation", ("next", "observation"), "action", ("next", "reward")):
        assert torch.equal(batch[key], want[key]), key


def frame_buffer(path: Path | None, codec, seed: int, prioritized: bool = False) -> ReplayBuffer:
    gen = torch.Generator().manual_seed(seed)
    sampler = (
        PrioritizedSampler(100, alpha=0.7, beta=0.5, generator=gen)
        if prioritized
        else UniformSampler(generator=gen)
    )
    rb = ReplayBuffer(FrameStackStorage(100, 4, codec=codec, path=path), sampler, batch_size=16)
    for t in range(STEPS):
        rb.extend(DATA[t * ENVS : (t + 1) * ENVS])
    return rb


def plain_buffer(seed: int) -> ReplayBuffer:
    rb = ReplayBuffer(
        TensorStorage(80), UniformSampler(generator=torch.Generator().manual_seed(seed))
    )
    rb.extend(DATA[:80])
    return rb


def mixture(root: Path, codec, seed: int) -> MixedBuffer:
    pixels = frame_buffer(root / f"frames-{seed}", codec, seed, prioritized=True)
    return MixedBuffer(
        {"pixels": pixels, "plain": plain_buffer(seed + 1)},
        {"pixels": 0.75, "plain": 0.25},
        batch_size=16,
    )


@pytest.mark.parametrize("codec", [None, "lz4"])
def test_mixed_buffer_with_a_frame_source(tmp_path: Path, codec) -> None:
    mixed = mixture(tmp_path, codec, seed=0)
    for _ in range(4):
        batch = mixed.sample()
        assert batch["source"].tolist() == [0] * 12 + [1] * 4
        assert_rows(batch)
        mixed.update_priority(batch["index"], torch.rand(16) + 0.1)
    position, local = mixed.locate(batch["index"])
    rows = mixed.sources["pixels"].storage[local[position == 0]]
    assert torch.equal(rows["observation"], batch["observation"][position == 0])
    # the mixture's checkpoint: the frame buffer saved whole, sampling resumes exactly
    mixed.dumps(tmp_path / "ck", fsync=False)
    again = MixedBuffer.loads(tmp_path / "ck")
    expected = [mixed.sample() for _ in range(3)]
    for want in expected:
        got = again.sample()
        assert torch.equal(got["index"], want["index"])
        assert_rows(got)
    into = mixture(tmp_path / "into", codec, seed=5)
    into.loads(tmp_path / "ck")  # into the mixture's own frame storage (with its path)
    assert torch.equal(into.sample()["index"], MixedBuffer.loads(tmp_path / "ck").sample()["index"])


@pytest.mark.parametrize("codec", [None, "lz4"])
def test_dataloader_with_two_workers(tmp_path: Path, codec) -> None:
    loader = DataLoader(
        mixture(tmp_path, codec, seed=3).dataset,
        batch_sampler=mixture(tmp_path / "b", codec, seed=3).batch_sampler(16, num_batches=5),
        num_workers=2,
    )
    batches = list(loader)
    assert len(batches) == 5
    for batch in batches:
        assert_rows(batch)
    rb = frame_buffer(tmp_path / "alone", codec, seed=4)
    plain = DataLoader(rb.storage, batch_size=25, num_workers=2, collate_fn=lambda b: b)
    ids = []
    for batch in plain:
        assert_rows(batch)
        ids += batch["id"].tolist()
    assert sorted(ids) == list(range(STEPS * ENVS - 100, STEPS * ENVS))


@pytest.mark.parametrize("codec", [None, "lz4"])
def test_buffer_source_pipeline(tmp_path: Path, codec) -> None:
    rb = frame_buffer(tmp_path / "frames", codec, seed=6)
    reference = frame_buffer(None, codec, seed=6)
    node = Prefetcher(BufferSource(rb, num_batches=6), prefetch_factor=2)
    got = list(Loader(node))
    assert len(got) == 6
    for batch in got:
        assert_rows(batch)
        assert torch.equal(batch["index"], reference.sample()["index"])


def _try_write(batch: TensorDict) -> str:
    """In a forked worker: a write to the parent's frame storage is refused."""
    storage = _WORKER_STORAGE[0]
    try:
        storage.set(0, DATA[0])
    except RuntimeError as err:
        return str(err)
    return "written"


_WORKER_STORAGE: list[FrameStackStorage] = []


def test_forked_workers_read_and_refuse_writes(tmp_path: Path) -> None:
    rb = frame_buffer(tmp_path / "frames", "lz4", seed=7)
    _WORKER_STORAGE[:] = [rb.storage]
    loader = DataLoader(
        rb.storage,
        batch_size=10,
        num_workers=1,
        collate_fn=_try_write,
        persistent_workers=True,
        multiprocessing_context="fork",
    )
    it = iter(loader)
    assert "forked copy" in next(it)
    assert_rows(rb.storage[torch.arange(100)])  # the worker wrote nothing
    rb.storage.close()  # the worker (alive) holds no claim on the directory
    again = FrameStackStorage.open(tmp_path / "frames")
    assert_rows(again[torch.arange(100)])
    again.close()
    del it, loader
    _WORKER_STORAGE.clear()
