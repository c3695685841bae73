"""Writes after torch moved a storage's memory land in the live memory, with no crash.

Torch moves a CPU tensor's memory in place when it is pickled for another process
(``ForkingPickler``: spawn workers, queues) or shared (``share_memory_``). Every cached numpy
view or raw address of the storages must follow (``rbdata/storages/_memory.py``). Each case
runs in a child process (``tests/_moves.py``): a write through a stale view corrupts the heap
or segfaults, which is then a failed test, not a dead test run.
"""

from __future__ import annotations

import io
import itertools
import os
import sys
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pytest
import torch
from _child import ROOT, run_child

from rbdata import MemmapStorage, PrioritizedSampler, ReplayBuffer, TensorStorage
from rbdata.storages import _memory

KINDS = ["tensor", "huge", "memmap", "private"]


def _run(kind: str, how: str, tmp_path: Path) -> None:
    script = ROOT / "tests" / "_moves.py"
    done = run_child(
        f"import runpy, sys; sys.argv = {[str(script), kind, how, str(tmp_path)]!r}; "
        f"sys.path.insert(0, {str(ROOT / 'tests')!r}); "
        f"runpy.run_path({str(script)!r}, run_name='__main__')",
        timeout=240,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), (
        f"{kind}/{how}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_writes_after_a_move(kind: str, tmp_path: Path) -> None:
    """Pickle the storage / an item view, share one or all buffers; then every write path."""
    _run(kind, "all", tmp_path)


@pytest.mark.parametrize("kind", ["tensor", "huge", "private"])
def test_spawned_worker_sees_writes_made_after_the_first_epoch(kind: str, tmp_path: Path) -> None:
    _run(kind, "loader", tmp_path)


def test_guard_sees_a_move_of_any_leaf() -> None:
    storage = TensorStorage(10)
    storage.set(slice(0, 2), {"a": torch.zeros(2, 3), "b": torch.zeros(2, dtype=torch.int64)})
    watch = _memory.guard(storage.buffers)
    assert len(watch) == 1  # one arena: one pointer to compare on the per-step path
    assert not _memory.moved(watch)
    storage.buffers[1].share_memory_()  # moves the whole block
    assert _memory.moved(watch)
    assert all(b.is_shared() for b in storage.buffers)


def test_arena_leaves_are_disjoint_and_aligned() -> None:
    from rbdata._core.layout import Leaf

    leaves = [
        Leaf("a", (3,), torch.float32),
        Leaf("b", (), torch.bool),
        Leaf("c", (2, 2), torch.float64),
        Leaf("d", (0,), torch.int64),
        Leaf("e", (), torch.int16),
    ]
    bufs = _memory.arena(7, leaves)
    spans = []
    for buf, leaf in zip(bufs, leaves, strict=True):
        assert buf.shape == (7, *leaf.shape) and buf.dtype == leaf.dtype
        assert buf.is_contiguous() and buf.data_ptr() % leaf.dtype.itemsize == 0
        if buf.numel():
            spans.append((buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()))
        buf.fill_(1)  # every byte writable, no overlap (checked below)
    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # brute force: disjoint
    assert all(bool((b == 1).all()) for b in bufs)


def test_prioritized_sampler_pickled_then_updated_matches_a_fresh_one() -> None:
    """The trees travel as numpy copies: the sender's numba views stay on its own trees."""
    data = {"x": torch.arange(32.0)}
    p = torch.rand(32, generator=torch.Generator().manual_seed(0)) + 0.1

    def build() -> ReplayBuffer:
        rb = ReplayBuffer(
            TensorStorage(32),
            sampler=PrioritizedSampler(
                32, alpha=0.6, beta=0.4, generator=torch.Generator().manual_seed(1)
            ),
        )
        rb.extend(data)
        return rb

    moved, ref = build(), build()
    ForkingPickler(io.BytesIO()).dump(moved)
    for rb in (moved, ref):
        rb.update_priority(torch.arange(32), p)
        rb.update_priority(torch.tensor([3, 3, 7]), torch.tensor([5.0, 6.0, 0.5]))
    a = moved.sampler.priority_values()  # type: ignore[attr-defined]
    b = ref.sampler.priority_values()  # type: ignore[attr-defined]
    expect = (p + moved.sampler.eps) ** 0.6  # type: ignore[attr-defined]
    expect[3], expect[7] = (6.0 + 1e-8) ** 0.6, (0.5 + 1e-8) ** 0.6
    assert torch.equal(a, b)
    np.testing.assert_allclose(a.numpy(), expect.numpy(), rtol=1e-5)
    for _ in range(3):  # same generator state, same trees: the same draws
        i1, w1 = moved.sampler.draw(64)  # type: ignore[attr-defined]
        i2, w2 = ref.sampler.draw(64)  # type: ignore[attr-defined]
        assert torch.equal(i1, i2) and torch.equal(w1["weight"], w2["weight"])


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_forked_child_reads_what_was_written_after_a_share(tmp_path: Path) -> None:
    """share_memory_, then a fork: the child reads the parent's later writes (shared block)."""
    rb = ReplayBuffer(TensorStorage(16))
    rb.extend({"x": torch.zeros(16, 2)})
    for buf in rb.storage.buffers:  # type: ignore[attr-defined]
        buf.share_memory_()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(w)
        os.read(r, 1)  # wait for the parent's write
        ok = rb.storage[5]["x"].tolist() == [7.0, 7.0]
        os._exit(0 if ok else 1)
    os.close(r)
    rb.storage.set(5, {"x": torch.full((2,), 7.0)})  # the numpy path, after the move
    os.write(w, b"x")
    os.close(w)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


SB3_CHILD = """
import io
from multiprocessing.reduction import ForkingPickler

import numpy as np
from gymnasium import spaces

from rbdata.compat.sb3 import ReplayBuffer

for storage in ("tensor", "memmap"):
    rb = ReplayBuffer(8, spaces.Box(-10, 10, (3,)), spaces.Discrete(4), device="cpu",
                      storage=storage)
    obs = {}
    for step in range(20):  # 2.5 rounds of the ring, a move before each add after the 4th
        if step >= 4:
            ForkingPickler(io.BytesIO()).dump(rb)
            for buf in rb.storage.buffers:
                buf.share_memory_()
        o = np.full((1, 3), step, np.float32)
        rb.add(o, o + 1, np.array([step % 4]), np.array([step * 0.5]), np.array([False]),
               [{}])
        obs[step % 8] = step
    got = rb.sample(64)
    assert rb.size() == 8, rb.size()
    for o, a, r in zip(got.observations[:, 0].tolist(), got.actions[:, 0].tolist(),
                       got.rewards[:, 0].tolist(), strict=True):
        step = int(o)
        assert obs[step % 8] == step, (o, obs)
        assert a == step % 4 and r == step * 0.5, (o, a, r)
print("OK")
"""


def test_sb3_compat_buffer_writes_after_a_move() -> None:
    done = run_child(SB3_CHILD)
    assert done.returncode == 0 and done.stdout.strip() == "OK", (
        f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )


def _vm_flags(address: int) -> list[str]:
    """The ``VmFlags`` of the mapping holding ``address`` (``/proc/self/smaps``)."""
    text = Path("/proc/self/smaps").read_text()
    start = end = -1
    for line in text.splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
        elif head == "VmFlags:" and start <= address < end:
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_large_arena_is_advised_onto_huge_pages() -> None:
    """A storage of 16 MiB or more sits on one huge-page-aligned block, advised ``hg``."""
    rows = 800_000  # x (12 + 4 + 8) bytes: one 19.2 MB arena
    storage = TensorStorage(rows)
    ks = torch.arange(rows)
    storage.set(
        slice(0, rows),
        {"goal": ks[:, None].float().expand(-1, 3), "reward": -ks.float(), "action": ks},
    )
    bufs = storage.buffers
    assert bufs[0].data_ptr() % _memory.HUGE_PAGE == 0
    assert len(_memory.guard(bufs)) == 1  # still one block
    assert torch.equal(bufs[0][:, 1], ks.float()) and torch.equal(bufs[2], ks)
    assert torch.equal(storage[123_456]["reward"], torch.tensor(-123_456.0))
    small = _memory.arena(10, storage.layout.leaves)
    assert all(not b.any() for b in small)  # small arenas: plain zeros
    block = _memory.huge_block((5 << 20) + 123)
    assert block.numel() == (5 << 20) + 123 and not block.any()
    whole = torch.empty(0, dtype=torch.uint8).set_(block.untyped_storage())
    assert whole.numel() > block.numel() and not whole.any()  # the slack too: no stale bytes
    enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if (
        not sys.platform.startswith("linux")
        or not enabled.exists()
        or "[never]" in enabled.read_text()
    ):
        pytest.skip("no transparent huge pages here: the advice is not recorded")
    assert "hg" in _vm_flags(bufs[0].data_ptr())  # MADV_HUGEPAGE on the block's pages
    assert "hg" in _vm_flags(block.data_ptr() + (3 << 20))  # its whole huge pages: 4 MiB


def test_rebind_follows_each_mapping_and_refuses_a_mismatch() -> None:
    raws = [np.arange(8, dtype=np.uint8), np.arange(8, 16, dtype=np.uint8)]
    mapped = [_memory.mapping(raws[0]), None, _memory.mapping(raws[1])]
    buffers = [torch.zeros(2, dtype=torch.int32), torch.zeros(3), torch.zeros(2, dtype=torch.int32)]
    assert _memory.rebind(buffers, mapped)  # both mapped leaves were elsewhere
    addresses = [raw.__array_interface__["data"][0] for raw in raws]
    assert [buffers[0].data_ptr(), buffers[2].data_ptr()] == addresses
    assert buffers[2].view(torch.uint8).tolist() == list(range(8, 16))
    assert not _memory.rebind(buffers, mapped)  # nothing moved since
    with pytest.raises(ValueError, match="3 buffers for 2 mappings"):
        _memory.rebind(buffers, mapped[:2])


CONCURRENT_CHILD = """
import threading
import time
from multiprocessing.reduction import ForkingPickler

import torch
from tensordict import TensorDict

import tempfile

from rbdata import MemmapStorage, ReplayBuffer, TensorStorage

CAP, LEAVES = 100_000, 8  # a 12.8 MB arena: its copy into shared memory takes milliseconds
KIND = "tensor"


def storage():
    if KIND == "tensor":
        return TensorStorage(CAP)
    # a private copy (what ReplayBuffer.loads gives): its arena is allocated at the first write
    path = tempfile.mkdtemp() + "/rb"
    MemmapStorage(CAP, path=path).close()
    return MemmapStorage.open(path, copy_on_write=True)


def batch(ks, dtype=torch.float32):
    col = torch.tensor(list(ks), dtype=dtype)[:, None].expand(-1, 4).contiguous()
    return TensorDict({f"l{i}": col for i in range(LEAVES)}, [len(col)])


def one(k):
    return {f"l{i}": torch.full((4,), float(k)) for i in range(LEAVES)}


def write(rb, path, k):
    # items k, k + 1, ... at slots k, k + 1, ... through one write path; returns the next k
    if path == "add":  # the per-step path (add_fast, write_row)
        rb.add(one(k))
        return k + 1
    if path == "extend":  # small batches through numpy rows (extend_fast, write_rows)
        rb.extend(batch(range(k, k + 4)))
        return k + 4
    if path == "extend-cast":  # float64 data: the torch path (commit, slice copies)
        rb.extend(batch(range(k, k + 4), torch.float64))
        return k + 4
    if path == "set-one":  # one slot (the per-item write)
        rb.storage.set(k, one(k))
        return k + 1
    slots = list(range(k + 3, k - 1, -1))  # scattered slots: index_copy_
    rb.storage.set(torch.tensor(slots), batch(slots))
    return k + 4


lost = {}
for path in ("add", "extend", "extend-cast", "set-one", "set-slots"):
    rb = ReplayBuffer(storage())
    rb.extend(batch([0]))
    done, stop = [1], threading.Event()

    def writer():
        k = 1
        while not stop.is_set() and k < CAP - 8:
            k = done[0] = write(rb, path, k)

    thread = threading.Thread(target=writer)
    thread.start()
    while done[0] < 300 and thread.is_alive():
        time.sleep(0.001)
    for _ in range(3):  # what a spawn DataLoader does; the first one moves the memory
        ForkingPickler.dumps(rb.storage)
    start = done[0]
    while done[0] < start + 300 and thread.is_alive():
        time.sleep(0.001)
    stop.set()
    thread.join()
    n = done[0]
    want = torch.arange(n, dtype=torch.float32)[:, None].expand(-1, 4)
    lost[path] = sum(int((b[:n] != want).any(1).sum()) for b in rb.storage.buffers)
    assert rb.storage.buffers[0].is_shared()
print(lost)
assert not any(lost.values()), lost
print("OK")
"""


@pytest.mark.parametrize("kind", ["tensor", "private"])
def test_no_write_lost_to_a_concurrent_pickle_for_another_process(kind: str) -> None:
    """A thread writes through every write path while another pickles the storage for spawn.

    Each row holds its write number: every row written is checked (the original code lost
    hundreds per path, a write into the block being left; or crashed on freed memory).
    ``private``: a copy-on-write MemmapStorage (what ``ReplayBuffer.loads`` gives), whose
    pickle sends its rows too.
    """
    code = CONCURRENT_CHILD.replace('KIND = "tensor"', f"KIND = {kind!r}")
    done = run_child(code, timeout=240)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), (
        f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )


