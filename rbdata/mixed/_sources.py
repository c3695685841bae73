"""The sources of a mixture: each one's storage, sampler and kind, and their common layout.

A source is a :class:`~rbdata.ReplayBuffer` (its storage and its own sampler, which sees its
writes), an offline dataset (:class:`~rbdata.datasets.OfflineDataset`: read-only, recorded by
identity in checkpoints) or a bare :class:`~rbdata.storages.Storage` (sampled by the sampler
given for it, else a :class:`~rbdata.samplers.UniformSampler`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rbdata._core.layout import TENSOR, Key, Layout, Leaf
from rbdata._core.layout.keys import key_name
from rbdata.buffer import ReplayBuffer
from rbdata.datasets.base import OfflineDataset
from rbdata.samplers.base import Sampler
from rbdata.samplers.uniform import UniformSampler
from rbdata.storages.base import Storage

__all__ = [
    "BUFFER",
    "DATASET",
    "STORAGE",
    "Columns",
    "Source",
    "check_layout",
    "make_sources",
    "select_keys",
]

#: the kinds of source
BUFFER, DATASET, STORAGE = "buffer", "dataset", "storage"


@dataclass
class Source:
    """One source of a mixture (built by :func:`make_sources`)."""

    name: str
    position: int
    obj: Any  # what the user passed
    kind: str
    storage: Storage
    sampler: Sampler
    offset: int  # first combined index of this source
    #: this source's leaves, in output order (set when its layout is first checked)
    columns: Columns | None = field(default=None)

    @property
    def capacity(self) -> int:
        return self.storage.capacity

    def __len__(self) -> int:
        # a buffer's len() also hands writes by other processes to its sampler
        return len(self.obj) if self.kind == BUFFER else len(self.storage)


@dataclass(frozen=True)
class Columns:
    """Which of a storage's leaves make the output, in output order."""

    positions: tuple[int, ...]  # index into the storage's layout leaves
    fast: bool  # the storage exposes its backing tensors (gather straight into the batch)


def _default_sampler(storage: Storage, generator: torch.Generator | None) -> Sampler:
    if generator is None:
        return UniformSampler(storage)
    seed = int(torch.randint(2**62, (), generator=generator))
    return UniformSampler(storage, generator=torch.Generator().manual_seed(seed))


def _resolve(name: str, obj: Any, sampler: Any) -> tuple[str, Storage, Sampler | None]:
    """A source's kind, storage and sampler (``None``: a default one), nothing bound yet."""
    where = f"sources[{name!r}]"
    if sampler is not None and not isinstance(sampler, Sampler):
        raise TypeError(
            f"samplers[{name!r}] must be an rbdata Sampler, got {type(sampler).__name__}"
        )
    if isinstance(obj, (ReplayBuffer, OfflineDataset)):
        buffer = obj if isinstance(obj, ReplayBuffer) else obj.buffer
        if buffer.transform is not None:
            raise ValueError(
                f"{where} has a transform, which a mixture does not apply; apply it to the "
                "mixture's batches instead"
            )
        own = buffer.sampler
        if isinstance(obj, ReplayBuffer) and sampler is not None and sampler is not own:
            raise ValueError(
                f"samplers[{name!r}]: a ReplayBuffer source samples with its own sampler (which "
                "sees its writes); build the buffer with that sampler instead"
            )
        if sampler is None:
            if not isinstance(own, Sampler):
                raise TypeError(
                    f"{where}: its sampler must be an rbdata Sampler, got {type(own).__name__}"
                )
            sampler = own
        kind = BUFFER if isinstance(obj, ReplayBuffer) else DATASET
        return kind, buffer.storage, sampler
    if isinstance(obj, Storage):
        return STORAGE, obj, sampler
    raise TypeError(
        f"{where} must be a ReplayBuffer, an offline dataset (D4RL, Minari) or an rbdata "
        f"Storage, got {type(obj).__name__}"
    )


