"""FrameStackStorage: bit-exact reads against the plain stacks, each frame stored once."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from _frames_data import rollout
from tensordict import TensorDict
from torch.utils.data import DataLoader

from rbdata import ReplayBuffer
from rbdata.samplers import (
    PrioritizedSampler,
    SamplerWithoutReplacement,
    SliceSampler,
    UniformSampler,
)
from rbdata.storages import FrameStackStorage, TensorStorage

CODECS = [None, "lz4", ("zstd", 1)]


def reference_after(data: TensorDict, capacity: int, writes: list[slice]) -> TensorStorage:
    """A plain TensorStorage of the stacks, written by the same ring writes."""
    ref = TensorStorage(capacity)
    rb = ReplayBuffer(storage=ref)
    for part in writes:
        rb.extend(data[part])
    return ref


def assert_same(storage: FrameStackStorage, ref: TensorStorage) -> None:
    assert len(storage) == len(ref)
    idx = torch.arange(len(ref))
    got, want = storage[idx], ref[idx]
    for key in want.keys(include_nested=True, leaves_only=True):
        assert torch.equal(got[key], want[key]), key


def live_frames(data: TensorDict, slots: list[int]) -> int:
    """Distinct frames (by bytes) of the stored steps: a lower bound of what must be kept."""
    seen = set()
    for i in slots:
        for key in ("observation", ("next", "observation")):
            for f in data[key][i]:
                seen.add(f.numpy().tobytes())
    return len(seen)


def assert_no_leak(storage: FrameStackStorage) -> None:
    """The frames kept are exactly those the stored steps and the writer's streams refer to."""
    refs = storage.steps[torch.arange(len(storage))]["_frame_refs"].numpy()
    pinned = storage._tracker.pinned()
    held = np.union1d(np.unique(refs), np.unique(pinned))
    assert storage.frames_stored == held.size


@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "path"])
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(
    ("n_envs", "frame", "zero_pad"),
    [(1, (6, 5), False), (3, (8, 8), True), (2, (4, 4, 3), False)],
)
def test_vectorised_streams_ring_wrap_bit_exact(
    codec, n_envs, frame, zero_pad, on_disk, tmp_path
) -> None:
    steps = 150
    data = rollout(steps, n_envs, frame=frame, seed=n_envs, zero_pad=zero_pad)
    capacity = 97  # not a multiple of n_envs: the ring wraps mid-write
    path = tmp_path / "frames" if on_disk else None
    storage = FrameStackStorage(capacity, 4, codec=codec, path=path)
    rb = ReplayBuffer(storage=storage)
    writes = [slice(t * n_envs, (t + 1) * n_envs) for t in range(steps)]
    for part in writes:
        if n_envs == 1:
            rb.add(data[part.start])
        else:
            rb.extend(data[part])
    assert_same(storage, reference_after(data, capacity, writes))
    # every frame once: a single stream adds one frame per step, plus its episode starts
    order = [(t * n_envs + e) for t in range(steps) for e in range(n_envs)]
    stored = order[-capacity:]
    needed = live_frames(data, stored)
    pins = 4 * n_envs  # the writer keeps the last next stack of each stream
    assert needed <= storage.frames_stored <= needed + pins
    assert_no_leak(storage)
    if on_disk:  # and the same after the files are reopened
        storage.close()
        again = FrameStackStorage.open(path)
        assert_same(again, reference_after(data, capacity, writes))
        again.close()


