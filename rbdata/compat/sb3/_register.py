"""SB3's ``isinstance`` checks accept :mod:`rbdata.compat.sb3`'s buffers, without importing SB3.

SB3's buffers are abstract base classes (``BaseBuffer(ABC)``), so ours become *virtual
subclasses* of theirs by ``ABCMeta.register``: ``isinstance(ours, <SB3's ReplayBuffer>)`` is
then true (what ``OffPolicyAlgorithm.load_replay_buffer`` asserts), while our classes keep
no SB3 base, no SB3 state and no import of SB3. Registration is done:

- when :mod:`rbdata.compat.sb3` is imported after ``stable_baselines3.common.buffers``;
- when one of our buffers is built or unpickled and SB3 has been imported since
  (a dictionary look-up in ``sys.modules`` until it is done);
- by :func:`register_with_sb3`, which imports SB3: for a buffer built before SB3 was imported
  and checked by SB3 afterwards with nothing of ours run in between.
"""

from __future__ import annotations

import sys
from abc import ABCMeta
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["counterpart_of", "register_if_loaded", "register_with_sb3"]

SB3_BUFFERS = "stable_baselines3.common.buffers"
T = TypeVar("T", bound=type)

#: SB3 class name -> our class that stands for it
_OURS: dict[str, type] = {}
_done = False


def counterpart_of(name: str) -> Callable[[T], T]:
    """Class decorator: the class stands for SB3's ``stable_baselines3.common.buffers.<name>``.

    Examples:
        >>> from rbdata.compat.sb3 import DictReplayBuffer  # @counterpart_of("DictReplayBuffer")
        >>> _OURS["DictReplayBuffer"] is DictReplayBuffer
        True
    """

    def mark(cls: T) -> T:
        _OURS[name] = cls
        return cls

    return mark


def _register(module: Any) -> bool:
    """Register every class of ours with SB3's in ``module``; whether all were found."""
    found = 0
    for name, ours in _OURS.items():
        theirs = getattr(module, name, None)
        # a class of ours put in SB3's place (tests/sb3_suite) is not SB3's: skip it
        if isinstance(theirs, ABCMeta) and theirs is not ours:
            theirs.register(ours)
            found += 1
    return found == len(_OURS)


def register_if_loaded() -> None:
    """Register with SB3's classes if SB3's buffers module is imported (else nothing)."""
    global _done
    if _done:
        return
    module = sys.modules.get(SB3_BUFFERS)
    if module is not None:
        _done = _register(module)


def register_with_sb3() -> None:
    """Import SB3's buffers and make its ``isinstance`` checks accept our buffers.

    Only needed for a buffer built before ``stable_baselines3`` was imported; otherwise it
    happens by itself.

    Raises:
        ImportError: with the install line, if stable-baselines3 is not installed.

    Examples:
        >>> from rbdata.compat.sb3 import ReplayBuffer, register_with_sb3
        >>> register_with_sb3()
        >>> from stable_baselines3.common import buffers
        >>> issubclass(ReplayBuffer, buffers.ReplayBuffer)
        True
    """
    global _done
    try:
        import importlib

        module = importlib.import_module(SB3_BUFFERS)
    except ImportError as err:
        raise ImportError(
            "register_with_sb3() needs stable-baselines3: pip install stable-baselines3 "
            "(rbdata.compat.sb3 itself works without it)"
        ) from err
    _done = _register(module)
