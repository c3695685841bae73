"""A forking server for SIGKILL tests: one interpreter imports everything once, forks workers.

A test's script defines ``work(root, seed, log)`` (``log`` an unbuffered file descriptor of
``root / "log"``); :data:`SERVE` is appended to it. :class:`Zygote` runs the script and asks it
to ``run`` a worker (its pid comes back) and to ``reap`` it (its wait status comes back), so a
trial costs a ``fork``, not an interpreter start and the imports.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

__all__ = ["SERVE", "TIMEOUT", "Zygote"]

TIMEOUT = 60.0  # any single wait (the zygote's imports on a loaded 2-core machine included)

SERVE = r"""
print("zygote ready", flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "run":
        root, seed = Path(args[0]), int(args[1])
        pid = os.fork()
        if pid == 0:
            try:
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                log = os.open(root / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    work(root, seed, log)
                except BaseException:
                    os.write(log, traceback.format_exc().encode())
            finally:
                os._exit(1)
        print(pid, flush=True)
    elif cmd == "reap":
        _, status = os.waitpid(int(args[0]), 0)
        print(status, flush=True)
"""


class Zygote:
    """The forking server: ``run`` starts a worker, ``reap`` collects its exit status.

    Args:
        tmp: a directory for the server's stderr (shown when it stops answering).
        script: Python source defining ``work(root, seed, log)``; it must import ``os``,
            ``sys``, ``traceback`` and ``Path``, and should call ``torch.set_num_threads(1)``
            (a forked child must not wait on the parent's intra-op thread pool).
        argv: the script's ``sys.argv[1:]``.
    """

    def __init__(self, tmp: Path, script: str, argv: Sequence[object] = ()) -> None:
        self._stderr_path = tmp / "zygote.stderr"
        self._stderr: IO[bytes] = open(self._stderr_path, "wb")  # noqa: SIM115
        root = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script + SERVE, *(str(v) for v in argv)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            bufsize=0,
            env={**os.environ, "PYTHONPATH": path},
        )
        self.live: set[int] = set()
        assert self._readline() == "zygote ready"

    def _readline(self) -> str:
        out = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], TIMEOUT)
        line = out.readline().decode() if ready else ""
        if not line.endswith("\n"):
            self._stderr.flush()
            err = self._stderr_path.read_text(errors="replace")[-4000:]
            raise AssertionError(f"the zygote did not answer (exit {self.proc.poll()}):\n{err}")
        return line.strip()

    def _ask(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()
        return self._readline()

    def run(self, root: Path, seed: int) -> int:
        """Fork a worker running ``work(root, seed, log)``; return its pid."""
        pid = int(self._ask(f"run {root} {seed}"))
        self.live.add(pid)
        return pid

    def reap(self, pid: int) -> int:
        """Wait for worker ``pid``; return its wait status (``os.WIFSIGNALED`` etc.)."""
        status = int(self._ask(f"reap {pid}"))
        self.live.discard(pid)
        return status

    def close(self) -> None:
        """Kill the workers still alive and stop the server."""
        for pid in self.live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.live.clear()
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # the zygote's loop ends
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=10)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._stderr.close()
