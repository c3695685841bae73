"""``Minari``: Minari datasets, read with Minari's own API, converted once, memory-mapped.

The episodes are read with :meth:`minari.MinariDataset.iterate_episodes` (so JPEG-encoded image
spaces come back decoded exactly as Minari decodes them, ``[H, W, C]`` or ``[H, W]`` uint8) and
flattened into transitions, episode by episode, in Minari's episode order. Every dtype is the
one Minari returns (Discrete spaces: int64). An episode of ``T`` steps has ``T + 1``
observations and gives ``T`` rows:

======================================  ===================================================
key                                     from the episode (``t = 0 .. T-1``)
======================================  ===================================================
``"observation"``                       ``observations[t]``
``("next", "observation")``             ``observations[t + 1]``
``"action"``                            ``actions[t]``
``("next", "reward")`` ``[N, 1]``       ``rewards[t]``
``("next", "terminated")`` ``[N, 1]``   ``terminations[t]`` (bool)
``("next", "truncated")`` ``[N, 1]``    ``truncations[t]`` (bool)
``("next", "done")`` ``[N, 1]``         terminated | truncated
``"episode"`` ``[N]`` int64             Minari's episode id
``("info", name, ...)``                 ``infos[name][t]`` (see below)
======================================  ===================================================

Spaces become keys by their structure: a ``Box``, ``Discrete``, ``MultiDiscrete`` or
``MultiBinary`` is one leaf (``"observation"``); a ``Dict`` gives one key per entry
(``("observation", "image")``, ``("next", "observation", "image")``); a ``Tuple`` gives keys
``"0"``, ``"1"``, ...; nested spaces nest the keys. Spaces Minari returns as non-numeric values
(``Text``) cannot be converted (``ValueError``).

Infos: every numeric array in an episode's (nested) ``infos`` whose leading dimension is
``T + 1`` is stored as ``infos[name][:T]``, the info that came with observation ``t`` (D4RL's
``infos/*`` meaning); one whose leading dimension is ``T`` is stored as is. Infos that are not
numeric arrays (text, objects, scalars) or have another leading dimension are skipped; with
the ``arrow``/``parquet`` formats Minari returns nested info dicts as object arrays, so they are
skipped too. Every episode must give the same info keys, shapes and dtypes (else
``ValueError``).

The Minari dataset metadata (spaces as Minari's serialized JSON strings, sets as sorted lists)
is kept in :attr:`OfflineDataset.metadata`; its ``ref_min_score``/``ref_max_score``, when
present, give :meth:`OfflineDataset.normalized_score`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rbdata.datasets._cache import (
    DATASET_FILE,
    STORAGE_DIR,
    build_entry,
    cache_root,
    entry_dir,
    prune_empty_dirs,
)
from rbdata.datasets._minari_convert import convert_minari, minari_metadata
from rbdata.datasets._minari_extra import minari_module as _minari
from rbdata.datasets._minari_extra import remote_access
from rbdata.datasets.base import OfflineDataset
from rbdata.samplers.base import Sampler

__all__ = ["Minari", "convert_minari", "minari_metadata", "prepare", "remote_access"]

FAMILY = "minari"


def _score(value: Any) -> float | None:
    if value is None:
        return None
    try:
        score = float(value)
    except (TypeError, ValueError):
        return None
    return score if math.isfinite(score) else None


class Minari(OfflineDataset):
    """A Minari dataset: loaded with ``minari``, converted once, memory-mapped.

    The first construction loads the dataset with :func:`minari.load_dataset` (Minari looks
    for it under ``$MINARI_DATASETS_PATH``, else ``~/.minari/datasets``, and downloads it there
    with ``download=True``), converts it episode by episode into a storage in the cache
    (``root``, else ``$RBDATA_HOME``, else the user cache directory) and opens it; later
    constructions open the converted entry in milliseconds, without ``minari`` or its data.
    See the module documentation for the keys.

    Args:
        dataset_id: the Minari id, e.g. ``"mujoco/hopper/medium-v0"``.
        root: the cache root.
        download: let Minari download the dataset if it is not local (else raise).
        backend: ``"memmap"`` or ``"arrow"`` storage.
        sampler: sampler of :meth:`~OfflineDataset.sample` and iteration (default uniform).
        batch_size: default batch size of :meth:`~OfflineDataset.sample` and iteration.
        transform: applied to sampled batches.
        progress: show a progress bar for the conversion.

    Raises:
        ValueError: a malformed id or unknown backend, or data that cannot be converted.
        FileNotFoundError: ``download=False`` and the dataset is neither converted nor local.
        rbdata.errors.MissingExtraError: the dataset must be converted and ``minari`` is not
            installed, or must be downloaded and Minari's remote client (``huggingface_hub``)
            is not; the message has ``pip install 'rbdata[minari]'``.
    """

    def __init__(
        self,
        dataset_id: str,
        root: str | os.PathLike[str] | None = None,
        *,
        download: bool = True,
        backend: str = "memmap",
        sampler: Sampler | None = None,
        batch_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        progress: bool = True,
    ) -> None:
        base = cache_root(root)
        target = entry_dir(base, FAMILY, dataset_id, backend)
        if not (target / DATASET_FILE).is_file():
            prepare(dataset_id, target, backend, download=download, progress=progress, root=base)
        super().__init__(target, sampler=sampler, batch_size=batch_size, transform=transform)


def prepare(
    dataset_id: str,
    target: Path,
    backend: str,
    *,
    download: bool,
    progress: bool,
    root: Path | None = None,
) -> None:
    """Load ``dataset_id`` with Minari (downloading it if allowed) and convert it to ``target``.

    A failure leaves no entry, and no empty folder below ``root`` (the cache root).
    """
    if root is None:
        root = target.parents[len(dataset_id.split("/"))]  # <root>/minari/<id...>/<backend>

    def build(tmp: Path) -> dict[str, Any]:
        minari = _minari()
        try:
            with remote_access(f"downloading the Minari dataset {dataset_id!r}"):
                dataset = minari.load_dataset(dataset_id, download=download)
        except FileNotFoundError as err:
            if download:
                raise
            raise FileNotFoundError(
                f"Minari dataset {dataset_id!r} is not local (MINARI_DATASETS_PATH="
                f"{os.environ.get('MINARI_DATASETS_PATH')!r}) and not converted in the cache "
                f"({target}); pass download=True or run `minari download {dataset_id}`"
            ) from err
        info = convert_minari(
            dataset, tmp / STORAGE_DIR, backend, progress=progress, desc=f"{dataset_id} ({backend})"
        )
        metadata = info["metadata"]
        return {
            "family": FAMILY,
            "id": dataset_id,
            "backend": backend,
            **info,
            "source": {
                "data_format": metadata.get("data_format"),
                "minari_version": metadata.get("minari_version"),
                "reader_version": str(minari.__version__),
                "jpeg_encoding": bool(dataset.storage.jpeg_encoding),
                "path": str(dataset.storage.data_path),
            },
            "ref_min_score": _score(metadata.get("ref_min_score")),
            "ref_max_score": _score(metadata.get("ref_max_score")),
        }

    try:
        build_entry(target, build)
    except BaseException:
        prune_empty_dirs(target.parent, root)
        raise
