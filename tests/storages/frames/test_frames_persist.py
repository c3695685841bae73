"""FrameStackStorage on disk (``path=``, ``open``, ``close``) and in checkpoints and inspect.

Every read is compared bit-exactly with a plain ``TensorStorage`` of the stacks written by
the same writes (``test_frames.reference_after``); after an open the frames held are exactly
the distinct slots the stored steps refer to (the counts are rebuilt, no pin survives).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from _frames_data import rollout
from tensordict import TensorDict
from test_frames import CODECS, assert_no_leak, assert_same, reference_after

from rbdata import ReplayBuffer
from rbdata.errors import CheckpointError, ReadOnlyError, StorageInUseError
from rbdata.inspect import format_summary, inspect_path
from rbdata.storages import FrameStackStorage, TensorStorage
from rbdata.storages.base import SavedStorage
from rbdata.storages.frames import _pool


def _filled(path: Path | None, codec, steps: int = 150, n_envs: int = 2, capacity: int = 97):
    """A storage written by a vectorised env (ring wrapped), and the reference of the stacks."""
    data = rollout(steps, n_envs, seed=7)
    data["id"] = torch.arange(steps * n_envs)
    storage = FrameStackStorage(capacity, 4, codec=codec, path=path)
    rb = ReplayBuffer(storage=storage)
    writes = [slice(t * n_envs, (t + 1) * n_envs) for t in range(steps)]
    for part in writes:
        rb.extend(data[part])
    return storage, reference_after(data, capacity, writes), data


def distinct_refs(storage: FrameStackStorage) -> int:
    refs = storage.steps[torch.arange(len(storage))]["_frame_refs"]
    return int(torch.unique(refs).numel())


@pytest.mark.parametrize("codec", CODECS)
def test_close_and_open_give_the_same_steps(tmp_path: Path, codec) -> None:
    path = tmp_path / "frames"
    storage, ref, data = _filled(path, codec)
    storage.close()
    assert sorted(os.listdir(path)) == ["frames", "frames.json", "holders.bin", "steps"]
    again = FrameStackStorage.open(path)
    spec = codec if codec is None or isinstance(codec, str) else list(codec)
    assert (again.stack, again.key, again.codec, again.capacity) == (4, ("observation",), spec, 97)
    assert_same(again, ref)
    assert again.frames_stored == distinct_refs(again)  # rebuilt: no pins
    assert again.next_slot == ref.next_slot
    # it goes on: writes after the open (set at random slots included) read back exactly
    rb, ref_rb = ReplayBuffer(storage=again), ReplayBuffer(storage=ref)
    for t in range(30):
        rb.extend(data[2 * t : 2 * t + 2])
        ref_rb.extend(data[2 * t : 2 * t + 2])
    slots = torch.tensor([3, 50, 3, 96])
    again.set(slots, data[torch.tensor([5, 9, 11, 100])])
    ref.set(slots, data[torch.tensor([5, 9, 11, 100])])
    assert_same(again, ref)
    assert_no_leak(again)
    again.flush()
    again.close()
    assert_same(FrameStackStorage.open(path, read_only=True), ref)


@pytest.mark.parametrize("codec", CODECS)
def test_read_only_and_copy_on_write(tmp_path: Path, codec) -> None:
    path = tmp_path / "frames"
    storage, ref, data = _filled(path, codec)
    storage.close()
    before = {p: (path / p).read_bytes() for p in ("frames.json",)}
    ro = FrameStackStorage.open(path, read_only=True)
    for write in (
        lambda: ro.set(0, data[0]),
        lambda: ReplayBuffer(storage=ro).extend(data[:3]),
        ro.clear,
    ):
        with pytest.raises(ReadOnlyError, match="read_only=True"):
            write()
    assert_same(ro, ref)
    cow = FrameStackStorage.open(path, copy_on_write=True)  # readers take no hold
    for t in range(0, 300, 60):  # many writes: the log and slots grow in memory
        ReplayBuffer(storage=cow).extend(data[t : t + 60])
    assert_no_leak(cow)
    assert len(cow) == 97
    ro.close()
    cow.close()
    assert {p: (path / p).read_bytes() for p in before} == before
    assert_same(FrameStackStorage.open(path), ref)  # the files never changed


def test_one_writer_and_closed_storages_refuse(tmp_path: Path) -> None:
    path = tmp_path / "frames"
    storage, _, data = _filled(path, "lz4", steps=20)
    with pytest.raises(StorageInUseError):
        FrameStackStorage.open(path)
    with pytest.raises(FileExistsError, match=r"FrameStackStorage\.open"):
        FrameStackStorage(10, 4, path=path)
    storage.close()
    storage.close()  # twice: nothing more
    calls = {
        "len": lambda: len(storage),
        "getitem": lambda: storage[0],
        "getitems": lambda: storage[[0, 1]],
        "set": lambda: storage.set(0, data[0]),
        "clear": storage.clear,
        "flush": storage.flush,
        "path": lambda: storage.path,
        "frames_stored": lambda: storage.frames_stored,
        "nbytes": storage.nbytes,
        "config": storage.config,
        "steps": lambda: storage.steps,
        "dumps": lambda: ReplayBuffer(storage=storage).dumps(path.parent / "ck"),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="closed"):
            call()
        assert name
    FrameStackStorage.open(path).close()  # the hold went with close


def test_gpu_device_with_a_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="device"):
        FrameStackStorage(10, 4, path=tmp_path / "x", device="meta")
    assert not (tmp_path / "x").exists()


def test_corrupt_directories_raise_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "frames"
    storage, _, _ = _filled(path, "lz4", steps=30)
    storage.close()
    meta_file = path / "frames.json"
    good = json.loads(meta_file.read_text())
    for field, value in (("stack", 0), ("codec", "gzip"), ("id", "x"), ("generation", -1)):
        meta_file.write_text(json.dumps({**good, field: value}))
        with pytest.raises(ValueError, match=field):
            FrameStackStorage.open(path)
    meta_file.write_text(json.dumps({**good, "stack": 3}))  # the layout's stacks are of 4
    with pytest.raises(ValueError, match="layout"):
        FrameStackStorage.open(path)
    meta_file.write_text(json.dumps(good))
    log = path / "frames" / "log-0.bin"
    raw = log.read_bytes()
    log.write_bytes(raw[:40])  # the header cut
    with pytest.raises(ValueError, match=r"log-0\.bin"):
        FrameStackStorage.open(path)
    other, _, _ = _filled(tmp_path / "other", "lz4", steps=30)
    other.close()
    log.write_bytes((tmp_path / "other" / "frames" / "log-0.bin").read_bytes())
    with pytest.raises(ValueError, match="another storage"):
        FrameStackStorage.open(path)
    log.write_bytes(raw[:64])  # a log without the blobs the steps refer to
    with pytest.raises(ValueError, match="outside"):
        FrameStackStorage.open(path)
    log.write_bytes(raw)
    FrameStackStorage.open(path).close()


def test_log_compaction_on_disk_switches_generation(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(_pool, "_MIN_LOG", 1 << 12)
    path = tmp_path / "frames"
    storage, ref, _ = _filled(path, "lz4", steps=400, n_envs=1, capacity=40)
    generation = json.loads((path / "frames.json").read_text())["generation"]
    assert generation > 0  # compacted into new files, the old ones removed
    names = sorted(os.listdir(path / "frames"))
    assert names == [f"log-{generation}.bin", f"table-{generation}.bin"]
    assert_same(storage, ref)
    storage.close()
    (path / "frames" / "log-999.bin").write_bytes(b"a compaction cut by a kill")
    again = FrameStackStorage.open(path)
    assert not (path / "frames" / "log-999.bin").exists()
    assert_same(again, ref)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("on_disk", [False, True])
def test_checkpoints_round_trip(tmp_path: Path, codec, on_disk: bool) -> None:
    storage, ref, data = _filled(tmp_path / "frames" if on_disk else None, codec)
    rb = ReplayBuffer(storage=storage, batch_size=8)
    rb.dumps(tmp_path / "ck", fsync=False)
    new = ReplayBuffer.loads(tmp_path / "ck", verify=True)
    assert_same(new.storage, ref)
    assert new.storage.frames_stored == distinct_refs(new.storage)
    assert torch.equal(new.sample(8)["index"], rb.sample(8)["index"])  # the sampler resumed
    ReplayBuffer(storage=new.storage).extend(data[:40])  # private: the checkpoint is unchanged
    into = ReplayBuffer(storage=FrameStackStorage(97, 4, codec=codec), batch_size=8)
    into.loads(tmp_path / "ck")  # in place: frames slot for slot
    assert_same(into.storage, ref)
    assert_no_leak(into.storage)
    state = ReplayBuffer.from_state_dict(rb.state_dict())
    assert_same(state.storage, ref)
    info = inspect_path(tmp_path / "ck")
    shown = (info.storage.format, info.storage.length, info.storage.details["stack"])
    assert shown == ("frames", 97, 4)
    text = format_summary(info)
    for words in ("FrameStackStorage (frames)", "frames stored:", "bytes per step:", "codec:"):
        assert words in text


def test_checkpoint_tampering_is_refused(tmp_path: Path) -> None:
    storage, _, _ = _filled(None, "lz4", steps=30)
    ReplayBuffer(storage=storage).dumps(tmp_path / "a", fsync=False)
    ReplayBuffer(storage=storage).dumps(tmp_path / "b", fsync=False)
    live = [next((tmp_path / n).glob("ckpt-*")) / "storage" for n in ("a", "b")]
    table = live[0] / "frames" / "table-0.bin"
    good = table.read_bytes()
    table.write_bytes(good[:-8])
    with pytest.raises(CheckpointError, match=r"table-0\.bin"):
        ReplayBuffer.loads(tmp_path / "a")
    table.write_bytes((live[1] / "frames" / "table-0.bin").read_bytes())  # another's files
    with pytest.raises(CheckpointError, match="another"):
        ReplayBuffer.loads(tmp_path / "a")
    table.write_bytes(good)
    (live[0] / "frames.json").write_bytes((live[1] / "frames.json").read_bytes())
    with pytest.raises(CheckpointError, match="another checkpoint"):
        ReplayBuffer.loads(tmp_path / "a")


def test_inspect_a_storage_directory(tmp_path: Path) -> None:
    storage, _, _ = _filled(tmp_path / "frames", "lz4")
    storage.flush()
    info = inspect_path(tmp_path / "frames")
    assert (info.kind, info.storage_class) == ("frames", "FrameStackStorage")
    assert info.storage.capacity == 97
    assert info.storage.details["codec"] == "lz4" and not info.problems
    assert str(storage.frames_stored) in info.storage.details["frames_stored"]
    text = format_summary(info)
    assert "FrameStackStorage directory" in text and "bytes per step" in text
    storage.close()


def test_pickled_storage_with_a_path_is_an_in_memory_snapshot(tmp_path: Path) -> None:
    import pickle

    storage, ref, data = _filled(tmp_path / "frames", "lz4")
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.path is None
    assert_same(copy, ref)
    ReplayBuffer(storage=copy).extend(data[:10])  # writes only the copy
    storage.close()
    assert_same(FrameStackStorage.open(tmp_path / "frames"), ref)


def test_copy_between_codecs_goes_row_by_row(tmp_path: Path) -> None:
    storage, ref, _ = _filled(None, "lz4")
    other = FrameStackStorage(97, 4, path=tmp_path / "raw")
    other.copy_from(storage)
    assert_same(other, ref)
    assert other.next_slot == storage.next_slot == ref.next_slot
    other.close()
    again = FrameStackStorage.open(tmp_path / "raw")
    assert_same(again, ref)
    assert again.next_slot == ref.next_slot
    plain = TensorStorage(97)
    with pytest.raises(TypeError, match="FrameStackStorage"):
        FrameStackStorage.empty_like(plain)


def test_refs_of_a_pool_are_checked(tmp_path: Path) -> None:
    storage, _, _ = _filled(tmp_path / "frames", None, steps=20)
    storage.close()
    again = FrameStackStorage.open(tmp_path / "frames")
    again.steps.buffers[-1][0, 0, 0] = 10**6  # a step refers past the end of frames.bin
    again.close()
    with pytest.raises(ValueError, match="out of range"):
        FrameStackStorage.open(tmp_path / "frames")


@pytest.mark.parametrize("on_disk", [False, True])
def test_hooks_called_directly(tmp_path: Path, on_disk: bool) -> None:
    from rbdata.checkpoint import _codec

    storage, ref, _ = _filled(tmp_path / "frames" if on_disk else None, "lz4")
    directory, meta_file, tensors = tmp_path / "storage", tmp_path / "checkpoint.json", []
    state, files = storage.dump(directory, _codec, tensors, fsync=False)
    for file, rec in files.items():  # the checksum entries name the files actually written
        assert (directory / file).stat().st_size == rec["size"]
    config = storage.config()
    plan = FrameStackStorage.check_dump(directory, config, state, meta_file)
    assert plan[0] == 97
    restored = FrameStackStorage.restore(
        SavedStorage(directory, config, state, _codec, tensors, plan)
    )
    assert_same(restored, ref)
    info, problems = FrameStackStorage.describe(directory, config, state, meta_file)
    assert problems == [] and (info.capacity, info.length) == (97, 97)
    assert {k.key for k in info.keys} >= {("observation",), ("next", "observation"), ("id",)}
    with pytest.raises(CheckpointError, match="stack"):
        FrameStackStorage.check_dump(directory, {**config, "stack": 3}, state, meta_file)
    restored.close()
    storage.close()


@pytest.mark.parametrize("between", ["nothing", "pickle", "reopen"])
@pytest.mark.parametrize("codec", CODECS)
def test_a_batch_matches_the_stack_pinned_now_not_one_pinned_before(
    tmp_path: Path, codec, between: str
) -> None:
    """Per-step adds, then a batch whose first stack was pinned before them, not now.

    The per-step kernel and the general plan keep the writer's stacks one way (by reference in
    raw CPU frames, else by copy; ``_streams.py``): were the kept stacks stale for one of them
    (a copy the other path does not update), this batch would match the slots pinned now and
    read back the wrong stack. Fresh stacks grow the pool; a pickle or a reopen in between.
    """
    rng = np.random.default_rng(11)
    stack, frame, capacity = 4, (6, 5), 100
    path = tmp_path / "frames" if between == "reopen" else None
    storage, ref = (
        FrameStackStorage(capacity, stack, codec=codec, path=path),
        TensorStorage(capacity),
    )
    rb, rb_ref = ReplayBuffer(storage), ReplayBuffer(ref)

    def frames(n: int) -> np.ndarray:
        return rng.integers(0, 4, (n, *frame), dtype=np.uint8)

    def then(obs: np.ndarray) -> np.ndarray:
        return np.concatenate([obs[1:], frames(1)])

    def write(obs: np.ndarray, nxt: np.ndarray) -> None:  # [S, *frame]: add; [n, S, ...]: extend
        item = {
            "observation": torch.from_numpy(obs),
            "next": {"observation": torch.from_numpy(nxt)},
        }
        if obs.ndim == 3:
            rb.add({"observation": obs, "next": {"observation": nxt}})
            rb_ref.add(item)
        else:
            batch = TensorDict(item, [obs.shape[0]])
            rb.extend(batch)
            rb_ref.extend(batch.clone())

    def again() -> None:  # the storage pickled or reopened, and written on
        nonlocal storage, rb, rb_ref
        if between == "pickle":
            storage = pickle.loads(pickle.dumps(storage))
        elif between == "reopen":
            storage.close()
            storage = FrameStackStorage.open(path)
        rb, rb_ref = ReplayBuffer(storage), ReplayBuffer(ref)

    for r in range(12):
        for _ in range(32):  # unrelated stacks, per step: the pool grows (on the general path)
            write(frames(stack), frames(stack))
        obs = frames(stack)
        last = np.stack([then(obs), frames(stack)])
        write(np.stack([obs, last[0]]), last)  # a batch of two: the general path, a last step
        stale = then(last[1])
        write(last[1], stale)  # continuing the batch, one step: the general path pins ``stale``
        if r % 4 == 3:
            again()
        obs = stale
        for _ in range(1 + r % 3):  # per-step adds: the kernel pins their next observations
            nxt = then(obs)
            write(obs, nxt)
            obs = nxt if rng.integers(3) else frames(stack)  # continuing, or fresh frames
        if r % 4 == 1:
            again()
        if r % 2:  # and a step that continues the one pinned now, on the per-step path
            write(obs, then(obs))
        batch = np.stack([stale, then(stale), frames(stack)])  # starts as ``stale`` did
        write(batch, np.stack([then(b) for b in batch]))
        assert_same(storage, ref)
    assert_no_leak(storage)
    assert storage._pool.slots > capacity + capacity // 64 + 2 * stack * 66  # it grew
