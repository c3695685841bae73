"""A storage commits memory as its items are written, never its whole capacity up front.

A buffer of pixel stacks is sized for a whole run (``TensorStorage(100_000)`` of 4x84x84
observation and next observation stacks is 5.3 GiB) but filled step by step: zero-filling
the capacity at the first write committed all of it at once (and took seconds). Each case
runs in a fresh child process (``tests/_child.py``), so that no other test's memory moves the
resident-set figures it reads from ``/proc/self/status``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _child import run_child

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads VmRSS from /proc/self/status"
)

#: 20,000 steps of two 4x84x84 uint8 stacks (1.13 GB of address space); 200 are written
CHILD = """
import sys

import torch
from tensordict import TensorDict

from rbdata.storages import ArrowStorage, MemmapStorage, TensorStorage

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

kind, path = sys.argv[1], sys.argv[2]
capacity, n = 20_000, 200
obs = torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8)
batch = TensorDict(
    {"observation": obs, "action": torch.zeros(n, dtype=torch.int64),
     "next": {"observation": obs.roll(1, 0), "reward": torch.ones(n),
              "done": torch.zeros(n, dtype=torch.bool)}},
    [n],
)
if kind == "tensor":
    storage = TensorStorage(capacity)
elif kind == "memmap":
    storage = MemmapStorage(capacity, path=path + "/m")
else:
    storage = ArrowStorage(capacity, path=path + "/a", chunk_size=8192)
before = rss()
storage.set(slice(0, n), batch)
grown = rss() - before
assert torch.equal(storage[n - 1]["observation"], obs[n - 1])
assert not storage.buffers[0][n:].any() if kind == "tensor" else True
print("GROWN", grown, capacity * 2 * obs[0].numel(), n * 2 * obs[0].numel())
"""


@pytest.mark.parametrize("kind", ["tensor", "memmap", "arrow"])
def test_the_first_write_commits_what_it_writes(kind: str, tmp_path: Path) -> None:
    done = run_child(CHILD.replace("sys.argv[1], sys.argv[2]", f"{kind!r}, {str(tmp_path)!r}"))
    assert done.returncode == 0, done.stderr[-3000:]
    grown, capacity_bytes, written = (int(w) for w in done.stdout.split("GROWN")[1].split())
    # 11 MB written (plus up to a 2 MiB huge page per leaf end): far below the 1.13 GB
    assert grown < max(4 * written, 64 << 20), (grown, written)
    assert grown < capacity_bytes // 10, (grown, capacity_bytes)


def test_a_large_arena_is_private_to_a_fork() -> None:
    """The arena's mapping is private: a forked child writes a copy, as it would the heap."""
    done = run_child(
        """
        import os
        import torch
        from rbdata.storages import TensorStorage, _memory

        storage = TensorStorage(1 << 16)
        storage.set(slice(0, 2), {"a": torch.ones(2, 64)})  # a 16 MiB arena: a huge block
        buf = storage.buffers[0]
        assert buf.untyped_storage().nbytes() >= _memory.HUGE_MIN
        pid = os.fork()
        if pid == 0:
            buf[0] = 7.0
            os._exit(0 if float(buf[0, 0]) == 7.0 else 1)
        _, status = os.waitpid(pid, 0)
        assert status == 0 and float(buf[0, 0]) == 1.0, status
        print("OK")
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-3000:]
