"""Loading a checkpoint while another process dumps the same path.

Each ``dumps`` publishes a new generation (``CURRENT`` switched to a new ``ckpt-*`` folder) and
removes the old one, so a load that resolved ``CURRENT`` before the switch may find its files
gone. Such a load must retry on the new generation, never report a corrupt checkpoint, and
never return a mix of two generations.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from rbdata import MixedBuffer, ReplayBuffer
from rbdata.checkpoint import describe
from rbdata.storages import ArrowStorage, MemmapStorage, TensorStorage
from tests._child import ROOT

CAPACITY = 64
KINDS = ("memmap", "arrow", "tensor")

# a child that dumps generation g (every item's "gen" is g, its "i" the slot, n = 1 + g % cap
# items) in a loop until the test creates <root>/stop
DUMPER = """
    import sys, time, torch
    from pathlib import Path
    from tensordict import TensorDict
    from rbdata import MixedBuffer, ReplayBuffer
    from rbdata.storages import ArrowStorage, MemmapStorage, TensorStorage
    root, cap, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    make = {
        "memmap": lambda: MemmapStorage(cap),
        "arrow": lambda: ArrowStorage(cap, chunk_size=16),
        "tensor": lambda: TensorStorage(cap),
    }

    def buffer(kind, g):
        rb = ReplayBuffer(make[kind](), batch_size=4)
        n = 1 + g % cap
        rb.extend(TensorDict({"gen": torch.full((n,), g), "i": torch.arange(n)}, batch_size=[n]))
        return rb

    end, g = time.monotonic() + 60, 0
    while time.monotonic() < end and not (root / "stop").exists():
        if mode == "buffers":
            for kind in make:
                buffer(kind, g).dumps(root / kind, fsync=False)
        else:  # one mixture of a memmap and a tensor buffer, both of generation g
            sources = {"m": buffer("memmap", g), "t": buffer("tensor", g)}
            MixedBuffer(sources, {"m": 1, "t": 1}, batch_size=4).dumps(root / "mixed", fsync=False)
        g += 1
        if g == 1:
            print("ready", flush=True)
"""


def _generation(rb: ReplayBuffer) -> int:
    """The generation of a whole one: one ``gen`` value, ``n = 1 + gen % cap`` items in order."""
    n = len(rb)
    items = rb.storage[torch.arange(n)]
    gens = items["gen"].unique().tolist()
    assert len(gens) == 1, gens
    assert n == 1 + gens[0] % CAPACITY, (n, gens)
    assert items["i"].tolist() == list(range(n))
    return int(gens[0])


@contextmanager
def _dumping(root: Path, mode: str) -> Iterator[None]:
    """A child process dumping to ``root`` in a loop while the body runs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", textwrap.dedent(DUMPER), str(root), str(CAPACITY), mode]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    ) as child:
        try:
            assert child.stdout is not None and child.stderr is not None
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            yield
            assert child.poll() is None, child.stderr.read()  # it dumped all along
            (root / "stop").touch()
            _, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
        finally:
            if child.poll() is None:
                child.kill()


def _race(load: Callable[[], None], seconds: float = 2.5) -> tuple[int, list[str]]:
    """Call ``load`` for ``seconds``; the number of calls and the errors they raised."""
    refused: list[str] = []
    loads = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            load()
        except Exception as err:  # a race may show as any error: count them all
            refused.append(f"{type(err).__name__}: {err}")
        loads += 1
    return loads, refused


def _close(rb: ReplayBuffer) -> None:
    close = getattr(rb.storage, "close", None)
    if close is not None:
        close()


def test_buffer_loads_while_another_process_dumps(tmp_path: Path) -> None:
    into = {
        "memmap": ReplayBuffer(MemmapStorage(CAPACITY), batch_size=4),
        "arrow": ReplayBuffer(ArrowStorage(CAPACITY, chunk_size=16), batch_size=4),
        "tensor": ReplayBuffer(TensorStorage(CAPACITY), batch_size=4),
    }

    def load() -> None:
        for kind in KINDS:
            path = tmp_path / kind
            rb = ReplayBuffer.loads(path)
            _generation(rb)
            _close(rb)
            into[kind].load(path)  # rb.load (rb.loads on a buffer) too
            _generation(into[kind])
            length = describe(path).storage.length  # rbdata inspect's reader
            assert 1 <= length <= CAPACITY, length

    with _dumping(tmp_path, "buffers"):
        loads, refused = _race(load)
    assert loads > 5, loads  # the loop raced the dumper for real
    assert refused == [], f"{len(refused)} of {loads} rounds refused: {refused[:3]}"


def test_mixture_loads_while_another_process_dumps(tmp_path: Path) -> None:
    path = tmp_path / "mixed"
    sources = {
        "m": ReplayBuffer(MemmapStorage(CAPACITY), batch_size=4),
        "t": ReplayBuffer(TensorStorage(CAPACITY), batch_size=4),
    }
    into = MixedBuffer(sources, {"m": 1, "t": 1}, batch_size=4)

    def load() -> None:
        new = MixedBuffer.loads(path)
        gens = {_generation(new.sources[name]) for name in ("m", "t")}
        assert len(gens) == 1, gens  # both sources of one generation
        for name in ("m", "t"):
            _close(new.sources[name])
        into.load(path)
        assert len({_generation(sources[name]) for name in ("m", "t")}) == 1

    with _dumping(tmp_path, "mixed"):
        loads, refused = _race(load)
    assert loads > 5, loads
    assert refused == [], f"{len(refused)} of {loads} rounds refused: {refused[:3]}"
