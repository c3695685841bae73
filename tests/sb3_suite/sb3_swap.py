"""A pytest plugin that runs Stable-Baselines3's own tests with rbdata's buffers swapped in.

Loaded with ``-p sb3_swap`` (``run_sb3_tests.py`` does it, with this folder on ``sys.path``),
before any test module is imported, it replaces SB3's ``ReplayBuffer`` and ``DictReplayBuffer`` by
:mod:`rbdata.compat.sb3`'s in every ``stable_baselines3`` module that holds them, so the test
modules' own ``from stable_baselines3.common.buffers import ReplayBuffer`` get ours too. SB3's
subclasses of them, ``NStepReplayBuffer`` and ``HerReplayBuffer``, are rebuilt from their own
source on top of ours (they read and write the buffer's arrays, so they test the views).

``RBDATA_SB3_SWAP``: ``all`` (the default: both classes and the subclasses rebuilt),
``buffers`` (both classes, SB3's subclasses left on SB3's) or ``none`` (SB3's own buffers: the
reference run). Nothing happens at import: the swap is done in ``pytest_configure``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

__all__ = ["pytest_configure", "pytest_report_header", "rebuild_class", "swap"]

MODES = ("all", "buffers", "none")
NAMES = ("ReplayBuffer", "DictReplayBuffer")


def _replace(replacements: dict[int, Any]) -> int:
    """Rebind every ``stable_baselines3`` module attribute that is a key of ``replacements``."""
    count = 0
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("stable_baselines3"):
            continue
        for attr, value in list(vars(module).items()):
            new = replacements.get(id(value))
            if new is not None and new is not value:
                setattr(module, attr, new)
                count += 1
    return count


def rebuild_class(cls: type, namespace: dict[str, Any]) -> type:
    """``cls`` defined again from its own source, its names looked up in ``namespace``."""
    source = inspect.getsource(cls)
    scope = dict(namespace)
    exec(compile(source, inspect.getsourcefile(cls) or "<sb3>", "exec"), scope)
    new = scope[cls.__name__]
    new.__module__ = cls.__module__
    return new


def swap(mode: str = "all") -> dict[str, type]:
    """Put rbdata's buffers in SB3's place; returns the classes now in place by name."""
    if mode not in MODES:
        raise ValueError(f"RBDATA_SB3_SWAP: expected one of {MODES}, got {mode!r}")
    import stable_baselines3  # noqa: F401  (every module that imports a buffer, loaded)
    from stable_baselines3.common import buffers

    if mode == "none":
        return {name: getattr(buffers, name) for name in NAMES}
    from rbdata.compat import sb3 as ours

    # an older rbdata (a baseline run) may lack some: those stay SB3's
    if hasattr(ours, "register_with_sb3"):
        ours.register_with_sb3()  # before the names change: SB3's isinstance checks accept ours
    done = {name: getattr(ours, name) for name in NAMES if hasattr(ours, name)}
    old_nstep = buffers.NStepReplayBuffer
    _replace({id(getattr(buffers, name)): cls for name, cls in done.items()})
    if mode == "all":
        # NStepReplayBuffer(ReplayBuffer) and HerReplayBuffer(DictReplayBuffer) on ours
        nstep = rebuild_class(old_nstep, vars(buffers))
        her_module = importlib.import_module("stable_baselines3.her.her_replay_buffer")
        old_her = her_module.HerReplayBuffer
        importlib.reload(her_module)  # its `from ...buffers import DictReplayBuffer`: ours
        her = her_module.HerReplayBuffer
        _replace({id(old_nstep): nstep, id(old_her): her})
        done |= {"NStepReplayBuffer": nstep, "HerReplayBuffer": her}
    return done


def pytest_configure(config: Any) -> None:
    """Swap before the test modules are imported."""
    mode = os.environ.get("RBDATA_SB3_SWAP", "all")
    config._rbdata_sb3 = (mode, swap(mode))


def pytest_report_header(config: Any) -> str:
    """Say which buffers the run uses."""
    mode, classes = config._rbdata_sb3
    where = ", ".join(f"{name}: {cls.__module__}" for name, cls in classes.items())
    return f"rbdata SB3 swap ({mode}): {where}"
