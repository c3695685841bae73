"""Test helpers: OGBench-layout ``.npz`` files and a row-by-row reference reader.

The files follow OGBench's data-generation scripts (``data_gen_scripts/generate_*.py``): one row
``(s_t, a_t)`` per step, ``terminals`` True on each trajectory's last row (whose next
observation is not stored), ``qpos``/``qvel`` float32 and ``button_states`` int64 beside them,
written with ``np.savez_compressed`` (or ``np.savez``). A "regular" file also holds
``next_observations``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def write_ogbench_file(
    path: Path,
    n: int = 600,
    *,
    seed: int = 0,
    compact: bool = True,
    compressed: bool = True,
    infos: bool = True,
    last_terminal: bool = True,
    obs_shape: tuple[int, ...] = (5,),
    obs_dtype: Any = np.float32,
    byteorder: str = "=",
) -> dict[str, np.ndarray]:
    """Write an OGBench-layout ``.npz`` with random data; return its arrays (by npz key)."""
    rng = np.random.default_rng(seed)
    if np.dtype(obs_dtype).kind == "u":
        obs = rng.integers(0, 256, (n, *obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((n, *obs_shape)).astype(obs_dtype)
    terminals = np.zeros(n, bool)
    ends = np.cumsum(rng.integers(1, 60, n))  # trajectories of 1 to 59 rows
    terminals[ends[ends < n]] = True
    terminals[-1] = last_terminal
    arrays: dict[str, np.ndarray] = {
        "observations": obs,
        "actions": rng.uniform(-1, 1, (n, 2)).astype(np.float32),
        "terminals": terminals,
    }
    if not compact:
        arrays["next_observations"] = rng.standard_normal(obs.shape).astype(obs.dtype)
    if infos:
        arrays["qpos"] = rng.standard_normal((n, 3)).astype(np.float32)
        arrays["qvel"] = rng.standard_normal((n, 3)).astype(np.float32)
        arrays["button_states"] = rng.integers(0, 2, (n, 2))
    stored = {k: v.astype(v.dtype.newbyteorder(byteorder)) for k, v in arrays.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # a file object: numpy adds no .npz suffix
        (np.savez_compressed if compressed else np.savez)(f, **stored)
    return arrays


def reference_rows(arrays: dict[str, np.ndarray]) -> list[dict[tuple[str, ...], Any]]:
    """The expected transitions, one Python loop step per row (independent of the converter).

    OGBench's loader (``ogbench.utils.load_dataset``): a row's next observation is the next
    row's, except on a row with ``terminals`` (``valids = 1 - terminals``); past the file's last
    row there is none either.
    """
    n = len(arrays["observations"])
    rows = []
    episode = 0
    for t in range(n):
        done = bool(arrays["terminals"][t])
        row: dict[tuple[str, ...], Any] = {
            ("observation",): arrays["observations"][t],
            ("action",): arrays["actions"][t],
            ("next", "done"): np.array([done]),
            ("episode",): np.array(episode, dtype=np.int64),
        }
        if "next_observations" in arrays:
            row[("next", "observation")] = arrays["next_observations"][t]
        else:
            valid = not done and t + 1 < n
            row[("next", "observation")] = arrays["observations"][t + 1 if valid else t]
            row[("next", "valid")] = np.array([valid])
        for name in ("qpos", "qvel", "button_states"):
            if name in arrays:
                row[("info", name)] = arrays[name][t]
        rows.append(row)
        if done:
            episode += 1
    return rows


def expected_episodes(arrays: dict[str, np.ndarray]) -> int:
    """Episodes of the file: one per terminal row, plus an unfinished last one."""
    terminals = arrays["terminals"]
    return int(terminals.sum()) + (0 if terminals[-1] else 1)
