"""CleanRL's ``dqn_atari.py`` with rbdata's frame buffer or SB3's: memory and the buffer's time.

The script is CleanRL's own file, run with only its replay buffer swapped: the import line of
``ReplayBuffer`` and the ``rb = ReplayBuffer(...)`` call are rewritten in a copy (nothing else
in it changes), to

- ``--buffer rbdata``: ``from rbdata.compat.sb3 import ReplayBuffer`` and
  ``ReplayBuffer(..., storage="frames", codec=CODEC)`` (``--codec``, ``lz4`` by default);
- ``--buffer sb3``: ``from stable_baselines3.common.buffers import ReplayBuffer``, unchanged
  arguments. SB3's 1M-step buffer needs 26.3 GiB, so give a smaller ``--buffer-size``.

The copy runs in a child process (``runpy``), where the buffer class's ``add`` and ``sample``
are wrapped with a timer. At the end the child reports: total wall time from the script's
start, the time spent inside ``rb.add`` and ``rb.sample`` (their share of the wall time),
and the process's ``VmRSS`` and ``VmHWM`` (peak) from ``/proc/self/status`` (also printed every
``--every`` adds). Everything after ``--`` goes to CleanRL's script (``--total-timesteps``,
``--buffer-size``, ``--env-id``...). It downloads nothing. Not part of ``make bench`` (it runs
for tens of minutes) nor of ``make test``.

Getting the script: clone https://github.com/vwxyzjn/cleanrl (its ``cleanrl_utils`` package
must sit beside ``cleanrl/``: the repository root is put on ``sys.path``). It needs ``tyro``,
``tensorboard`` and ``ale-py`` (which ships the ROMs); ``PYTHONPATH`` may add them from a
separate folder (``pip install --target DIR``). CleanRL pins gymnasium 0.29; under gymnasium
1.x the child maps the names the script uses onto 1.x's (``GrayScaleObservation``,
``FrameStack``, the same-step autoreset of ``SyncVectorEnv`` with ``final_observation`` and a
list ``final_info``) and registers ale-py's environments; under 0.29 it changes nothing.

Usage::

    .venv/bin/python tests/benchmarks/bench_cleanrl.py ~/cleanrl/cleanrl/dqn_atari.py \\
        --buffer rbdata --codec lz4 -- --buffer-size 1000000 --total-timesteps 200000
    .venv/bin/python tests/benchmarks/bench_cleanrl.py ~/cleanrl/cleanrl/dqn_atari.py \\
        --buffer sb3 -- --buffer-size 300000 --total-timesteps 200000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GIB = 1 << 30
IMPORTS = (
    "from cleanrl_utils.buffers import ReplayBuffer",
    "from stable_baselines3.common.buffers import ReplayBuffer",
)


def swapped(source: str, buffer: str, codec: str | None) -> str:
    """CleanRL's source with only the ``ReplayBuffer`` import and construction changed."""
    found = [line for line in IMPORTS if line in source]
    if len(found) != 1:
        raise SystemExit(f"script: expected one of {IMPORTS} in it, found {len(found)}")
    new_import = "from rbdata.compat.sb3 import ReplayBuffer" if buffer == "rbdata" else IMPORTS[1]
    source = source.replace(found[0], new_import)
    if buffer != "rbdata":
        return source
    call = re.search(r"\brb = ReplayBuffer\(", source)
    if call is None:
        raise SystemExit("script: no `rb = ReplayBuffer(` call found")
    depth, end = 0, call.end() - 1
    for end in range(call.end() - 1, len(source)):  # the call's closing parenthesis
        depth += {"(": 1, ")": -1}.get(source[end], 0)
        if depth == 0:
            break
    kwargs = ['storage="frames"', "codec=None" if codec is None else f'codec="{codec}"']
    line = source.rfind("\n", 0, end) + 1
    if source[line:end].strip():  # `...)` closes the last argument's line
        head = source[:end].rstrip()
        sep = "" if head.endswith(",") else ","
        return head + sep + " " + ", ".join(kwargs) + source[end:]
    last = source[source.rfind("\n", 0, line - 1) + 1 : line]  # the last argument's line
    indent = last[: len(last) - len(last.lstrip())]
    return source[:line] + "".join(f"{indent}{k},\n" for k in kwargs) + source[line:]