@pytest.mark.parametrize("codec", CODECS)
def test_trajectory_chunks_and_random_sets(codec) -> None:
    data = rollout(400, 1, seed=5)
    storage = FrameStackStorage(64, 4, codec=codec)
    ref = TensorStorage(64)
    rng = np.random.default_rng(0)
    start = 0
    for size in [1, 10, 63, 64, 7, 30]:  # extends that wrap, one of a full capacity
        part = data[start : start + size]
        ReplayBuffer(storage=storage).extend(part)  # a fresh writer resumes at next_slot
        ReplayBuffer(storage=ref).extend(part)
        start += size
        assert_same(storage, ref)
    for _ in range(20):  # overwrite random slots, repeats included (the last one wins)
        slots = torch.from_numpy(rng.integers(0, 64, 5))
        rows = data[torch.from_numpy(rng.integers(0, 400, 5))]
        storage.set(slots, rows)
        ref.set(slots, rows)
        assert_same(storage, ref)
    assert_no_leak(storage)


@pytest.mark.parametrize("codec", CODECS)
def test_every_sampler_reads_exact_stacks(codec) -> None:
    data = rollout(300, 2, seed=2)
    ref_by_id = {int(i): k for k, i in enumerate(range(600))}
    del ref_by_id
    for sampler in (
        UniformSampler(),
        SamplerWithoutReplacement(),
        PrioritizedSampler(128, alpha=0.7, beta=0.5),
        SliceSampler(slice_len=4, end_key=("next", "done"), strict_length=False),
    ):
        storage = FrameStackStorage(128, 4, codec=codec)
        ids = torch.arange(600)
        td = data.clone()
        td["id"] = ids
        rb = ReplayBuffer(storage=storage, sampler=sampler)
        for t in range(300):
            rb.extend(td[2 * t : 2 * t + 2])
        for _ in range(5):
            batch = rb.sample(16)
            rows = data[batch["id"]]
            assert torch.equal(batch["observation"], rows["observation"])
            assert torch.equal(batch["next", "observation"], rows["next", "observation"])


@pytest.mark.parametrize("codec", CODECS)
def test_pickle_and_dataloader_workers(codec) -> None:
    data = rollout(120, 1, seed=3)
    data["id"] = torch.arange(120)
    storage = FrameStackStorage(50, 4, codec=codec)
    rb = ReplayBuffer(storage=storage)
    for start in range(0, 120, 40):
        rb.extend(data[start : start + 40])
    copy = pickle.loads(pickle.dumps(storage))
    assert torch.equal(
        copy[torch.arange(50)]["observation"], storage[torch.arange(50)]["observation"]
    )
    loader = DataLoader(storage, batch_size=10, num_workers=2, collate_fn=lambda b: b)
    ids, obs = [], []
    for batch in loader:
        ids.append(batch["id"])
        obs.append(batch["observation"])
    ids_t = torch.cat(ids)
    assert sorted(ids_t.tolist()) == list(range(70, 120))
    assert torch.equal(torch.cat(obs), data["observation"][ids_t])
    # the copy is a snapshot: writes to the original after the pickle do not reach it
    more = rollout(10, 1, seed=9)
    more["id"] = torch.arange(120, 130)
    ReplayBuffer(storage=storage).extend(more)
    again = copy[torch.arange(50)]
    assert sorted(again["id"].tolist()) == list(range(70, 120))
    assert torch.equal(again["observation"], data["observation"][again["id"]])


def test_refusals_name_the_problem() -> None:
    storage = FrameStackStorage(10, 4)
    frames = torch.zeros(2, 4, 3, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"\('next', 'observation'\)"):
        storage.set(slice(0, 2), TensorDict({"observation": frames}, [2]))
    with pytest.raises(ValueError, match="stacks of 4 frames"):
        bad = torch.zeros(2, 3, 3, 3, dtype=torch.uint8)
        storage.set(
            slice(0, 2), TensorDict({"observation": bad, ("next", "observation"): bad}, [2])
        )
    with pytest.raises(TypeError, match="dict-like"):
        storage.set(slice(0, 2), frames)
    good = TensorDict({"observation": frames, ("next", "observation"): frames}, [2])
    with pytest.raises(IndexError, match="written steps only"):
        storage.set(slice(3, 5), good)
    assert len(storage) == 0
    with pytest.raises(ValueError, match="stack"):
        FrameStackStorage(10, 0)
    with pytest.raises(ValueError, match="codec"):
        FrameStackStorage(10, 4, codec="gzip")
    with pytest.raises(ValueError, match="level"):
        FrameStackStorage(10, 4, codec=("zstd", 99))