def _eight_leaves(n: int) -> dict[str, torch.Tensor]:
    ks = torch.arange(n)
    dtypes = [torch.float32, torch.int64, torch.bool, torch.float64]
    dtypes += [torch.int16, torch.uint8, torch.bfloat16, torch.int32]
    widths = [4, 1, 3, 2, 5, 7, 2, 1]
    return {
        f"l{i}": (ks[:, None] * (i + 1) % 251).to(dtype).expand(-1, w).contiguous()
        for i, (dtype, w) in enumerate(zip(dtypes, widths, strict=True))
    }


def _one_block(storage: TensorStorage) -> bool:
    return len({b.untyped_storage().data_ptr() for b in storage.buffers}) == 1


@pytest.mark.parametrize("kind", ["tensor", "private"])
@pytest.mark.parametrize("how", ["pickle", "cloudpickle", "deepcopy"])
def test_plain_pickle_sends_the_data_once_and_loads_one_arena(
    how: str, kind: str, tmp_path: Path
) -> None:
    import copy
    import pickle

    n = 40_000
    storage: TensorStorage = TensorStorage(n)
    if kind == "private":  # copy-on-write, the arena allocated at its first write
        MemmapStorage(n, path=tmp_path / "rb").close()
        storage = MemmapStorage.open(tmp_path / "rb", copy_on_write=True)
    data = _eight_leaves(n)
    storage.set(slice(0, n), data)
    data_bytes = sum(t.numel() * t.element_size() for t in data.values())  # independent
    if how == "deepcopy":
        got = copy.deepcopy(storage)
    else:
        dumps = pytest.importorskip("cloudpickle").dumps if how == "cloudpickle" else pickle.dumps
        blob = dumps(storage)
        assert len(blob) <= 1.1 * data_bytes + 64 * 1024, (len(blob), data_bytes)
        got = pickle.loads(blob)
    assert _one_block(got)
    assert got.buffers[0].untyped_storage().data_ptr() != storage.buffers[0].data_ptr()
    assert len(got) == n
    for key, want in data.items():
        assert torch.equal(got[torch.arange(n)][key], want), key
    got.set(0, {k: v[1] for k, v in data.items()})  # a copy: the original keeps its rows
    assert torch.equal(storage[0]["l0"], data["l0"][0])
    assert torch.equal(got[0]["l0"], data["l0"][1])


