"""The per-step write and the batch gather of :mod:`rbdata.compat.sb3`, on a fixed schema.

A :class:`StepWriter` knows the one layout an SB3 buffer has, so an ``add`` needs no layout
inference: the arguments are first cast (numpy assignment: SB3's own casting and
broadcasting) into staging arrays, so a bad argument raises before anything is written.
Then one of two paths writes them:

- the reference path, for every storage: the staging tensors form a reusable
  :class:`~rbdata.storages.base.Prepared` that :meth:`~rbdata.storages.Storage.commit` writes,
  keeping the storage's length and next slot (and, for a
  :class:`~rbdata.storages.MemmapStorage`, its crash-atomic journal);
- the fast path, for a CPU storage whose class declares
  :attr:`~rbdata.storages.Storage.writes_rows` (:class:`~rbdata.storages.TensorStorage`,
  :class:`~rbdata.storages.MemmapStorage`) not shared between processes, once its memory is
  allocated: the staging arrays, already of the layout's dtypes and shapes, go to the
  storage's per-step row write (one numpy slice assignment per leaf, what SB3 itself does;
  through the journal over live slots of a memmap), which keeps the length and next slot.

``tests/test_compat_sb3.py`` checks that both paths leave identical storages.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from rbdata._layout import Layout, nest
from rbdata.storages.base import Prepared, Storage, WriteTarget
from rbdata.storages.memmap import MemmapStorage
from rbdata.storages.tensor import TensorStorage

__all__ = ["KEYS", "StepWriter"]

OBS, ACTION, NEXT_OBS = ("observation",), ("action",), ("next", "observation")
REWARD, DONE, TRUNCATED = ("next", "reward"), ("next", "done"), ("next", "truncated")
#: the stored keys (``NEXT_OBS`` absent with ``optimize_memory_usage``)
KEYS = (OBS, ACTION, NEXT_OBS, REWARD, DONE, TRUNCATED)


def _shape_error(name: str, expected: tuple[int, ...], value: Any, err: Exception) -> ValueError:
    given = getattr(value, "shape", None)
    given_s = f"shape {tuple(given)}" if given is not None else f"a {type(value).__name__}"
    return ValueError(f"{name}: expected shape {expected} (or broadcastable), got {given_s}: {err}")


class StepWriter:
    """Staging arrays + a reusable ``Prepared`` for one step of ``n_envs`` transitions."""

    def __init__(
        self,
        n_slots: int,
        n_envs: int,
        obs_shape: tuple[int, ...],
        obs_dtype: np.dtype[Any],
        action_dim: int,
        action_dtype: np.dtype[Any],
        *,
        discrete_obs: bool,
        next_in_slot: bool,
        timeouts: bool,
    ) -> None:
        # what pickling keeps: the staging tensors alias numpy arrays, which a pickle would
        # copy apart, so an unpickled writer is rebuilt from these (and attached again)
        self._args = (n_slots, n_envs, obs_shape, obs_dtype, action_dim, action_dtype)
        self._flags = {"discrete_obs": discrete_obs, "next_in_slot": next_in_slot}
        self._flags["timeouts"] = timeouts
        self.n_slots, self.n_envs = n_slots, n_envs
        self.capacity = n_slots * n_envs
        self.discrete_obs, self.next_in_slot, self.timeouts = discrete_obs, next_in_slot, timeouts
        self.obs_item = (n_envs, *obs_shape)
        self.action_item = (n_envs, action_dim)
        stage = {
            OBS: np.zeros(self.obs_item, obs_dtype),
            ACTION: np.zeros(self.action_item, action_dtype),
            NEXT_OBS: np.zeros(self.obs_item, obs_dtype),
            REWARD: np.zeros(n_envs, np.float32),
            DONE: np.zeros(n_envs, np.float32),
            TRUNCATED: np.zeros(n_envs, np.float32),
        }
        if next_in_slot:  # the next observation goes to the next slot's observation
            blank = {k: np.zeros_like(v) for k, v in stage.items() if k != NEXT_OBS}
            blank[OBS] = stage.pop(NEXT_OBS)
            self._next_obs = blank[OBS]
        else:
            self._next_obs = stage[NEXT_OBS]
        self._obs, self._action = stage[OBS], stage[ACTION]
        self._reward, self._done, self._truncated = stage[REWARD], stage[DONE], stage[TRUNCATED]
        tensors = {k: torch.from_numpy(v) for k, v in stage.items()}
        self.layout = Layout.from_data(nest(tensors.items()), batched=True)
        self._step = self._prepared(stage)
        self._blank = self._prepared(blank) if next_in_slot else None
        self._leaf_of = {leaf.key: i for i, leaf in enumerate(self.layout.leaves)}
        leaves = self.layout.leaves
        # one step in layout order for the fast path: [n_envs, ...] per leaf, and with one env
        # the item's row views ([0, ...]) that a one-item write takes
        rows = [stage[leaf.key] for leaf in leaves]
        self._stage_rows = rows if n_envs > 1 else [r[0, ...] for r in rows]
        rows = [blank[leaf.key] for leaf in leaves] if next_in_slot else []
        self._blank_rows = rows if n_envs > 1 else [r[0, ...] for r in rows]
        self._fast = False

    def __getstate__(self) -> dict[str, Any]:
        return {"args": self._args, "flags": self._flags}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(*state["args"], **state["flags"])  # type: ignore[misc]

    def _prepared(self, stage: dict[tuple[str, ...], np.ndarray[Any, Any]]) -> Prepared:
        """The staging arrays as one item (``n_envs == 1``: the numpy row path) or a batch."""
        one = self.n_envs == 1
        payload = [
            torch.from_numpy(stage[leaf.key][0, ...] if one else stage[leaf.key])
            for leaf in self.layout.leaves
        ]
        return Prepared(payload, 1 if one else self.n_envs, self.layout, not one)

    # --- storage ------------------------------------------------------------------------------
    def open_storage(self, storage: Any, path: str | os.PathLike[str] | None) -> Storage:
        """The storage named by ``storage`` (checked against this schema if given one)."""
        cap = self.capacity
        if storage == "tensor":
            if path is not None:
                raise ValueError("path: only storage='memmap' takes a path")
            return TensorStorage(cap)
        if storage == "memmap":
            return MemmapStorage(cap, path)
        if not isinstance(storage, TensorStorage):
            raise TypeError(
                "storage: expected 'tensor', 'memmap', a TensorStorage or a MemmapStorage, "
                f"got {storage!r:.80}"
            )
        if path is not None:
            raise ValueError("path: give the path to MemmapStorage itself, not here")
        if storage.capacity != cap:
            raise ValueError(
                f"storage: expected capacity {cap} (buffer_size // n_envs * n_envs), "
                f"got {storage.capacity}"
            )
        if storage.layout is not None and storage.layout != self.layout:
            raise ValueError(f"storage: expected layout {self.layout}, got {storage.layout}")
        self.position(storage)
        return storage

    def attach(self, storage: Storage, *, fast: bool = True) -> None:
        """Write into ``storage`` from now on (the fast path if it allows and ``fast``)."""
        self._fast = fast and type(storage).writes_rows and not storage.shared
        self._fast = self._fast and storage.device.type == "cpu"

    def position(self, storage: Storage) -> tuple[int, bool]:
        """SB3's ``(pos, full)`` read from the storage's length and next slot."""
        n, length, nxt = self.n_envs, len(storage), storage.next_slot
        if length % n or nxt % n:
            raise ValueError(
                f"storage: length {length} and next slot {nxt} must be multiples of n_envs={n}"
            )
        full = length == self.capacity
        if not self.next_in_slot:
            return (nxt // n if full else length // n), full
        if length == 0:
            return 0, False
        # each add also wrote the next slot: pos is the slot before the last one written
        return (nxt // n - 1) % self.n_slots, full

    # --- writes -------------------------------------------------------------------------------
    def write(
        self,
        storage: Storage,
        pos: int,
        obs: Any,
        next_obs: Any,
        action: Any,
        reward: Any,
        done: Any,
        infos: Any,
    ) -> None:
        """Cast one step into the staging arrays (all checks), then commit it at ``pos``."""
        if self.discrete_obs:
            obs = self._reshape(obs, "obs")
            next_obs = self._reshape(next_obs, "next_obs")
        try:
            self._obs[...] = obs
        except (ValueError, TypeError) as err:
            raise _shape_error("obs", self.obs_item, obs, err) from None
        try:
            self._next_obs[...] = next_obs
        except (ValueError, TypeError) as err:
            raise _shape_error("next_obs", self.obs_item, next_obs, err) from None
        try:
            self._action[...] = np.asarray(action).reshape(self.action_item)
        except (ValueError, TypeError) as err:
            raise _shape_error("action", self.action_item, action, err) from None
        try:
            self._reward[...] = reward
        except (ValueError, TypeError) as err:
            raise _shape_error("reward", (self.n_envs,), reward, err) from None
        try:
            self._done[...] = done
        except (ValueError, TypeError) as err:
            raise _shape_error("done", (self.n_envs,), done, err) from None
        if self.timeouts:
            self._truncated[...] = self._timeouts(infos)
        # the fast path (False before the first commit allocated the storage's memory)
        if self._fast and self._write_fast(storage, pos, self._stage_rows):
            if self.next_in_slot:
                self._write_fast(storage, (pos + 1) % self.n_slots, self._blank_rows)
            return
        self._commit(storage, pos)

    def _write_fast(self, storage: Storage, pos: int, rows: list[np.ndarray[Any, Any]]) -> bool:
        """The step's rows at slot ``pos`` through the storage's per-step row write."""
        n = self.n_envs
        if n == 1:
            return storage.write_row(pos, rows)
        return storage.write_rows(pos * n, n, rows)

    def _commit(self, storage: Storage, pos: int) -> None:
        n = self.n_envs
        if n == 1:
            storage.commit(WriteTarget.one(pos), self._step)
            if self._blank is not None:
                storage.commit(WriteTarget.one((pos + 1) % self.n_slots), self._blank)
            return
        start = pos * n
        storage.commit(WriteTarget.of_runs([slice(start, start + n)]), self._step)
        if self._blank is not None:
            start = (pos + 1) % self.n_slots * n
            storage.commit(WriteTarget.of_runs([slice(start, start + n)]), self._blank)

    def _reshape(self, value: Any, name: str) -> np.ndarray[Any, Any]:
        try:
            return np.asarray(value).reshape(self.obs_item)
        except (ValueError, TypeError) as err:
            raise _shape_error(name, self.obs_item, value, err) from None

    def _timeouts(self, infos: Any) -> list[bool]:
        if not isinstance(infos, (list, tuple)) or len(infos) != self.n_envs:
            raise ValueError(
                f"infos: expected a list of {self.n_envs} dicts (one per env, as SB3's VecEnv "
                f"gives), got {type(infos).__name__}"
                + (f" of length {len(infos)}" if isinstance(infos, (list, tuple)) else "")
            )
        try:
            return [info.get("TimeLimit.truncated", False) for info in infos]
        except AttributeError:
            raise ValueError(
                f"infos: expected dicts, got {[type(i).__name__ for i in infos]}"
            ) from None

    # --- reads --------------------------------------------------------------------------------
    def gather(self, storage: Storage, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(observations, actions, next_observations, dones, rewards)`` at flat indices."""
        bufs = storage.buffers  # type: ignore[attr-defined]
        leaf = self._leaf_of
        if flat.device != storage.device:
            flat = flat.to(storage.device)
        obs_buf = bufs[leaf[OBS]]
        obs = torch.index_select(obs_buf, 0, flat)
        if self.next_in_slot:
            nxt = flat.add(self.n_envs).remainder_(self.capacity)
            next_obs = torch.index_select(obs_buf, 0, nxt)
        else:
            next_obs = torch.index_select(bufs[leaf[NEXT_OBS]], 0, flat)
        actions = torch.index_select(bufs[leaf[ACTION]], 0, flat)
        dones = torch.index_select(bufs[leaf[DONE]], 0, flat)
        if self.timeouts:  # SB3: dones * (1 - timeouts), in float32
            dones.mul_(torch.index_select(bufs[leaf[TRUNCATED]], 0, flat).neg_().add_(1))
        rewards = torch.index_select(bufs[leaf[REWARD]], 0, flat)
        return obs, actions, next_obs, dones.view(-1, 1), rewards.view(-1, 1)
