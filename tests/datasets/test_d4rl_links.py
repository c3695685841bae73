"""D4RL files whose data reaches outside the file: refused before anything is converted.

An HDF5 external link, a virtual dataset mapping another file, or a dataset stored in external
raw files would make the converter copy another file on disk into the cache.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from rbdata.datasets import D4RL
from rbdata.datasets.d4rl import convert_d4rl, read_d4rl_metadata
from rbdata.storages import MemmapStorage
from tests._d4rl_files import reference_rows, write_d4rl_file

N = 120


def _move_out(f: h5py.File, name: str, other: Path) -> np.ndarray:
    """Copy dataset ``name`` into the file ``other`` and delete it here; return its data."""
    data = f[name][()]
    with h5py.File(other, "a") as g:
        g[name] = data
    del f[name]
    return data


def _external_link(name: str) -> Callable[[h5py.File, Path], str]:
    def edit(f: h5py.File, other: Path) -> str:
        _move_out(f, name, other)
        f[name] = h5py.ExternalLink(str(other), f"/{name}")
        return f"/{name}"

    return edit


def _external_group(f: h5py.File, other: Path) -> str:
    with h5py.File(other, "a") as g:
        f.copy(f["infos"], g, "infos")
    del f["infos"]
    f["infos"] = h5py.ExternalLink(str(other), "/infos")
    return "/infos"


def _soft_to_external(f: h5py.File, other: Path) -> str:
    _move_out(f, "rewards", other)
    f["hidden"] = h5py.ExternalLink(str(other), "/rewards")
    f["rewards"] = h5py.SoftLink("/hidden")
    return "/hidden"


def _virtual(f: h5py.File, other: Path) -> str:
    data = _move_out(f, "actions", other)
    layout = h5py.VirtualLayout(shape=data.shape, dtype=data.dtype)
    layout[:] = h5py.VirtualSource(str(other), "actions", shape=data.shape)
    f.create_virtual_dataset("actions", layout)
    return "/actions"


def _external_storage(f: h5py.File, other: Path) -> str:
    data = np.ascontiguousarray(f["terminals"][()])
    other.write_bytes(data.tobytes())
    del f["terminals"]
    f.create_dataset("terminals", data.shape, data.dtype, external=[(str(other), 0, data.nbytes)])
    return "/terminals"


EDITS = {
    "observations": _external_link("observations"),
    "next_observations": _external_link("next_observations"),
    "infos_dataset": _external_link("infos/qpos"),
    "infos_group": _external_group,
    "metadata": _external_link("metadata/algorithm"),
    "soft_link_to_external": _soft_to_external,
    "virtual": _virtual,
    "external_storage": _external_storage,
}


@pytest.mark.parametrize("case", list(EDITS))
def test_data_outside_the_file_is_refused(tmp_path: Path, case: str) -> None:
    file, other = tmp_path / "d4rl.hdf5", tmp_path / "elsewhere.bin"
    write_d4rl_file(file, n=N)
    with h5py.File(file, "a") as f:
        name = EDITS[case](f, other)
    out = tmp_path / "storage"
    with pytest.raises(ValueError, match="only data inside the file") as err:
        convert_d4rl(file, out, progress=False)
    assert repr(name) in str(err.value) and str(other) in str(err.value), err.value
    assert not out.exists()  # refused before anything was written


def test_metadata_reader_refuses_external_links(tmp_path: Path) -> None:
    file, other = tmp_path / "d4rl.hdf5", tmp_path / "elsewhere.hdf5"
    write_d4rl_file(file, n=N)
    with h5py.File(file, "a") as f:
        _external_link("metadata/policy/fc0/weight")(f, other)
    with h5py.File(file, "r") as f, pytest.raises(ValueError, match="external link"):
        read_d4rl_metadata(f)


def test_a_refused_file_leaves_no_cache_entry(tmp_path: Path) -> None:
    file, other = tmp_path / "d4rl.hdf5", tmp_path / "elsewhere.hdf5"
    write_d4rl_file(file, n=N)
    with h5py.File(file, "a") as f:
        _external_link("observations")(f, other)
    sha = hashlib.sha256(file.read_bytes()).hexdigest()
    home = tmp_path / "home"
    with pytest.raises(ValueError, match="'/observations' is an HDF5 external link"):
        D4RL("hopper-medium-v2", home, file=file, sha256=sha, progress=False)
    assert not home.exists() or not any(home.rglob("*")), sorted(home.rglob("*"))


def test_links_inside_the_file_are_followed(tmp_path: Path) -> None:
    """A soft link and a virtual dataset of the same file stay in it: converted as usual."""
    file = tmp_path / "d4rl.hdf5"
    arrays = write_d4rl_file(file, n=N)
    with h5py.File(file, "a") as f:
        f.move("observations", "data/obs")
        f["observations"] = h5py.SoftLink("/data/obs")
        f.move("rewards", "data/rewards")
        f["rewards"] = h5py.SoftLink("data/rewards")  # relative to the root group
        actions = f["actions"][()]
        f.move("actions", "data/actions")
        layout = h5py.VirtualLayout(shape=actions.shape, dtype=actions.dtype)
        layout[:] = h5py.VirtualSource(".", "/data/actions", shape=actions.shape)
        f.create_virtual_dataset("actions", layout)
    info = convert_d4rl(file, tmp_path / "storage", progress=False)
    assert info["transitions"] == N
    storage = MemmapStorage.open(tmp_path / "storage", copy_on_write=True)
    batch = storage[torch.arange(N)]
    expected = reference_rows(arrays)
    for key in (("observation",), ("action",), ("next", "reward")):
        column = np.stack([row[key] for row in expected])
        assert np.array_equal(batch[key].numpy(), column), key
    storage.close()
