"""Pickle-free encoding of component states: JSON values plus a list of raw tensors.

:func:`encode` turns a nested state (dicts, lists, tuples, numbers, strings, ``None``,
tensors, arrays, TensorDicts, dtypes, devices) into a JSON-able value in which every tensor
is replaced by a reference ``{"$rb": "tensor", "i": k}`` into a list of tensors;
:func:`decode` does the reverse and checks everything it reads. :func:`write_tensors` stores
the tensors as one raw file with a JSON table (dtype, shape, byte offset);
:func:`read_tensors` checks the table against the file before viewing it. Nothing here can
run code when reading.
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbdata._core.checksum import crc32
from rbdata._core.files import open_nofollow, preallocate
from rbdata.checkpoint._checksum import entry
from rbdata.checkpoint._format import ALIGN as _ALIGN
from rbdata.checkpoint._format import MARK
from rbdata.checkpoint._meta import check_table as check_table_names
from rbdata.errors import CheckpointError

__all__ = [
    "MARK",
    "check_table",
    "decode",
    "dtype_from_name",
    "encode",
    "read_tensors",
    "write_tensors",
]

#: the key that marks a non-JSON value in an encoded state


def dtype_from_name(name: Any) -> torch.dtype:
    """The torch dtype called ``name`` (e.g. ``"float32"``); ``CheckpointError`` otherwise."""
    dtype = getattr(torch, str(name), None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r}")
    return dtype


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def encode(obj: Any, tensors: list[torch.Tensor], where: str) -> Any:
    """Encode ``obj`` as JSON, appending its tensors to ``tensors``.

    Args:
        obj: the value to encode.
        tensors: the list that receives the tensors (referenced by position).
        where: a name for ``obj`` in error messages (e.g. ``"sampler state"``).

    Raises:
        TypeError: for a value with no pickle-free encoding; the message names its type and
            where it was found.

    Examples:
        >>> tensors = []
        >>> encode({"pos": 3, "perm": torch.arange(4)}, tensors, "state")
        {'pos': 3, 'perm': {'$rb': 'tensor', 'i': 0}}
        >>> decode(_, tensors, "state")["perm"].tolist()
        [0, 1, 2, 3]
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        return float(obj)
    if isinstance(obj, np.ndarray):
        obj = torch.from_numpy(obj)
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return {MARK: "tensor", "i": len(tensors) - 1}
    if isinstance(obj, torch.dtype):
        return {MARK: "dtype", "name": _dtype_name(obj)}
    if isinstance(obj, torch.device):
        return {MARK: "device", "name": str(obj)}
    if isinstance(obj, TensorDictBase):
        entries = {key: encode(value, tensors, f"{where}[{key!r}]") for key, value in obj.items()}
        return {MARK: "tensordict", "batch_size": list(obj.batch_size), "entries": entries}
    if isinstance(obj, (list, tuple)):
        items = [encode(value, tensors, f"{where}[{i}]") for i, value in enumerate(obj)]
        return items if isinstance(obj, list) else {MARK: "tuple", "items": items}
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if not isinstance(key, str) or key == MARK:
                raise TypeError(f"{where}: a checkpoint needs string keys, got the key {key!r}")
            out[key] = encode(value, tensors, f"{where}[{key!r}]")
        return out
    raise TypeError(
        f"{where}: cannot store a {type(obj).__qualname__} in a checkpoint without pickle "
        "(supported: tensors, arrays, TensorDicts, numbers, strings, None, and lists, tuples "
        "and str-keyed dicts of these)"
    )


