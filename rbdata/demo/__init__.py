"""The demo behind ``make demo`` / ``python -m rbdata demo``: the offline-dataset path end to end.

1. The recipe ``datasets/samples/d4rl_sample.py`` writes the bundled ``cartpole-random-v0``
   sample (random-policy ``CartPole-v1`` transitions) as a D4RL-layout HDF5 file.
2. A local HTTP mirror on ``127.0.0.1`` serves it; ``RBDATA_D4RL_MIRROR`` points there and
   ``RBDATA_HOME`` at a temporary cache.
3. :class:`rbdata.datasets.D4RL` downloads it (progress bar, sha256 check), converts it into a
   memory-mapped storage, and a second ``D4RL(...)`` opens the converted entry from the cache.
4. A small Q-network is fitted by TD learning to the value of the data's (random) policy
   through ``DataLoader(dataset, batch_size=256, shuffle=True)``.

The environment and the working directory are left as they were; the temporary files are
removed at the end.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn
from torch.utils.data import DataLoader

from rbdata._core.resources import catalog_path
from rbdata.demo._mirror import environ, load_recipe, no_proxy_for_localhost, serving

__all__ = ["SAMPLE_KEYS", "load_sample", "run_demo"]

#: Array names in a sample ``.npz`` file and the TensorDict keys they load as.
SAMPLE_KEYS: dict[str, str | tuple[str, str]] = {
    "observation": "observation",
    "action": "action",
    "next_observation": ("next", "observation"),
    "next_reward": ("next", "reward"),
    "next_done": ("next", "done"),
    "next_terminated": ("next", "terminated"),
    "next_truncated": ("next", "truncated"),
}

_DATASET = "cartpole-random-v0"
_GAMMA = 0.8  # discount of the fitted value: a horizon of ~5 steps, learnt within the demo
_TAU = 0.1  # soft update rate of the target network
_LR = 3e-3


def load_sample(name: str = "cartpole-random-v0") -> TensorDict:
    """Load a bundled sample dataset as a TensorDict of transitions.

    Args:
        name: sample id: a file ``samples/<name>.npz`` of the catalog.

    Returns:
        A TensorDict with batch size ``[N]`` and keys ``observation``, ``action``,
        ``("next", "observation")``, ``("next", "reward")``, ``("next", "done")``,
        ``("next", "terminated")`` and ``("next", "truncated")``.

    Raises:
        FileNotFoundError: no sample called ``name``; the message lists the bundled ones.
        ValueError: the file lacks an expected array or the arrays disagree on ``N``.

    Examples:
        >>> td = load_sample()
        >>> td.batch_size, td["observation"].dtype, td["next", "done"].shape
        (torch.Size([20000]), torch.float32, torch.Size([20000, 1]))
    """
    try:
        path = catalog_path("samples", f"{name}.npz")
    except FileNotFoundError:
        try:
            known = sorted(p.stem for p in catalog_path("samples").glob("*.npz"))
        except FileNotFoundError:
            known = []
        raise FileNotFoundError(
            f"name: no bundled sample dataset {name!r}; available: {known}"
        ) from None
    with np.load(path, allow_pickle=False) as npz:
        missing = sorted(set(SAMPLE_KEYS) - set(npz.files))
        if missing:
            raise ValueError(f"{path}: missing arrays {missing} (has {sorted(npz.files)})")
        arrays = {key: npz[key] for key in SAMPLE_KEYS}
    lengths = {arr.shape[0] if arr.ndim else -1 for arr in arrays.values()}
    if len(lengths) != 1:
        raise ValueError(f"{path}: arrays disagree on the number of transitions: {lengths}")
    (n,) = lengths
    data: dict[str, Any] = {"next": {}}
    for array_name, key in SAMPLE_KEYS.items():
        tensor = torch.from_numpy(arrays[array_name])
        if isinstance(key, tuple):
            data[key[0]][key[1]] = tensor
        else:
            data[key] = tensor
    return TensorDict(data, batch_size=[n])


# --- the TD model --------------------------------------------------------------------------
def _q_network(obs_dim: int, actions: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(obs_dim, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, actions)
    )


def _td_loss(q: nn.Module, target: nn.Module, batch: TensorDict) -> torch.Tensor:
    """Expected-SARSA TD error for the uniform behaviour policy: fitted Q evaluation."""
    with torch.no_grad():
        next_value = target(batch["next", "observation"]).mean(-1, keepdim=True)
        alive = (~batch["next", "terminated"]).to(next_value.dtype)
        y = batch["next", "reward"] + _GAMMA * alive * next_value
    pred = q(batch["observation"]).gather(1, batch["action"].unsqueeze(-1))
    return nn.functional.mse_loss(pred, y)


def _discounted_returns(reward: np.ndarray, terminated: np.ndarray, done: np.ndarray) -> np.ndarray:
    """Monte Carlo discounted return from every row to its episode's end (file order)."""
    out = np.zeros(len(reward), dtype=np.float64)
    following = 0.0
    for t in range(len(reward) - 1, -1, -1):
        if done[t]:
            following = 0.0
        following = float(reward[t]) + (0.0 if terminated[t] else _GAMMA * following)
        out[t] = following
    return out