# --- the child: shims, timers, run ---------------------------------------------------------
def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def _unbatch(info: dict[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s own info from gymnasium 1.x's batched one (values with their masks)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        out[key] = _unbatch(value, i) if isinstance(value, dict) else value[i]
    return out


def _gymnasium_029_names() -> None:
    """Map what CleanRL's gymnasium-0.29 script calls onto gymnasium 1.x (no-op on 0.29)."""
    import gymnasium as gym
    import numpy as np

    try:
        import ale_py

        gym.register_envs(ale_py)
    except (ImportError, AttributeError):
        pass
    if int(gym.__version__.split(".")[0]) < 1:
        return
    wrappers = gym.wrappers
    if not hasattr(wrappers, "GrayScaleObservation"):
        wrappers.GrayScaleObservation = wrappers.GrayscaleObservation
    if not hasattr(wrappers, "FrameStack"):
        wrappers.FrameStack = wrappers.FrameStackObservation
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    class SyncVectorEnv029(SyncVectorEnv):
        """0.29's vector env: reset in the same step, ``final_observation``, ``final_info``."""

        def __init__(self, env_fns: Any, **kwargs: Any) -> None:
            kwargs.setdefault("autoreset_mode", AutoresetMode.SAME_STEP)
            super().__init__(env_fns, **kwargs)

        def step(self, actions: Any) -> Any:
            obs, rewards, terms, truncs, infos = super().step(actions)
            if "final_obs" in infos:
                n, ended = self.num_envs, infos["_final_obs"]
                final_obs = np.array([None] * n, dtype=object)
                final_info = np.array([None] * n, dtype=object)
                for i in np.flatnonzero(ended):
                    final_obs[i] = infos["final_obs"][i]
                    final_info[i] = _unbatch(infos["final_info"], int(i))
                infos["final_observation"], infos["_final_observation"] = final_obs, ended
                infos["final_info"], infos["_final_info"] = final_info, ended
            return obs, rewards, terms, truncs, infos

    gym.vector.SyncVectorEnv = SyncVectorEnv029


def _child(args: argparse.Namespace, script_args: list[str]) -> None:
    _gymnasium_029_names()
    if args.buffer == "rbdata":
        from rbdata.compat.sb3 import ReplayBuffer
    else:
        from stable_baselines3.common.buffers import ReplayBuffer
    timer = {"add": 0.0, "sample": 0.0, "adds": 0, "samples": 0}
    clock = time.perf_counter
    add, sample = ReplayBuffer.add, ReplayBuffer.sample
    start = clock()

    def timed_add(self: Any, *a: Any, **kw: Any) -> None:
        t = clock()
        add(self, *a, **kw)
        timer["add"] += clock() - t
        timer["adds"] += 1
        if timer["adds"] % args.every == 0:
            rss = _status()
            print(
                f"[bench] {timer['adds']} adds, {clock() - start:.0f} s, "
                f"VmRSS {rss['VmRSS'] / GIB:.2f} GiB, VmHWM {rss['VmHWM'] / GIB:.2f} GiB, "
                f"add {timer['add']:.1f} s, sample {timer['sample']:.1f} s",
                file=sys.stderr,
                flush=True,
            )

    def timed_sample(self: Any, *a: Any, **kw: Any) -> Any:
        t = clock()
        out = sample(self, *a, **kw)
        timer["sample"] += clock() - t
        timer["samples"] += 1
        return out

    ReplayBuffer.add, ReplayBuffer.sample = timed_add, timed_sample
    sys.argv = [args.script, *script_args]
    sys.path.insert(0, str(Path(args.original).resolve().parents[1]))  # cleanrl_utils
    runpy.run_path(args.script, run_name="__main__")
    wall = clock() - start
    report = {"wall_s": wall, **timer, **_status()}
    report["buffer_share"] = (timer["add"] + timer["sample"]) / wall
    print("[bench-result] " + json.dumps(report), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", help="path of CleanRL's cleanrl/dqn_atari.py")
    parser.add_argument("--buffer", choices=("rbdata", "sb3"), default="rbdata")
    parser.add_argument("--codec", default="lz4", help="rbdata's codec: none, lz4 or zstd")
    parser.add_argument("--every", type=int, default=50_000, help="print memory every N adds")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--original", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    script_args = argv[cut + 1 :]
    if args.child:
        _child(args, script_args)
        return 0
    codec = None if args.codec == "none" else args.codec
    source = Path(args.script).read_text()
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / Path(args.script).name  # same file name: CleanRL's exp_name
        copy.write_text(swapped(source, args.buffer, codec))
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            str(copy),
            "--child",
            "--buffer",
            args.buffer,
            "--every",
            str(args.every),
            "--original",
            str(Path(args.script).resolve()),
            "--",
            *script_args,
        ]
        print("$ " + " ".join([cmd[0], args.script, "--buffer", args.buffer, *script_args]))
        sys.stdout.flush()  # the child's stderr (progress, warnings) passes through
        done = subprocess.run(
            cmd, cwd=tmp, stdout=subprocess.PIPE, text=True, check=False, env=os.environ
        )
    result = [line for line in done.stdout.splitlines() if line.startswith("[bench-result]")]
    if done.returncode or not result:
        print(done.stdout[-3000:])
        return 1
    r = json.loads(result[0].split(" ", 1)[1])
    label = f"rbdata frames ({args.codec})" if args.buffer == "rbdata" else "SB3 ReplayBuffer"
    print(
        f"{label}: wall {r['wall_s']:.0f} s, add {r['add']:.1f} s ({r['adds']} calls, "
        f"{r['add'] / max(r['adds'], 1) * 1e6:.0f} us), sample {r['sample']:.1f} s "
        f"({r['samples']} calls, {r['sample'] / max(r['samples'], 1) * 1e3:.2f} ms), "
        f"buffer share {r['buffer_share']:.1%}, VmRSS {r['VmRSS'] / GIB:.2f} GiB, "
        f"VmHWM {r['VmHWM'] / GIB:.2f} GiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