def decode(obj: Any, tensors: list[torch.Tensor], where: str) -> Any:
    """Rebuild a value written by :func:`encode`; ``CheckpointError`` on anything malformed."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [decode(value, tensors, where) for value in obj]
    if not isinstance(obj, dict):
        raise CheckpointError(f"{where}: unexpected JSON value {obj!r}")
    kind = obj.get(MARK)
    if kind is None:
        return {key: decode(value, tensors, where) for key, value in obj.items()}
    try:
        if kind == "tensor":
            i = obj["i"]
            if not isinstance(i, int) or not 0 <= i < len(tensors):
                raise CheckpointError(f"{where}: tensor reference {i!r} out of range")
            return tensors[i]
        if kind == "tuple":
            return tuple(decode(obj["items"], tensors, where))
        if kind == "dtype":
            return dtype_from_name(obj["name"])
        if kind == "device":
            return torch.device(str(obj["name"]))
        if kind == "tensordict":
            entries = decode(obj["entries"], tensors, where)
            return TensorDict(entries, batch_size=[int(s) for s in obj["batch_size"]])
    except (KeyError, TypeError, RuntimeError) as err:
        raise CheckpointError(f"{where}: malformed {kind!r} entry ({err})") from err
    raise CheckpointError(f"{where}: unknown entry kind {kind!r}")


def _raw_bytes(t: torch.Tensor) -> np.ndarray:
    if not t.numel():  # an empty tensor may keep a stride a byte view refuses
        return np.zeros(0, dtype=np.uint8)
    t = t.detach().cpu().contiguous().reshape(-1)
    if t.dtype.is_complex:
        t = torch.view_as_real(t).reshape(-1)
    return t.view(torch.uint8).numpy()


def _file_bytes(tensors: list[torch.Tensor]) -> int:
    """The size of the file :func:`write_tensors` writes."""
    offset = 0
    for t in tensors:
        offset += -offset % _ALIGN
        offset += t.numel() * t.element_size()
    return offset


def write_tensors(
    file: Path, tensors: list[torch.Tensor], fsync: bool = True, tail: bytes = b""
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Write ``tensors`` back to back (64-byte aligned) to ``file``, then ``tail``.

    Returns the table (dtype, shape, byte offset of each tensor) and the file's checksum
    entry, computed over the bytes as they are written. ``tail`` (the checkpoint's id
    trailer) is outside every tensor: readers only read what the table names.
    """
    table = []
    offset = crc = 0
    with open(file, "wb") as f:
        preallocate(f.fileno(), 0, _file_bytes(tensors))
        for t in tensors:
            raw = _raw_bytes(t)
            pad = -offset % _ALIGN
            if pad:
                f.write(b"\0" * pad)
                crc = crc32(b"\0" * pad, crc)
                offset += pad
            f.write(raw.data)
            crc = crc32(raw.data, crc)
            table.append({"dtype": _dtype_name(t.dtype), "shape": list(t.shape), "offset": offset})
            offset += raw.nbytes
        if tail:
            f.write(tail)
            crc = crc32(tail, crc)
            offset += len(tail)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return table, entry(offset, offset, crc)


def check_table(file: Path, table: Any) -> list[tuple[torch.dtype, list[int], int, int]]:
    """Check a tensor table against the size of ``file``; nothing is read or allocated.

    Returns ``(dtype, shape, offset, nbytes)`` per tensor (the torch-free
    :func:`~rbdata.checkpoint._meta.check_table`, its dtype names made torch dtypes).
    """
    return [(getattr(torch, d), s, o, n) for d, s, o, n in check_table_names(file, table)]


def read_tensors(file: Path, table: Any) -> list[torch.Tensor]:
    """Read the tensors of ``file`` described by ``table``; every entry is checked first.

    Only the bytes the table names are read (never a symlink): trailing junk costs nothing.
    """
    entries = check_table(file, table)
    tensors = []
    try:
        with open_nofollow(file, "rb") as f:
            for dtype, shape, offset, nbytes in entries:
                # one allocation per tensor, not views of one blob: a view's storage is the
                # whole blob, which torch.save would then write (and refuse to read back)
                raw = torch.empty(nbytes, dtype=torch.uint8)
                if nbytes:
                    f.seek(offset)
                    got = f.readinto(raw.numpy().data)
                    if got != nbytes:
                        raise CheckpointError(
                            f"{file}: {offset + got} bytes, the table needs {offset + nbytes}; "
                            "truncated"
                        )
                if dtype.is_complex:
                    real = torch.empty(0, dtype=dtype).real.dtype
                    t = torch.view_as_complex(raw.view(real).view(-1, 2))
                else:
                    t = raw.view(dtype)
                tensors.append(t.view(shape))
    except CheckpointError:
        raise
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{file}: cannot be read ({err})") from err
    return tensors
