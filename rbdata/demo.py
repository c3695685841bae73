"""The demo behind ``make demo`` / ``python -m rbdata demo``: a bundled dataset, two read paths.

The bundled sample ``cartpole-random-v0`` (random-policy ``CartPole-v1`` transitions, built by
``datasets/samples/cartpole_random.py``) goes into a memory-mapped replay buffer, which is then
read for one epoch twice: through a plain :class:`torch.utils.data.DataLoader` over the storage
(the storage *is* a map-style dataset) and by iterating the buffer itself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

from rbdata._resources import catalog_path
from rbdata.buffer import ReplayBuffer
from rbdata.samplers import SamplerWithoutReplacement
from rbdata.storages import MemmapStorage

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


def _time_epoch(batches: Iterable[Any]) -> tuple[int, int, float]:
    """Consume ``batches``; return (batches, items, seconds), start-up included."""
    count = items = 0
    start = time.perf_counter()
    for batch in batches:
        count += 1
        items += int(batch.batch_size[0])
    return count, items, time.perf_counter() - start


def _path_stats(batches: int, items: int, seconds: float, item_bytes: int) -> dict[str, float]:
    seconds = max(seconds, 1e-9)
    return {
        "batches": batches,
        "items": items,
        "seconds": seconds,
        "batches_per_s": batches / seconds,
        "mb_per_s": items * item_bytes / seconds / 1e6,
    }


def run_demo(
    batch_size: int = 256,
    num_workers: int = 2,
    out: Callable[[str], object] = print,
    seed: int = 0,
) -> dict[str, Any]:
    """Fill a memory-mapped buffer with the bundled sample and read one epoch two ways.

    The two read paths are a :class:`~torch.utils.data.DataLoader` over the storage
    (``shuffle=True``, ``num_workers`` worker processes, default collate) and ``for batch in
    buffer`` with :class:`~rbdata.samplers.SamplerWithoutReplacement`. Times include the
    DataLoader's worker start-up.

    Args:
        batch_size: items per batch on both paths.
        num_workers: DataLoader worker processes (``0``: load in this process).
        out: where the report's lines go (``print`` by default).
        seed: seed of the shuffling generators of both paths.

    Returns:
        ``{"dataset", "items", "bytes_per_item", "batch_size", "num_workers", "dataloader",
        "buffer"}``; the last two map ``batches``, ``items``, ``seconds``, ``batches_per_s``
        and ``mb_per_s`` to numbers.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be a non-negative integer, got {num_workers!r}")
    name = "cartpole-random-v0"
    sample = load_sample(name)
    n = int(sample.batch_size[0])
    storage = MemmapStorage(n)
    try:
        rb = ReplayBuffer(
            storage=storage,
            sampler=SamplerWithoutReplacement(generator=torch.Generator().manual_seed(seed)),
            batch_size=batch_size,
        )
        rb.extend(sample)
        assert storage.layout is not None  # set by the first write
        item_bytes = storage.layout.item_nbytes
        loader = DataLoader(
            rb.storage,
            batch_size=batch_size,
            shuffle=True,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(seed),
        )
        loader_stats = _path_stats(*_time_epoch(loader), item_bytes)
        del loader
        buffer_stats = _path_stats(*_time_epoch(rb), item_bytes)
    finally:
        storage.close()
    report: dict[str, Any] = {
        "dataset": name,
        "items": n,
        "bytes_per_item": item_bytes,
        "batch_size": batch_size,
        "num_workers": num_workers,
        "dataloader": loader_stats,
        "buffer": buffer_stats,
    }
    for line in _format_report(report):
        out(line)
    return report


def _format_report(report: dict[str, Any]) -> list[str]:
    expected = math.ceil(report["items"] / report["batch_size"])
    lines = [
        f"rbdata demo: {report['dataset']} in a MemmapStorage",
        f"  items: {report['items']}, bytes per item: {report['bytes_per_item']}, "
        f"batch size: {report['batch_size']} ({expected} batches per epoch)",
    ]
    labels = {
        "dataloader": f"DataLoader(storage, shuffle=True, num_workers={report['num_workers']})",
        "buffer": "for batch in ReplayBuffer (SamplerWithoutReplacement)",
    }
    for key, label in labels.items():
        s = report[key]
        lines.append(
            f"  {label}: {s['batches']} batches, {s['batches_per_s']:,.0f} batches/s, "
            f"{s['mb_per_s']:,.1f} MB/s, {s['seconds']:.3f} s"
        )
    return lines
