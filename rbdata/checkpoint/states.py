"""A state (plain values and tensors) as a pickle-free JSON + raw-tensor pair of files.

For composites of buffers (:class:`~rbdata.MixedBuffer`) that save, next to their parts'
checkpoints, a state of their own: weights, and the state of a sampler whose storage is not
saved (an offline dataset's). The encoding is the checkpoints' own (``checkpoint.json`` and
``tensors.bin``): loading reads JSON and raw arrays, never pickle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rbdata._core.files import atomic_write_json, read_meta
from rbdata.checkpoint._codec import decode, encode, read_tensors, write_tensors
from rbdata.checkpoint._registry import class_name
from rbdata.errors import CheckpointError

__all__ = ["STATE_FILE", "class_name", "read_state", "write_state"]

#: the JSON file :func:`write_state` writes (its tensors go to ``state.bin`` beside it)
STATE_FILE = "state.json"
_TENSORS = "state.bin"
_FORMAT = "rbdata.state"
_VERSION = 1


def write_state(directory: str | Path, state: Any, fsync: bool = True) -> None:
    """Write ``state`` (dicts, lists, plain values, tensors) into the existing ``directory``.

    Raises:
        TypeError: a value with no pickle-free encoding (nothing is written then).

    Examples:
        >>> import tempfile, torch
        >>> d = tempfile.mkdtemp()
        >>> write_state(d, {"w": 0.5, "t": torch.arange(3)}, fsync=False)
        >>> read_state(d)["t"].tolist()
        [0, 1, 2]
    """
    root = Path(directory)
    tensors: list[Any] = []
    encoded = encode(state, tensors, "state")
    table, _ = write_tensors(root / _TENSORS, tensors, fsync)
    meta = {"format": _FORMAT, "version": _VERSION, "state": encoded, "tensors": table}
    atomic_write_json(root / STATE_FILE, meta, fsync)


def read_state(directory: str | Path) -> Any:
    """Read a state written by :func:`write_state`.

    Raises:
        rbdata.errors.CheckpointError: missing, foreign or malformed files.
    """
    root = Path(directory)
    try:
        meta = read_meta(root, STATE_FILE, _FORMAT, _VERSION, "saved state")
        tensors = read_tensors(root / _TENSORS, meta.get("tensors"))
        return decode(meta.get("state"), tensors, "state")
    except CheckpointError:
        raise
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise CheckpointError(f"{root}: invalid saved state ({type(err).__name__}: {err})") from err
