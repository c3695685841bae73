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

from rbdata import PrioritizedSampler, ReplayBuffer, TensorStorage
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
    from rbdata._layout import Leaf

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
