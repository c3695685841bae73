"""Converted entries on a read-only file system (a shared cluster cache, a container image).

The cache is made read-only for real: a bind mount remounted ``ro`` in a private mount
namespace (``unshare -rm``; no privileges needed where user namespaces are allowed), so every
open for writing, ``mkdir``, rename or lock file is ``OSError: [Errno 30] Read-only file
system``, as the kernel reports it on such a cache. Where ``unshare`` is refused, a non-root
user gets ``chmod -R a-w`` instead (``EACCES`` for the same calls); root without ``unshare``
skips (chmod does not bind root).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbdata.datasets import D4RL, OGBench
from tests._child import ROOT
from tests._d4rl_files import write_d4rl_file
from tests._ogbench_files import write_ogbench_file

D4RL_ID = "hopper-medium-v2"
OGBENCH_ID = "pointmaze-medium-navigate-v0"
ROWS = 300


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _ro_mount_works(directory: Path) -> bool:
    """Whether ``unshare -rm`` can bind-mount ``directory`` read-only (and writes then fail)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    d = shlex.quote(str(directory))
    script = f"mount --bind -o ro {d} {d} && ! touch {d}/.rbdata-ro-probe 2>/dev/null"
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, check=False)
    return probe.returncode == 0


def _snapshot(root: Path) -> dict[str, tuple[int, float, int]]:
    """Every path below ``root``: mode, mtime, size (any write or new file changes it)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath, name)
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_mtime_ns, st.st_size)
    return out


def run_read_only(cache: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that sees ``cache`` read-only (see the module)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RBDATA_HOME": str(cache)}
    python = [sys.executable, "-c", textwrap.dedent(code)]
    if _ro_mount_works(cache):
        mount = f"mount --bind -o ro {shlex.quote(str(cache))} {shlex.quote(str(cache))}"
        command = ["unshare", "-rm", "sh", "-c", f'{mount} && exec "$@"', "sh", *python]
    elif os.geteuid() != 0:
        for dirpath, _, filenames in os.walk(cache):
            for name in [dirpath, *(os.path.join(dirpath, f) for f in filenames)]:
                writable = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
                os.chmod(name, os.stat(name).st_mode & ~writable)
        command = python
    else:
        pytest.skip("no read-only view: unshare -rm refused and root ignores chmod")
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT, check=False
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache with D4RL and OGBench entries in both backends, built from local files."""
    base = tmp_path_factory.mktemp("ro")
    home = base / "home"
    h5, npz = base / "src" / "hopper.hdf5", base / "src" / "pointmaze.npz"
    h5.parent.mkdir()
    write_d4rl_file(h5, n=ROWS)
    write_ogbench_file(npz, n=ROWS)
    for backend in ("memmap", "arrow"):
        D4RL(D4RL_ID, home, file=h5, sha256=_sha(h5), backend=backend, progress=False).close()
        OGBench(
            OGBENCH_ID, home, file=npz, sha256=_sha(npz), backend=backend, progress=False
        ).close()
    yield home
    for dirpath, _, _ in os.walk(home):  # a chmod fallback: writable again, for the cleanup
        os.chmod(dirpath, 0o755)


CHILD = f"""
    import pickle, sys, tempfile, warnings
    from pathlib import Path
    import numpy as np, torch
    from rbdata.datasets import D4RL, OGBench
    from tests import _d4rl_files, _ogbench_files
    warnings.simplefilter("error")
    scratch = Path(tempfile.mkdtemp())  # outside the cache: the same generated arrays again
    d4rl = _d4rl_files.write_d4rl_file(scratch / "a.hdf5", n={ROWS})
    ogbench = _ogbench_files.write_ogbench_file(scratch / "b.npz", n={ROWS})
    references = {{
        "d4rl": _d4rl_files.reference_rows(d4rl),
        "ogbench": _ogbench_files.reference_rows(ogbench),
    }}
    for backend in ("memmap", "arrow"):
        for family, make in (
            ("d4rl", lambda: D4RL({D4RL_ID!r}, download=False, backend=backend)),
            ("ogbench", lambda: OGBench({OGBENCH_ID!r}, download=False, backend=backend)),
        ):
            ds = make()
            copy = pickle.loads(pickle.dumps(ds))  # what a DataLoader worker gets
            batch = copy.__getitems__(torch.arange(len(copy)))
            expected = references[family]
            assert len(ds) == len(expected), (len(ds), len(expected))
            for key in expected[0]:
                column = np.stack([row[key] for row in expected])
                assert np.array_equal(batch[key].numpy(), column), (family, backend, key)
            assert ds.sample(8)["observation"].shape[0] == 8
            copy.close()
            ds.close()
            print("ok", family, backend, flush=True)
"""


def test_entries_open_on_a_read_only_cache(cache: Path) -> None:
    before = _snapshot(cache)
    done = run_read_only(cache, CHILD)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:-1] == [
        f"ok {family} {backend}"
        for backend in ("memmap", "arrow")
        for family in ("d4rl", "ogbench")
    ], done.stdout + done.stderr
    assert "Warning" not in done.stderr, done.stderr  # nothing failed to write at exit either
    assert _snapshot(cache) == before