def test_damaged_blob_raises_not_crashes() -> None:
    data = rollout(20, 1, seed=4)
    storage = FrameStackStorage(20, 4, codec="lz4")
    ReplayBuffer(storage=storage).extend(data)
    pool = storage._pool
    pool._lengths[: pool.high] += 3  # every blob now claims bytes that are not its own
    with pytest.raises(ValueError, match="damaged"):
        storage[torch.arange(20)]
    pool._offsets[: pool.high] = 1 << 40  # outside the log
    with pytest.raises(ValueError, match="damaged"):
        storage[torch.arange(20)]


@pytest.mark.parametrize("codec", CODECS)
def test_unrelated_stacks_grow_the_pool_never_lose_a_frame(codec) -> None:
    """Steps that share no frame need 2 * stack frames each: the pool grows, reads stay exact."""
    capacity = 200
    storage = FrameStackStorage(capacity, 4, codec=codec)
    ref = TensorStorage(capacity)
    rng = np.random.default_rng(1)
    for _ in range(3):
        for start in range(0, capacity, 50):
            stacks = torch.from_numpy(rng.integers(0, 256, (2, 50, 4, 6, 5), dtype=np.uint8))
            rows = TensorDict({"observation": stacks[0], ("next", "observation"): stacks[1]}, [50])
            storage.set(slice(start, start + 50), rows)
            ref.set(slice(start, start + 50), rows)
    assert storage.frames_stored > capacity + capacity // 64 + 2 * 4 * 66  # grown
    assert_same(storage, ref)
    assert_no_leak(storage)


@pytest.mark.parametrize("codec", CODECS)
def test_per_step_adds_that_outgrow_the_pool_stay_exact(codec) -> None:
    """The per-step kernel hands a step it has no room for to the general path (which grows)."""
    capacity = 100
    storage, ref = FrameStackStorage(capacity, 4, codec=codec), TensorStorage(capacity)
    rb, rb_ref = ReplayBuffer(storage), ReplayBuffer(ref)
    rng = np.random.default_rng(2)
    continuing = torch.from_numpy(rng.integers(0, 256, (4, 6, 5), dtype=np.uint8))
    for t in range(3 * capacity):
        if t % 10:  # unrelated stacks: 8 new frames a step
            obs, nxt = torch.from_numpy(rng.integers(0, 256, (2, 4, 6, 5), dtype=np.uint8))
        else:  # a stack that continues the last one: 1 new frame
            obs = continuing
            new = torch.from_numpy(rng.integers(0, 256, (1, 6, 5), dtype=np.uint8))
            nxt = torch.cat([obs[1:], new])
        continuing = nxt
        item = {"observation": obs.numpy(), "next": {"observation": nxt.numpy()}}
        rb.add(item)
        rb_ref.add(item)
    assert storage.frames_stored > capacity + capacity // 64 + 2 * 4 * 66  # grown
    assert_same(storage, ref)
    assert_no_leak(storage)


