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

``tests/compat/test_compat_sb3.py`` checks that both paths leave identical storages.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rbdata._core.layout import Layout, nest
from rbdata.compat.sb3._spaces import ObsSpec
from rbdata.storages.base import Prepared, Storage, WriteTarget
from rbdata.storages.memmap import MemmapStorage
from rbdata.storages.tensor import TensorStorage

__all__ = ["ARRAYS", "KEYS", "StepWriter", "obs_key"]

Key = tuple[str, ...]
OBS, ACTION, NEXT_OBS = ("observation",), ("action",), ("next", "observation")
REWARD, DONE, TRUNCATED = ("next", "reward"), ("next", "done"), ("next", "truncated")
#: the stored keys (``NEXT_OBS`` absent with ``optimize_memory_usage``; with a ``Dict`` space,
#: ``OBS`` and ``NEXT_OBS`` are followed by the space's key)
KEYS = (OBS, ACTION, NEXT_OBS, REWARD, DONE, TRUNCATED)
#: SB3's array attributes and the stored keys they view
ARRAYS = {
    "observations": OBS,
    "next_observations": NEXT_OBS,
    "actions": ACTION,
    "rewards": REWARD,
    "dones": DONE,
    "timeouts": TRUNCATED,
}


def obs_key(prefix: Key, name: str | None) -> Key:
    """The stored key of observation ``name`` (``None``: the one array) under ``prefix``."""
    return prefix if name is None else (*prefix, name)


def _shape_error(name: str, expected: tuple[int, ...], value: Any, err: Exception) -> ValueError:
    given = getattr(value, "shape", None)
    given_s = f"shape {tuple(given)}" if given is not None else f"a {type(value).__name__}"
    return ValueError(f"{name}: expected shape {expected} (or broadcastable), got {given_s}: {err}")


