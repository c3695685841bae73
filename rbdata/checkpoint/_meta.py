"""``checkpoint.json`` and the tensor table of ``tensors.bin``, read and checked without torch.

What :func:`~rbdata.checkpoint.load` checks first, and what :func:`~rbdata.checkpoint.describe`
(``rbdata inspect``) reads: :func:`read_checkpoint_meta` (format, version, top-level fields)
and :func:`check_table` (every entry of the tensor table against the file's size, dtypes as
names; ``_codec.check_table`` makes them torch dtypes).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rbdata._core.checked import check_int, get, get_dict, get_list, plain_file, read_json
from rbdata._core.spec import DTYPES
from rbdata.checkpoint._format import ALIGN
from rbdata.errors import CheckpointError

__all__ = ["check_table", "read_checkpoint_meta"]


def read_checkpoint_meta(file: Path, fmt: str, version: int) -> dict[str, Any]:
    """Read ``checkpoint.json``; check its format, version and top-level fields."""
    if not file.exists() and not file.is_symlink():
        raise CheckpointError(f"{str(file.parent)!r} is not an rbdata checkpoint: no {file.name}")
    meta = read_json(file, "metadata")
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        raise CheckpointError(f"{file}: not an {fmt} directory")
    found = meta.get("version")
    if isinstance(found, bool) or found != version:
        raise CheckpointError(f"{file}: format version {found!r:.40}, expected {version}")
    batch_size = get(meta, "batch_size", file, "")
    if batch_size is not None:
        check_int(batch_size, file, "batch_size", 1)
    get_list(meta, "tensors", file, "")
    for kind in ("storage", "sampler", "writer"):
        entry = get_dict(meta, kind, file, "")
        get(entry, "class", file, kind)
        get(entry, "state", file, kind)
        if not isinstance(get(entry, "config", file, kind), dict):
            raise CheckpointError(
                f"{file}: field '{kind}.config': {kind}: the config must be a dict, got "
                f"{type(entry['config']).__name__}"
            )
    return meta


def check_table(file: Path, table: Any) -> list[tuple[str, list[int], int, int]]:
    """Check a tensor table against the size of ``file``; nothing is read or allocated.

    Returns ``(dtype name, shape, offset, nbytes)`` per tensor (canonical dtype names).
    """
    if not isinstance(table, list):
        raise CheckpointError(f"{file}: the tensor table is not a list")
    size = plain_file(file, "tensor table").st_size
    out = []
    for k, item in enumerate(table):
        where = f"tensors[{k}]"
        name = get(item, "dtype", file, where)
        dtype = DTYPES.get(name) if isinstance(name, str) else None
        if dtype is None:
            raise CheckpointError(f"unknown dtype {name!r}")
        dims = get_list(item, "shape", file, where)
        shape = [check_int(s, file, f"{where}.shape", low=-1) for s in dims]
        offset = check_int(get(item, "offset", file, where), file, f"{where}.offset", low=-1)
        nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
        if min(shape, default=0) < 0 or offset < 0 or offset % ALIGN or offset + nbytes > size:
            raise CheckpointError(
                f"{file}: tensor {k} ({name} {shape} at byte {offset}) does not fit "
                f"the {size}-byte file; truncated or corrupt"
            )
        out.append((dtype.name, shape, offset, nbytes))
    return out
