"""Run Stable-Baselines3's own tests with rbdata's buffers in place of SB3's.

Usage (from the repository root, in an environment with stable-baselines3 installed)::

    python tests/sb3_suite/run_sb3_tests.py                  # SB3's tests, our buffers
    python tests/sb3_suite/run_sb3_tests.py --swap none      # the same tests, SB3's buffers
    python tests/sb3_suite/run_sb3_tests.py --sb3-src DIR -- -x -k dtypes

SB3's tests are not in its wheel: they are read from ``--sb3-src`` (an unpacked source tree
with ``tests/``), by default the sdist of the installed version, fetched once with
``pip download`` into ``--cache`` (this needs the package index). The run itself is offline.

Which tests: the files that build, fill, sample, save or load a replay buffer
(:data:`FILES`); ``--files`` picks others. The swap is ``sb3_swap.py`` (a pytest plugin, see
its docstring): ``--swap all`` (default) puts ``rbdata.compat.sb3.ReplayBuffer`` and
``DictReplayBuffer`` in SB3's place everywhere and rebuilds SB3's ``NStepReplayBuffer`` and
``HerReplayBuffer`` on them; ``--swap buffers`` leaves those two on SB3's classes.
Measured on 2 shared CPU cores: about 15-20 minutes (the learning tests dominate).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

__all__ = ["FILES", "main", "sb3_source"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
#: SB3's test files that touch the replay buffer object (2.9.2: 284 tests)
FILES = (
    "tests/test_buffers.py",
    "tests/test_n_step_replay.py",
    "tests/test_save_load.py",
    "tests/test_dict_env.py",
    "tests/test_her.py",
)


def sb3_source(cache: Path) -> Path:
    """The unpacked sdist of the installed stable-baselines3 (downloaded once into ``cache``)."""
    version = metadata.version("stable-baselines3")
    tree = cache / f"stable_baselines3-{version}"
    if (tree / "tests").is_dir():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"stable_baselines3-{version}.tar.gz"
    if not archive.exists():
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*pip, "-d", str(cache), f"stable-baselines3=={version}"], check=True)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12: no path tricks in members
            tar.extractall(cache, filter="data")
        else:  # pragma: no cover
            tar.extractall(cache)
    return tree


def main(argv: list[str] | None = None) -> int:
    """Run the tests; returns pytest's exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sb3-src", type=Path, help="SB3 source tree with tests/")
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache" / "sb3")
    parser.add_argument("--swap", choices=("all", "buffers", "none"), default="all")
    parser.add_argument("--files", nargs="+", default=list(FILES))
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args(argv)
    src = args.sb3_src or sb3_source(args.cache)
    env = dict(os.environ, RBDATA_SB3_SWAP=args.swap)
    path = [str(ROOT), str(HERE), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    cmd = [sys.executable, "-m", "pytest", "-p", "sb3_swap", "-p", "no:cacheprovider"]
    cmd += ["-q", "-rfE", *args.files, *args.pytest_args]
    return subprocess.run(cmd, cwd=src, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
