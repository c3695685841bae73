"""Recipe for the ``cartpole-random-v0`` D4RL-layout sample (an HDF5 file, built locally).

The bundled ``cartpole-random-v0.npz`` (next to this file; built by ``cartpole_random.py``)
rewritten in the layout of a D4RL file, one row per transition, in the same order:

- ``observations``, ``next_observations``: float32 ``[N, 4]``
- ``actions``: int64 ``[N]`` (CartPole's actions are discrete; D4RL keeps the file's dtype)
- ``rewards``: float32 ``[N]``
- ``terminals``, ``timeouts``: bool ``[N]`` (the sample's ``next_terminated`` and
  ``next_truncated``)
- ``infos/action_log_probs``: float32 ``[N]``, ``log(1/2)`` (the behaviour policy is uniform)
- ``metadata/*``: ``algorithm``, ``env``, ``source`` (text), ``seed`` and ``num_episodes``
  (integers), ``gymnasium_version`` (text, when gymnasium is installed)

The file is not shipped: ``make demo`` (:func:`rbdata.demo.run_demo`) builds it, serves it from
a local mirror and downloads it with ``rbdata.datasets.D4RL("cartpole-random-v0")``. Its
catalog row is in ``datasets/d4rl-samples.tsv``; ``ref_min_score`` there is
:func:`mean_episode_return` of the sample. Run as a script to build the file and print its
size, sha256 and that mean::

    python datasets/samples/d4rl_sample.py OUT.hdf5
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
from pathlib import Path

import numpy as np

__all__ = ["ENV_ID", "ID", "SAMPLE", "build", "d4rl_arrays", "mean_episode_return", "read_sample"]

ID = "cartpole-random-v0"
ENV_ID = "CartPole-v1"
#: the transitions the file is made of (built by ``cartpole_random.py``)
SAMPLE = Path(__file__).with_name(f"{ID}.npz")
SEED = 0  # the seed of cartpole_random.py


def read_sample(npz: str | os.PathLike[str] = SAMPLE) -> dict[str, np.ndarray]:
    """The arrays of a sample ``.npz`` file (see ``datasets/README.md``)."""
    with np.load(npz, allow_pickle=False) as f:
        return {name: f[name] for name in f.files}


def d4rl_arrays(sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The D4RL datasets (name -> array) of the sample's transitions, row for row."""
    n = sample["observation"].shape[0]
    return {
        "observations": np.ascontiguousarray(sample["observation"], dtype=np.float32),
        "actions": np.ascontiguousarray(sample["action"], dtype=np.int64),
        "rewards": sample["next_reward"].reshape(n).astype(np.float32),
        "terminals": sample["next_terminated"].reshape(n).astype(bool),
        "timeouts": sample["next_truncated"].reshape(n).astype(bool),
        "next_observations": np.ascontiguousarray(sample["next_observation"], dtype=np.float32),
        "infos/action_log_probs": np.full(n, np.log(0.5), dtype=np.float32),
    }


def mean_episode_return(sample: dict[str, np.ndarray]) -> tuple[float, int]:
    """The mean undiscounted return of the sample's complete episodes, and their number.

    An episode ends at a row whose ``next_done`` is set; rows after the last such row (an
    unfinished episode) are left out.
    """
    done = sample["next_done"].reshape(-1)
    reward = sample["next_reward"].reshape(-1).astype(np.float64)
    ends = np.flatnonzero(done)
    if not len(ends):
        raise ValueError("the sample has no complete episode")
    cumulative = np.concatenate([[0.0], np.cumsum(reward)])
    starts = np.concatenate([[0], ends[:-1] + 1])
    returns = cumulative[ends + 1] - cumulative[starts]
    return float(returns.mean()), len(returns)


def _metadata(sample: dict[str, np.ndarray]) -> dict[str, object]:
    meta: dict[str, object] = {
        "algorithm": np.bytes_(b"uniform random policy"),
        "env": np.bytes_(ENV_ID.encode()),
        "source": np.bytes_(f"rbdata datasets/samples/{SAMPLE.name}".encode()),
        "seed": np.int64(SEED),
        "num_episodes": np.int64(mean_episode_return(sample)[1]),
    }
    try:
        version = importlib.metadata.version("gymnasium")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        meta["gymnasium_version"] = np.bytes_(version.encode())
    return meta


def build(path: str | os.PathLike[str], npz: str | os.PathLike[str] = SAMPLE) -> Path:
    """Write the D4RL-layout HDF5 file of the sample ``npz`` to ``path``, atomically.

    The file is written to a temporary sibling, fsync'ed and renamed onto ``path``; its bytes
    depend only on ``npz`` and the installed h5py and gymnasium versions (no timestamps).

    Returns:
        ``path``.
    """
    import h5py

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    sample = read_sample(npz)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w", track_order=True) as h5:
            for name, array in d4rl_arrays(sample).items():
                h5.create_dataset(name, data=array, track_times=False)
            for name, value in _metadata(sample).items():
                h5.create_dataset(f"metadata/{name}", data=value, track_times=False)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} OUT.hdf5")
    out = build(sys.argv[1])
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    mean, episodes = mean_episode_return(read_sample())
    print(f"wrote {out} ({out.stat().st_size:,} bytes, sha256 {digest})")
    print(f"mean return of the {episodes} complete episodes (ref_min_score): {mean:.4f}")
