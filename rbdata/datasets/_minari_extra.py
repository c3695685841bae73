"""The ``minari`` extra: import it, or raise the error that names ``pip install 'rbdata[minari]'``.

Torch-free on purpose: ``rbdata datasets list`` lists Minari's local datasets with it without
importing torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rbdata.errors import MissingExtraError

__all__ = ["minari_module", "remote_access"]

#: what Minari's default remote (Hugging Face, ``hf://farama-minari``) needs
_REMOTE_PACKAGE = "huggingface_hub"


def minari_module(feature: str = "rbdata.datasets.Minari") -> Any:
    """The ``minari`` package, or a :class:`MissingExtraError` naming ``feature``."""
    try:
        import minari
    except ImportError as err:
        raise MissingExtraError("minari", "minari", feature) from err
    return minari


def _missing_module(err: BaseException) -> str | None:
    """The name of the module whose import failed somewhere in ``err``'s chain, if known."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ImportError) and current.name:
            return current.name
        current = current.__cause__ or current.__context__
    return None


@contextmanager
def remote_access(feature: str) -> Iterator[None]:
    """Turn Minari's ImportError for its remote's client into the ``rbdata[minari]`` line.

    Minari imports the client of its remote (``huggingface_hub`` for the default
    ``hf://farama-minari``) only when it lists or downloads remote datasets, and raises a bare
    ``ImportError`` without it. That client is part of ``rbdata[minari]``.

    Raises:
        rbdata.errors.MissingExtraError: the remote's client is missing; the message has
            ``pip install 'rbdata[minari]'``. Other remotes (``MINARI_REMOTE=gcp://...``) keep
            Minari's own message, which names their extra.
    """
    try:
        yield
    except ImportError as err:
        if isinstance(err, MissingExtraError):
            raise
        missing = _missing_module(err) or ""
        remote = os.environ.get("MINARI_REMOTE", "hf://")
        if missing.split(".")[0] == _REMOTE_PACKAGE or (
            not missing and remote.startswith("hf://") and _REMOTE_PACKAGE in str(err)
        ):
            raise MissingExtraError(_REMOTE_PACKAGE, "minari", feature) from err
        raise