@pytest.mark.parametrize("codec", CODECS)
def test_per_step_adds_of_any_array_kind_read_back_exact(codec) -> None:
    """Numpy (C or Fortran order, float frames) and torch stacks take the per-step path alike."""
    data = rollout(120, 1, frame=(6, 5), seed=4, zero_pad=False)
    for dtype in (torch.uint8, torch.float32):
        storage, ref = FrameStackStorage(50, 4, codec=codec), TensorStorage(50)
        rb, rb_ref = ReplayBuffer(storage), ReplayBuffer(ref)
        for t in range(len(data)):
            obs, nxt = data[t]["observation"].to(dtype), data[t]["next", "observation"].to(dtype)
            kind = t % 3
            if kind == 0:
                item = {"observation": obs.numpy(), "next": {"observation": nxt.numpy()}}
            elif kind == 1:  # not C-contiguous
                item = {
                    "observation": np.asfortranarray(obs.numpy()),
                    "next": {"observation": np.asfortranarray(nxt.numpy())},
                }
            else:
                item = {"observation": obs, "next": {"observation": nxt}}
            rb.add(item)
            rb_ref.add({"observation": obs, "next": {"observation": nxt}})
        assert_same(storage, ref)
        assert_no_leak(storage)


@pytest.mark.parametrize("codec", CODECS)
def test_per_step_adds_of_near_continuations_read_back_exact(codec) -> None:
    """A stack equal to the previous next observation but for one frame is not the pinned one.

    The per-step kernel recognises a continuing stack by comparing it with the pinned next
    observation, frame by frame; every position of the altered frame (first to last), a frame
    altered in one pixel only, exact repeats and fresh stacks are mixed at random.
    """
    rng = np.random.default_rng(7)
    stack, frame = 4, (6, 5)
    storage, ref = FrameStackStorage(30, stack, codec=codec), TensorStorage(30)
    rb, rb_ref = ReplayBuffer(storage), ReplayBuffer(ref)
    nxt = rng.integers(0, 4, (stack, *frame), dtype=np.uint8)
    for t in range(200):
        obs = nxt.copy()
        kind = rng.integers(4)
        if kind == 1:  # one frame differs, in one pixel: at any position of the stack
            k, y, x = rng.integers(stack), rng.integers(frame[0]), rng.integers(frame[1])
            obs[k, y, x] ^= 1
        elif kind == 2:  # a fresh stack (an episode start of another stream)
            obs = rng.integers(0, 4, (stack, *frame), dtype=np.uint8)
        new = rng.integers(0, 4, (1, *frame), dtype=np.uint8)
        nxt = np.concatenate([obs[1:], new])
        rb.add({"observation": obs, "next": {"observation": nxt}})
        rb_ref.add(
            {"observation": torch.from_numpy(obs), "next": {"observation": torch.from_numpy(nxt)}}
        )
        if t % 37 == 0:
            assert_same(storage, ref)
    assert_same(storage, ref)
    assert_no_leak(storage)


@pytest.mark.parametrize("codec", CODECS)
def test_a_step_whose_write_fails_keeps_the_step_it_would_overwrite(codec) -> None:
    """The per-step kernel drops the overwritten step's frames; a failed write takes them back."""
    capacity = 40
    data = rollout(4 * capacity, 1, frame=(6, 5), seed=3, zero_pad=False)
    storage, ref = FrameStackStorage(capacity, 4, codec=codec), TensorStorage(capacity)
    rb, rb_ref = ReplayBuffer(storage), ReplayBuffer(ref)
    steps = storage.steps
    real = steps.write_row

    def failing(slot, rows):
        raise OSError("disk full")

    for t in range(4 * capacity):
        if t % 7 == 3 and t > capacity:  # a write over a stored step fails
            steps.write_row = failing  # type: ignore[method-assign]
            with pytest.raises(OSError, match="disk full"):
                rb.add(data[t])
            steps.write_row = real  # type: ignore[method-assign]
            assert_same(storage, ref)
            continue
        rb.add(data[t])
        rb_ref.add(data[t])
    assert_same(storage, ref)
    assert_no_leak(storage)