class StepWriter:
    """Staging arrays + a reusable ``Prepared`` for one step of ``n_envs`` transitions.

    ``obs``: the one observation array's :class:`ObsSpec`, or one per key of a ``Dict``
    space (stored under ``("observation", key)`` and ``("next", "observation", key)``).
    """

    def __init__(
        self,
        n_slots: int,
        n_envs: int,
        obs: ObsSpec | dict[str, ObsSpec],
        action_dim: int,
        action_dtype: np.dtype[Any],
        *,
        next_in_slot: bool,
        timeouts: bool,
    ) -> None:
        # what pickling keeps: the staging tensors alias numpy arrays, which a pickle would
        # copy apart, so an unpickled writer is rebuilt from these (and attached again)
        self._args = (n_slots, n_envs, obs, action_dim, action_dtype)
        self._flags: dict[str, Any] = {"next_in_slot": next_in_slot, "timeouts": timeouts}
        self.n_slots, self.n_envs = n_slots, n_envs
        self.capacity = n_slots * n_envs
        self.next_in_slot, self.timeouts = next_in_slot, timeouts
        self.dict_obs = isinstance(obs, dict)
        #: observation name (``None``: the one array) -> spec
        self.specs: dict[str | None, ObsSpec] = {None: obs} if isinstance(obs, ObsSpec) else {}
        if isinstance(obs, dict):
            self.specs.update(obs)
        if next_in_slot and self.dict_obs:
            raise ValueError("optimize_memory_usage: not with Dict observations (as in SB3)")
        if next_in_slot and timeouts:  # a cut's next observation would be the reset one
            raise ValueError(
                "ReplayBuffer does not support optimize_memory_usage = True "
                "and handle_timeout_termination = True simultaneously."
            )
        self.action_item = (n_envs, action_dim)
        stage: dict[Key, np.ndarray[Any, Any]] = {}
        for name, spec in self.specs.items():
            stage[obs_key(OBS, name)] = np.zeros((n_envs, *self.stored_shape(name)), spec.dtype)
        stage[ACTION] = np.zeros(self.action_item, action_dtype)
        for name, spec in self.specs.items():
            shape = (n_envs, *self.stored_shape(name))
            stage[obs_key(NEXT_OBS, name)] = np.zeros(shape, spec.dtype)
        stage[REWARD] = np.zeros(n_envs, np.float32)
        stage[DONE] = np.zeros(n_envs, np.float32)
        stage[TRUNCATED] = np.zeros(n_envs, np.float32)
        # what add casts the observations into: SB3-shaped views of the staging arrays
        self._obs = {name: self.sb3_view(name, stage[obs_key(OBS, name)]) for name in self.specs}
        if next_in_slot:  # the next observation goes to the next slot's observation
            blank = {k: np.zeros_like(v) for k, v in stage.items() if k != NEXT_OBS}
            blank[OBS] = stage.pop(NEXT_OBS)
            self._next_obs: dict[str | None, np.ndarray[Any, Any]] = {None: blank[OBS]}
        else:
            self._next_obs = {
                name: self.sb3_view(name, stage[obs_key(NEXT_OBS, name)]) for name in self.specs
            }
        self._action = stage[ACTION]
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

    def stored_shape(self, name: str | None) -> tuple[int, ...]:
        """The per-env shape observation ``name`` is stored in (SB3's own, here).

        A hook (:class:`~rbdata.compat.sb3._frames.FrameStepWriter` stores channel-last
        stacks channels first); called while ``__init__`` builds the staging arrays.
        """
        return self.specs[name].shape

    def sb3_view(self, name: str | None, staged: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Observation ``name``'s staging array ``[n_envs, *stored_shape]`` seen in SB3's shape.

        ``add`` casts into this view (the array itself, here); a hook like
        :meth:`stored_shape`.
        """
        del name
        return staged

    def __getstate__(self) -> dict[str, Any]:
        return {"args": self._args, "flags": self._flags}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(*state["args"], **state["flags"])  # type: ignore[misc]

    def _prepared(self, stage: dict[Key, np.ndarray[Any, Any]]) -> Prepared:
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
        return self.checked(storage)

    def checked(self, storage: Storage) -> Storage:
        """A storage given to the buffer, once its capacity, layout and length fit the schema.

        Raises:
            ValueError: naming what does not fit.
        """
        if storage.capacity != self.capacity:
            raise ValueError(
                f"storage: expected capacity {self.capacity} (buffer_size // n_envs * n_envs), "
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
        self._put_obs(self._obs, obs, "obs")
        self._put_obs(self._next_obs, next_obs, "next_obs")
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
            flags = self._timeouts(infos)
            try:  # as SB3: np.array of the flags (an info may hold a 1-element array)
                self._truncated[...] = np.array(flags)
            except (ValueError, TypeError) as err:
                raise _shape_error("infos", (self.n_envs,), np.array(flags, object), err) from None
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

    def _put_obs(self, stage: dict[str | None, np.ndarray[Any, Any]], value: Any, arg: str) -> None:
        """Cast observation ``value`` (one array, or a dict for a ``Dict`` space) into ``stage``."""
        if not self.dict_obs:
            self._put_one(stage[None], value, arg, self.specs[None])
            return
        if not isinstance(value, Mapping):
            raise ValueError(
                f"{arg}: expected a dict of arrays with keys {list(self.specs)}, "
                f"got {type(value).__name__}"
            )
        for name, spec in self.specs.items():
            if name not in value:
                raise ValueError(f"{arg}: key {name!r} missing (keys {list(value)})")
            self._put_one(stage[name], value[name], f"{arg}[{name!r}]", spec)

    def _put_one(self, dst: np.ndarray[Any, Any], value: Any, arg: str, spec: ObsSpec) -> None:
        shape = dst.shape
        try:
            if spec.discrete:  # numpy cannot broadcast (n_envs,) to (n_envs, 1): as SB3
                value = np.asarray(value).reshape(shape)
            dst[...] = value
        except (ValueError, TypeError) as err:
            raise _shape_error(arg, shape, value, err) from None

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
    def gather(self, storage: Storage, flat: torch.Tensor) -> tuple[Any, ...]:
        """``(observations, actions, next_observations, dones, rewards)`` at flat indices.

        Observations are a tensor, or a dict of tensors for a ``Dict`` space. ``dones`` are
        SB3's ``dones * (1 - timeouts)`` in float32 (the timeouts stay zero unless
        ``handle_timeout_termination`` or a write through ``timeouts`` set them).
        """
        bufs = storage.buffers  # type: ignore[attr-defined]
        leaf = self._leaf_of
        if flat.device != storage.device:
            flat = flat.to(storage.device)
        if self.next_in_slot:
            obs_buf = bufs[leaf[OBS]]
            obs: Any = torch.index_select(obs_buf, 0, flat)
            nxt = flat.add(self.n_envs).remainder_(self.capacity)
            next_obs: Any = torch.index_select(obs_buf, 0, nxt)
        elif self.dict_obs:
            obs = {n: torch.index_select(bufs[leaf[obs_key(OBS, n)]], 0, flat) for n in self.specs}
            next_obs = {
                n: torch.index_select(bufs[leaf[obs_key(NEXT_OBS, n)]], 0, flat) for n in self.specs
            }
        else:
            obs = torch.index_select(bufs[leaf[OBS]], 0, flat)
            next_obs = torch.index_select(bufs[leaf[NEXT_OBS]], 0, flat)
        actions = torch.index_select(bufs[leaf[ACTION]], 0, flat)
        dones = torch.index_select(bufs[leaf[DONE]], 0, flat)
        dones.mul_(torch.index_select(bufs[leaf[TRUNCATED]], 0, flat).neg_().add_(1))
        rewards = torch.index_select(bufs[leaf[REWARD]], 0, flat)
        return obs, actions, next_obs, dones.view(-1, 1), rewards.view(-1, 1)

    # --- SB3's arrays ---------------------------------------------------------------------
    def allocate(self, storage: Storage) -> None:
        """Give an empty, layout-less ``storage`` its (zeroed) memory, still holding no item.

        SB3's arrays exist from construction on: they are views of this memory.
        """
        if storage.layout is None:
            self._commit(storage, 0)  # the staging arrays are still zeros
            storage.clear()

    def array(self, storage: Storage, attr: str) -> Any:
        """SB3's array ``attr`` (see :data:`ARRAYS`): a view of ``storage``'s memory.

        Shaped ``[n_slots, n_envs, ...]``; a numpy array for a CPU storage, a tensor view on
        another device; a dict of them for observations of a ``Dict`` space.

        Raises:
            AttributeError: ``next_observations`` with ``optimize_memory_usage`` (as SB3:
                no such array), or an unknown name.
        """
        prefix = ARRAYS.get(attr)
        if prefix is None or (prefix == NEXT_OBS and self.next_in_slot):
            why = " (optimize_memory_usage keeps one observation array)" if prefix else ""
            raise AttributeError(f"the buffer has no array {attr!r}{why}")
        bufs = storage.buffers  # type: ignore[attr-defined]
        leaf = self._leaf_of
        if prefix in (OBS, NEXT_OBS) and self.dict_obs:
            return {n: self.slots_view(bufs[leaf[obs_key(prefix, n)]]) for n in self.specs}
        return self.slots_view(bufs[leaf[prefix]])

    def slots_view(self, buf: torch.Tensor) -> Any:
        """A stored leaf ``[capacity, ...]`` as SB3's ``[n_slots, n_envs, ...]`` (a view).

        A numpy array for a CPU buffer, a tensor view on another device.
        """
        shape = (self.n_slots, self.n_envs, *buf.shape[1:])
        if buf.device.type == "cpu":
            return buf.numpy().reshape(shape)  # a view: the buffers are contiguous
        return buf.view(shape)