def make_sources(
    sources: Any,
    samplers: Any,
    generator: torch.Generator | None,
    keys: tuple[Key, ...] | None,
    drop_info: bool,
) -> tuple[list[Source], Layout | None]:
    """Check the arguments of a mixture and build its sources, and the batches' layout.

    Everything is checked (the layouts of the sources that hold data included) before any
    sampler is bound to a storage. The layout is ``None`` while every source is empty.

    Raises:
        TypeError: a source or sampler of the wrong type.
        ValueError: no sources, a sampler for an unknown name, a sampler bound to another
            storage, an epoch sampler, a storage used twice, sources on different devices
            or with different keys, shapes or dtypes (see :func:`check_layout`).
    """
    if not isinstance(sources, Mapping) or not sources:
        raise (ValueError if isinstance(sources, Mapping) else TypeError)(
            "sources must be a non-empty dict of name -> ReplayBuffer, offline dataset or "
            f"Storage, got {sources!r:.80}"
        )
    for name in sources:
        if not isinstance(name, str):
            raise TypeError(f"sources: names must be strings, got {name!r}")
    samplers = {} if samplers is None else samplers
    if not isinstance(samplers, Mapping):
        raise TypeError(
            f"samplers must be a dict of name -> Sampler, got {type(samplers).__name__}"
        )
    unknown = [name for name in samplers if name not in sources]
    if unknown:
        raise ValueError(f"samplers: no source called {', '.join(map(repr, unknown))}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    out: list[Source] = []
    offset = 0
    seen: dict[int, str] = {}
    for position, (name, obj) in enumerate(sources.items()):
        kind, storage, sampler = _resolve(name, obj, samplers.get(name))
        if id(storage) in seen:
            raise ValueError(
                f"sources[{name!r}] reads the same storage as sources[{seen[id(storage)]!r}]"
            )
        seen[id(storage)] = name
        if sampler is not None:
            if sampler.data_source is not None and sampler.data_source is not storage:
                raise ValueError(
                    f"samplers[{name!r}] already reads another data_source; use one sampler "
                    "per source"
                )
            sampler.check_source(storage)
            if sampler.epoch_based:
                raise ValueError(
                    f"sources[{name!r}]: {type(sampler).__name__} samples in epochs, which a "
                    "mixture (endless, with replacement) does not; use UniformSampler, "
                    "PrioritizedSampler or SliceSampler"
                )
        out.append(Source(name, position, obj, kind, storage, sampler, offset))  # type: ignore[arg-type]
        offset += storage.capacity
    devices = {str(s.storage.device) for s in out}
    if len(devices) > 1:
        where = ", ".join(f"{s.name!r}: {s.storage.device}" for s in out)
        raise ValueError(f"sources: every source must be on one device, got {where}")
    layout = None
    for source in out:
        if source.storage.layout is not None and len(source.storage) > 0:
            layout = check_layout(source, layout, out, keys, drop_info)
    for source in out:  # bind: nothing can fail from here on
        if source.sampler is None:
            source.sampler = _default_sampler(source.storage, generator)
        else:
            source.sampler.attach(source.storage)
    return out, layout


def select_keys(keys: Any, drop_info: Any) -> tuple[tuple[Key, ...] | None, bool]:
    """Normalise the ``keys`` and ``drop_info`` options of a mixture."""
    if not isinstance(drop_info, bool):
        raise TypeError(f"drop_info must be a bool, got {drop_info!r}")
    if keys is None:
        return None, drop_info
    if isinstance(keys, (str, tuple)) or not isinstance(keys, Sequence) or not keys:
        raise TypeError(
            "keys must be a non-empty list of keys (a str or a tuple of str each), got "
            f"{keys!r:.80}"
        )
    out = []
    for key in keys:
        k = (key,) if isinstance(key, str) else key
        if not isinstance(k, tuple) or not k or not all(isinstance(p, str) for p in k):
            raise TypeError(f"keys: each key must be a str or a tuple of str, got {key!r}")
        out.append(k)
    if len(set(out)) != len(out):
        raise ValueError(f"keys: a key is listed twice in {keys!r}")
    return tuple(out), drop_info


def _selected(layout: Layout, keys: tuple[Key, ...] | None, drop_info: bool) -> list[Leaf]:
    if keys is not None:
        by_key = {leaf.key: leaf for leaf in layout.leaves}
        return [by_key[k] for k in keys if k in by_key]
    return [leaf for leaf in layout.leaves if not (drop_info and leaf.key[:1] == ("info",))]


def check_layout(
    source: Source,
    reference: Layout | None,
    sources: Sequence[Source],
    keys: tuple[Key, ...] | None,
    drop_info: bool,
) -> Layout:
    """Check ``source``'s (filled) layout against ``reference``; set its columns.

    Keys are matched by name (their order may differ). Returns the output layout
    (``reference``, or this source's selected leaves if it is the first with data).

    Raises:
        ValueError: keys missing from the source, keys, shapes or dtypes that differ from
            the reference source's (each differing key named), or fields that are not
            fixed-shape tensors.
    """
    layout = source.storage.layout
    if layout is None:  # pragma: no cover - called for sources with data only
        raise ValueError(f"sources[{source.name!r}] has no data yet")
    where = f"sources[{source.name!r}]"
    if keys is not None:
        have = set(layout.keys)
        missing = [k for k in keys if k not in have]
        if missing:
            raise ValueError(f"{where} has no key {', '.join(key_name(k) for k in missing)}")
    leaves = _selected(layout, keys, drop_info)
    odd = [leaf.name for leaf in leaves if leaf.kind != TENSOR]
    if odd:
        raise ValueError(
            f"{where}: {', '.join(odd)} are variable-length fields, which a mixture cannot "
            "concatenate; leave them out with keys=[...]"
        )
    if reference is not None:
        if layout.kind != reference.kind or set(leaves) != set(reference.leaves):
            first = next(s.name for s in sources if s.columns is not None)
            raise ValueError(_difference(first, reference, source.name, layout, leaves))
        out = reference
    else:
        out = Layout(layout.kind, leaves)
    index = {leaf.key: i for i, leaf in enumerate(layout.leaves)}
    positions = tuple(index[leaf.key] for leaf in out.leaves)
    fast = isinstance(getattr(type(source.storage), "buffers", None), property)
    source.columns = Columns(positions, fast)
    return out


def _difference(a: str, ref: Layout, b: str, layout: Layout, leaves: list[Leaf]) -> str:
    """An error message naming every key that differs between two sources."""
    if layout.kind != ref.kind:
        return (
            f"sources {a!r} and {b!r} hold different kinds of items ({ref.kind} vs {layout.kind})"
        )
    mine = {leaf.key: leaf for leaf in leaves}
    theirs = {leaf.key: leaf for leaf in ref.leaves}
    parts = []
    only_a = [key_name(k) for k in theirs if k not in mine]
    only_b = [key_name(k) for k in mine if k not in theirs]
    if only_a:
        parts.append(f"keys only in {a!r}: {', '.join(only_a)}")
    if only_b:
        parts.append(f"keys only in {b!r}: {', '.join(only_b)}")
    for key, leaf in theirs.items():
        other = mine.get(key)
        if other is None:
            continue
        if other.shape != leaf.shape:
            parts.append(f"shape of {key_name(key)}: {list(leaf.shape)} vs {list(other.shape)}")
        if other.dtype != leaf.dtype:
            parts.append(f"dtype of {key_name(key)}: {leaf.dtype} vs {other.dtype}")
    hint = ""
    if any(k[:1] == ("info",) for k in [*theirs, *mine]):
        hint = "; drop_info=True leaves out the ('info', ...) keys"
    return (
        f"sources {a!r} and {b!r} differ: {'; '.join(parts)} (select common keys with "
        f"keys=[...]{hint})"
    )