def _train(
    dataset: Any,
    batch_size: int,
    num_workers: int,
    steps: int,
    log_every: int,
    seed: int,
    out: Callable[[str], object],
) -> tuple[nn.Module, dict[str, Any]]:
    """Fit Q by TD learning for ``steps`` batches of the shuffled dataset, epoch after epoch."""
    obs_dim = int(dataset[0]["observation"].shape[-1])
    with torch.random.fork_rng(devices=[]):  # seeded initialisation, global RNG left alone
        torch.manual_seed(seed)
        q, target = _q_network(obs_dim, 2), _q_network(obs_dim, 2)
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=_LR)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,  # start the workers once, not once per epoch
        generator=torch.Generator().manual_seed(seed),
    )
    losses: list[float] = []
    window: list[float] = []
    step, epochs = 0, 0
    start = time.perf_counter()
    while step < steps:
        epochs += 1
        for batch in loader:
            loss = _td_loss(q, target, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for p, p_target in zip(q.parameters(), target.parameters(), strict=True):
                    p_target.lerp_(p, _TAU)
            step += 1
            window.append(loss.item())
            if step % log_every == 0 or step == steps:
                losses.append(sum(window) / len(window))
                out(f"  step {step:4d}  TD loss {losses[-1]:.4f} (mean of the last {len(window)})")
                window.clear()
            if step == steps:
                break
    seconds = time.perf_counter() - start
    return q, {"epochs": epochs, "train_s": seconds, "losses": losses}


# --- the demo ------------------------------------------------------------------------------
def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else "a non-negative integer"
        raise ValueError(f"{name} must be {what}, got {value!r}")


def _sha256(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            hasher.update(block)
    return hasher.hexdigest()


def _fetch(tmp: Path, progress: bool, out: Callable[[str], object]) -> tuple[Any, dict]:
    """Build and serve the file; download + convert it, then reopen it from the cache."""
    from rbdata.datasets import D4RL, d4rl_entry

    npz = catalog_path("samples", f"{_DATASET}.npz")
    file = load_recipe().build(tmp.joinpath("mirror", *d4rl_entry(_DATASET).url.split("/")), npz)
    digest, home = _sha256(file), tmp / "home"
    facts: dict[str, Any] = {"dataset": _DATASET, "file_bytes": file.stat().st_size}
    facts["sha256"] = digest
    out(
        f"rbdata demo: D4RL {_DATASET!r}, a {facts['file_bytes']:,}-byte HDF5 file built by "
        "datasets/samples/d4rl_sample.py"
    )
    with serving(tmp / "mirror") as mirror:
        env = {"RBDATA_HOME": str(home), "RBDATA_D4RL_MIRROR": mirror.url}
        with environ({**env, **no_proxy_for_localhost()}):
            out(f"  RBDATA_D4RL_MIRROR={mirror.url}  RBDATA_HOME={home}")
            start = time.perf_counter()
            D4RL(_DATASET, sha256=digest, progress=progress).close()
            built = time.perf_counter()
            dataset = D4RL(_DATASET)
            reopened = time.perf_counter()
    sent = [t for path, t in mirror.served if path.endswith(file.name)]
    if len(sent) != 1:
        dataset.close()
        raise RuntimeError(f"expected one download from the mirror, got {mirror.served}")
    facts.update(download_s=sent[0] - start, convert_s=built - sent[0], reopen_s=reopened - built)
    out(
        f"  download {facts['download_s'] * 1e3:.0f} ms (sha256 checked), convert "
        f"{facts['convert_s'] * 1e3:.0f} ms, reopen from the cache {facts['reopen_s'] * 1e3:.1f} ms"
    )
    return dataset, facts


def _episode_returns(reward: np.ndarray, done: np.ndarray) -> np.ndarray:
    """Undiscounted returns of the complete episodes (a last, unfinished one left out)."""
    ends = np.flatnonzero(done)
    cumulative = np.concatenate([[0.0], np.cumsum(reward, dtype=np.float64)])
    return cumulative[ends + 1] - cumulative[np.concatenate([[0], ends[:-1] + 1])]


def _evaluate(dataset: Any, q: nn.Module, out: Callable[[str], object]) -> dict[str, Any]:
    """Compare the fitted Q with the data's Monte Carlo returns; D4RL's normalized score."""
    data = dataset[:]
    reward = data["next", "reward"].reshape(-1).numpy()
    done = data["next", "done"].reshape(-1).numpy()
    terminated = data["next", "terminated"].reshape(-1).numpy()
    complete = int(np.flatnonzero(done)[-1]) + 1 if done.any() else 0
    with torch.no_grad():
        q_sa = q(data["observation"]).gather(1, data["action"].unsqueeze(-1)).reshape(-1)
    mc = _discounted_returns(reward, terminated, done)[:complete]
    returns = _episode_returns(reward, done)
    facts = {
        "q_mean": float(q_sa[:complete].mean()),
        "mc_return_mean": float(mc.mean()),
        "mean_return": float(returns.mean()),
        "normalized_score": float(dataset.normalized_score(float(returns.mean()))),
    }
    out(
        f"  mean Q(s, a) over the data {facts['q_mean']:.2f}; Monte Carlo discounted return "
        f"{facts['mc_return_mean']:.2f}"
    )
    lo, hi = dataset.info.get("ref_min_score"), dataset.info.get("ref_max_score")
    out(
        f"normalized score of the data's mean episode return ({facts['mean_return']:.1f} over "
        f"{len(returns)} complete episodes): {facts['normalized_score']:.3f}; best episode "
        f"({returns.max():.0f}): {dataset.normalized_score(float(returns.max())):.3f}"
    )
    out(
        f"  (D4RL's scale: 0 = the reference random return {lo:.1f}, 1 = the expert's "
        f"{hi:.0f}; this sample was collected by a random policy, whose mean return is the "
        "reference 0)"
    )
    return facts


def run_demo(
    batch_size: int = 256,
    num_workers: int = 0,
    out: Callable[[str], object] = print,
    seed: int = 0,
    *,
    steps: int = 400,
    log_every: int = 50,
    progress: bool = True,
) -> dict[str, Any]:
    """Download, convert and reopen the D4RL-layout sample from a local mirror, then train on it.

    Builds ``cartpole-random-v0`` with the catalog's recipe, serves it on 127.0.0.1, fetches it
    with :class:`rbdata.datasets.D4RL` into a temporary ``RBDATA_HOME`` (``RBDATA_D4RL_MIRROR``
    set to the mirror, the file's sha256 checked), opens it a second time from the cache, and
    fits a Q-network to the value of the data's policy (discount 0.8) by TD learning through
    ``DataLoader(dataset, batch_size, shuffle=True, num_workers)``, epoch after epoch, for
    ``steps`` updates. The environment variables are restored and the files removed at the end.

    Args:
        batch_size: transitions per batch.
        num_workers: DataLoader worker processes (``0``: load in this process).
        out: where the report's lines go (``print`` by default).
        seed: seed of the network's initialisation and of the shuffling.
        steps: gradient steps.
        log_every: steps between two printed losses (each the mean since the previous one).
        progress: show the progress bars of the download and the conversion (on stderr).

    Returns:
        A dict with ``dataset``, ``file_bytes``, ``sha256``, ``download_s``, ``convert_s``
        (conversion and first open), ``reopen_s``, ``transitions``, ``episodes``, ``keys``,
        ``batch_size``, ``num_workers``, ``steps``, ``epochs``, ``train_s``,
        ``batches_per_s``, ``losses`` (one per ``log_every`` steps), ``q_mean``,
        ``mc_return_mean``, ``mean_return`` and ``normalized_score``.

    Raises:
        ValueError: an argument is out of range (the message names it).
    """
    _check_int("batch_size", batch_size, 1)
    _check_int("num_workers", num_workers, 0)
    _check_int("steps", steps, 1)
    _check_int("log_every", log_every, 1)
    threads = torch.get_num_threads()
    dataset = None
    # fork_rng: the default samplers of the datasets draw their seeds from the global RNG
    with TemporaryDirectory(prefix="rbdata-demo-") as tmp, torch.random.fork_rng(devices=[]):
        try:
            dataset, report = _fetch(Path(tmp), progress, out)
            keys = list(dataset.info["keys"])
            report.update(transitions=len(dataset), episodes=dataset.num_episodes, keys=keys)
            out(f"  {dataset!r}\n  keys: {', '.join(keys)}")
            out(
                f"fitted Q evaluation (gamma {_GAMMA}) through DataLoader(dataset, batch_size="
                f"{batch_size}, shuffle=True, num_workers={num_workers}), {steps} steps:"
            )
            torch.set_num_threads(1)  # a tiny model: one intra-op thread is the fastest
            q, train = _train(dataset, batch_size, num_workers, steps, log_every, seed, out)
            report.update(batch_size=batch_size, num_workers=num_workers, steps=steps, **train)
            report["batches_per_s"] = steps / train["train_s"]
            out(
                f"  {steps} steps ({train['epochs']} epochs) in {train['train_s']:.2f} s: "
                f"{report['batches_per_s']:,.0f} batches/s (loading + TD update)"
            )
            report.update(_evaluate(dataset, q, out))
        finally:
            torch.set_num_threads(threads)
            if dataset is not None:
                dataset.close()
    return report
