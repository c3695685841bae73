"""The torch-free registries ``rbdata inspect`` reads agree with the classes they stand for.

:mod:`rbdata.storages.kinds` names each on-disk kind's class and describing function by
location, and each saved storage's check and description; :mod:`rbdata.samplers.saved` what a
saved sampler shows; ``rbdata.checkpoint``'s format names rbdata's registered classes. Here
each entry is compared with the class itself: its attributes, and its own hooks' results on
files it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

import rbdata.checkpoint
import rbdata.samplers
import rbdata.storages
import rbdata.writers
from rbdata import PrioritizedSampler, ReplayBuffer
from rbdata.checkpoint import component_class
from rbdata.errors import CheckpointError
from rbdata.samplers import Sampler
from rbdata.samplers.saved import describe_saved
from rbdata.storages import MemmapStorage, TensorStorage
from rbdata.storages.kinds import disk_kind, disk_kinds, saved_kind


def _batch(n: int) -> TensorDict:
    return TensorDict({"obs": torch.randn(n, 3), "act": torch.arange(n)}, [n])


def test_each_disk_kind_names_its_class_and_marker() -> None:
    assert list(disk_kinds()) == ["memmap", "arrow", "frames"]
    for name, entry in disk_kinds().items():
        cls = entry.load_class()
        assert (cls.kind, cls.marker_file, cls.__name__) == (
            name,
            entry.marker_file,
            entry.class_name,
        )
    assert disk_kind(names={"frames.json", "steps"}) is disk_kinds()["frames"]
    assert disk_kind("list") is None and disk_kind(names={"notes.txt"}) is None


def test_a_disk_kind_describes_as_its_class_does(tmp_path: Path) -> None:
    storage = MemmapStorage(12, path=tmp_path / "m")
    storage.set(slice(0, 5), _batch(5))
    storage.close()
    entry = disk_kind(names={"layout.json"})
    assert entry is not None
    assert entry.describe(tmp_path / "m") == MemmapStorage.describe(tmp_path / "m")
    info, problems = entry.describe(tmp_path / "m")
    assert (info.capacity, info.length, info.next_slot, problems) == (12, 5, 5, [])


@pytest.mark.parametrize("cls", [TensorStorage, MemmapStorage])
def test_a_saved_kind_checks_and_describes_as_its_class_does(tmp_path: Path, cls: Any) -> None:
    rb = ReplayBuffer(cls(10))
    rb.extend(_batch(6))
    rb.dumps(tmp_path / "ckpt")
    live = tmp_path / "ckpt" / (tmp_path / "ckpt" / "CURRENT").read_text().strip()
    directory, meta_file = live / "storage", live / "checkpoint.json"
    entry = json.loads(meta_file.read_text())["storage"]
    config, state = entry["config"], entry["state"]
    saved = saved_kind(cls.__name__)
    assert saved is not None and saved.class_name == cls.__name__
    assert saved.check(directory, config, state, meta_file) == cls.check_dump(
        directory, config, state, meta_file
    )
    assert saved.describe(directory, config, state, meta_file) == cls.describe(
        directory, config, state, meta_file
    )
    # a corrupt dump: the same refusal, word for word
    (directory / "layout.json").write_text('{"format": "rbdata.memmap", "version": 7}')
    with pytest.raises(CheckpointError) as theirs:
        cls.check_dump(directory, config, state, meta_file)
    with pytest.raises(CheckpointError) as ours:
        saved.check(directory, config, state, meta_file)
    assert str(ours.value) == str(theirs.value)
    rb.close()


def test_the_builtin_names_are_the_registered_classes() -> None:
    from rbdata.checkpoint._format import BUILTIN

    for kind, names in BUILTIN.items():
        for name in names:
            assert component_class(name, kind).__name__ == name
    assert saved_kind("ListStorage") is None  # described through its class
    from rbdata.checkpoint._registry import is_registered

    packages = {"storage": rbdata.storages, "sampler": rbdata.samplers, "writer": rbdata.writers}
    for kind, package in packages.items():  # every class rbdata registers is listed
        registered = {n for n in package.__all__ if is_registered(n)}
        assert registered == set(BUILTIN[kind]), kind


def test_saved_samplers_show_what_their_classes_show() -> None:
    from rbdata.checkpoint._format import BUILTIN

    sampler = PrioritizedSampler(16, alpha=1.0, beta=1.0)
    for i in range(5):
        sampler.on_write(i, None)
    sampler.update_priority(torch.arange(5), torch.tensor([1.0, 2.0, 0.5, 4.0, 3.0]))
    state = sampler.state_dict()

    def read(value: Any, i: int) -> float | None:
        return float(value[i]) if isinstance(value, torch.Tensor) else None

    shown = describe_saved("PrioritizedSampler", state, read)
    assert shown == {"total_priority": 10.5, "min_priority": 0.5}  # sum and min of the five
    for name in BUILTIN["sampler"]:
        cls = component_class(name, "sampler")
        assert issubclass(cls, Sampler)
        assert describe_saved(name, state, read) == cls.describe_state(state, read), name
    assert rbdata.checkpoint.META_FILE == "checkpoint.json"