def test_pickle_for_another_process_still_shares_the_memory() -> None:
    """``ForkingPickler`` sends shared-memory handles: no copy, later writes are seen."""
    rb = ReplayBuffer(TensorStorage(16))
    rb.extend({"x": torch.zeros(16, 2), "y": torch.zeros(16, dtype=torch.int64)})
    blob = ForkingPickler.dumps([rb, rb.storage, rb])  # the lock is not held across parts
    assert len(blob) < 8 * 1024  # handles, not the data
    got, storage, again = ForkingPickler.loads(blob)
    assert storage is got.storage and again is got
    assert _one_block(got.storage) and all(b.is_shared() for b in rb.storage.buffers)
    rb.add({"x": torch.full((2,), 3.0), "y": torch.tensor(9)})  # the per-step path, slot 0
    assert got.storage[0]["x"].tolist() == [3.0, 3.0] and int(got.storage[0]["y"]) == 9
    got.storage.set(1, {"x": torch.full((2,), 4.0), "y": torch.tensor(8)})
    assert rb.storage[1]["x"].tolist() == [4.0, 4.0]


def test_shipment_refuses_parts_that_do_not_match() -> None:
    from rbdata._core.layout import Leaf

    leaves = [Leaf("a", (2,), torch.float32), Leaf("b", (), torch.int64)]
    bufs = _memory.arena(3, leaves)
    with pytest.raises(ValueError, match="buffers: one per leaf, got 1 for 2"):
        _memory.Shipment(bufs[:1], leaves, _memory.move_lock())
    with pytest.raises(
        ValueError, match=r"data: 48 bytes for 3 items of 2 leaves, got uint8 \(47,\)"
    ):
        _memory.unpack_arena(3, leaves, np.zeros(47, np.uint8))  # 3 x (2 x 4 + 8) bytes