def test_real_atari_frames_bit_exact() -> None:
    """Pong through gymnasium's AtariPreprocessing and FrameStackObservation, two envs."""
    gym = pytest.importorskip("gymnasium")
    ale_py = pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    envs = []
    for seed in (0, 1):
        env = gym.make("ALE/Pong-v5", frameskip=1, max_episode_steps=120)
        env = FrameStackObservation(AtariPreprocessing(env, frame_skip=4, noop_max=5), 4)
        envs.append((env, env.reset(seed=seed)[0]))
    rng = np.random.default_rng(0)
    storage = FrameStackStorage(250, 4, codec="lz4")
    raw = FrameStackStorage(250, 4)
    ref = TensorStorage(250)
    for _ in range(300):  # one write of both envs per env step, across episode ends
        batch = []
        for k, (env, obs) in enumerate(envs):
            nxt, reward, term, trunc, _ = env.step(int(rng.integers(6)))
            batch.append(
                {
                    "observation": obs,
                    "action": np.int64(0),
                    "next": {
                        "observation": nxt,
                        "done": bool(term or trunc),
                        "reward": np.float32(reward),
                    },
                }
            )
            envs[k] = (env, env.reset()[0] if term or trunc else nxt)
        td = TensorDict(
            {
                "observation": torch.from_numpy(np.stack([b["observation"] for b in batch])),
                ("next", "observation"): torch.from_numpy(
                    np.stack([b["next"]["observation"] for b in batch])
                ),
                ("next", "done"): torch.tensor([b["next"]["done"] for b in batch]),
            },
            [2],
        )
        for s in (storage, raw, ref):
            ReplayBuffer(storage=s).extend(td)
    assert_same(storage, ref)
    assert_same(raw, ref)
    # one new frame per env step, plus a stack's worth at each of the episode starts
    assert storage.frames_stored < 250 + 2 * 4 * 6


@pytest.mark.parametrize("chunk", [1, 2, 5, 64, 65])
def test_trajectory_in_chunks_stores_each_frame_once(chunk) -> None:
    """One env's trajectory written ``chunk`` steps at a time: one new frame per step."""
    data = rollout(200, 1, seed=7, mean_episode=10**9, repeat_p=0.0)
    storage = FrameStackStorage(256, 4, codec="lz4")
    rb = ReplayBuffer(storage=storage)
    for start in range(0, 200, chunk):
        rb.extend(data[start : start + chunk])
    assert storage.frames_stored == live_frames(data, list(range(200))) == 1 + 200
    assert_same(storage, reference_after(data, 256, [slice(0, 200)]))


def test_empty_extend_is_a_no_op() -> None:
    data = rollout(10, 1, seed=8)
    storage = FrameStackStorage(20, 4)
    rb = ReplayBuffer(storage=storage)
    rb.extend(data[:5])
    before = storage.frames_stored
    rb.extend(data[:0])
    storage.set(torch.zeros(0, dtype=torch.int64), data[:0])
    assert len(storage) == 5 and storage.frames_stored == before
    assert torch.equal(storage[torch.arange(5)]["observation"], data["observation"][:5])


@pytest.mark.parametrize("spec", ["lz4", ("zstd", 1)])
def test_batch_decode_split_over_two_threads_is_exact(spec) -> None:
    from rbdata.storages.frames._codecs import FrameCodec

    codec = FrameCodec(spec)
    codec.threads = 2  # whatever this machine's CPUs: the split path itself
    rng = np.random.default_rng(0)
    frames = (rng.integers(0, 3, (1500, 64)) * 80).astype(np.uint8)
    blobs = [codec.compress(f) for f in frames]
    src = np.frombuffer(b"".join(blobs), np.uint8)
    lengths = np.array([len(b) for b in blobs])
    offsets = np.cumsum(lengths) - lengths
    pick = rng.integers(0, 1500, 1200)
    out = np.empty((1200, 64), np.uint8)
    codec.decode_into(src, offsets[pick], lengths[pick], out)
    assert (out == frames[pick]).all()
    bad = lengths.copy()
    bad[pick[900]] += 1  # damaged in the second thread's half
    with pytest.raises(ValueError, match="damaged"):
        codec.decode_into(src, offsets[pick], bad[pick], out)
