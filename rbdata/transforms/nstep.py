"""``NStepReturn``: n-step discounted returns as a transform of sampled batches.

On tensor and memmap storages in CPU memory the whole batch is one numba pass
(``_nstep_cpu.py``: each window scanned from its first step's flags, the returns summed from
the reward column, the last step's rows copied into the batch). Its reference, for every
other storage and device, is the general path here: the transform's own
:class:`~rbdata.transforms.EpisodeIndex` of the done flags (and one of the truncation flags,
where the items have them) gives each window with one ``searchsorted`` per index over the
whole batch (:func:`nstep_windows`), then one read of one column gives the window's rewards
and one gather the last steps' entries. The storage is never written.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbdata._core.layout import Key, flatten
from rbdata._core.layout.keys import key_name
from rbdata.errors import MissingKeyError
from rbdata.transforms._batch import get_entry, leaf_names, put_entry, sampled_index
from rbdata.transforms._nstep_cpu import CpuNStep
from rbdata.transforms.episodes import EpisodeIndex, as_key, read_column

__all__ = ["STEPS_KEY", "NStepReturn", "nstep_windows", "plain_columns"]

#: the entry the transform adds: each item's window length ``k`` (int64)
STEPS_KEY: Key = ("next", "steps")
_NONE = np.empty(0, np.int64)  # no truncation ends


def _next_end(ends: np.ndarray, t: np.ndarray, never: int) -> np.ndarray:
    """The first of the sorted ``ends`` at or after each ``t`` (``never`` where none is)."""
    if ends.size == 0:
        return np.full_like(t, never)
    j = np.searchsorted(ends, t)
    found = ends[np.minimum(j, ends.size - 1)]
    return np.where(j < ends.size, found, never)


def nstep_windows(
    t: np.ndarray, n: int, time: int, *end_lists: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The last time and the length ``k`` of each n-step window starting at the times ``t``.

    A window holds the steps ``t, t + 1, ..., t + k - 1`` with ``k = min(n, e - t + 1)``,
    where ``e`` is the first episode end at or after ``t`` in any of ``end_lists`` (sorted
    times), or the newest step written (``time - 1``) if it comes first.

    Examples:
        >>> import numpy as np
        >>> last, k = nstep_windows(np.array([0, 1, 2, 5]), 3, 7, np.array([2, 4]))
        >>> last.tolist(), k.tolist()
        ([2, 2, 2, 6], [3, 2, 1, 2])
    """
    last = np.minimum(t + (n - 1), time - 1)
    for ends in end_lists:
        last = np.minimum(last, _next_end(ends, t, time - 1))
    return last, last - t + 1


def plain_columns(storage: Any) -> Any:
    """The storage that holds ``storage``'s fields as plain tensors, or ``None``.

    A storage with plain backing tensors (``buffers`` in ``layout`` order: tensor and memmap
    storages) is itself; a frame storage's fields other than its stacks are in its
    ``steps`` storage; list and Arrow storages have none.
    """
    for source in (storage, getattr(storage, "steps", None)):
        keys = getattr(getattr(source, "layout", None), "keys", None)
        if keys is not None and getattr(source, "buffers", None) is not None:
            return source
    return None


class NStepReturn:
    """Replace each sampled transition by its n-step transition.

    For a sampled step ``t`` the window is the steps ``t, ..., t + k - 1`` with ``k =
    min(n, steps left in the episode)``: it stops at the first step whose ``done_key`` (or,
    where the items have one, ``truncated_key``) is set, and at the newest step written while
    an episode is still running. It never reads across the ring's seam nor across episodes.
    The batch's entries become:

    - ``reward_key``: ``sum(gamma ** i * reward[t + i] for i in range(k))``;
    - every other ``("next", ...)`` entry (the next observation, ``done_key``, terminated,
      truncated, ...): the one of step ``t + k - 1``. ``done_key`` is then "done within the
      window": the window stops at the first done. A truncation ends the window but stays
      what it is in the data (SB3's ``NStepReplayBuffer``: its ``dones`` are
      ``done * (1 - truncated)`` of step ``t + k - 1``, the flag to bootstrap with);
    - ``("next", "steps")``: ``k`` (int64, shaped like the done flags), so the bootstrap
      discount is ``gamma ** k``.

    With ``n=1`` every entry is left as sampled and ``("next", "steps")`` is 1. On a
    :class:`~rbdata.storages.FrameStackStorage` the next observation is the stack
    ``k`` steps later (the ``("next", ...)`` stack of step ``t + k - 1``).

    Episodes come through an :class:`~rbdata.transforms.EpisodeIndex` that follows the
    storage's writes, which must go in time order through a ring
    (:class:`~rbdata.RoundRobinWriter`, offline datasets).

    Args:
        storage: the storage the batches are sampled from.
        n: the number of steps, at least 1.
        gamma: the discount, in ``[0, 1]``.
        reward_key: the per-step reward.
        done_key: the per-step done flag (it ends the window).
        truncated_key: a per-step truncation flag that ends the window as well, used where
            the items have it (``None``: never).

    Raises:
        ValueError: ``n`` below 1 or ``gamma`` outside ``[0, 1]``.
        TypeError: ``n`` not an int, ``gamma`` not a number, or a key not a str or tuple.

    Examples:
        >>> import torch
        >>> from rbdata import ReplayBuffer, TensorStorage
        >>> storage = TensorStorage(100)
        >>> rb = ReplayBuffer(storage, transform=NStepReturn(storage, 3, 0.5))
        >>> done = torch.tensor([0, 0, 0, 1, 0, 1], dtype=torch.bool).unsqueeze(1)
        >>> _ = rb.extend({"observation": torch.arange(6.0).unsqueeze(1),
        ...     "next": {"observation": torch.arange(1.0, 7.0).unsqueeze(1),
        ...              "reward": torch.ones(6, 1), "done": done}})
        >>> index = torch.arange(6)  # every step (rb.sample(...) draws random ones)
        >>> batch = rb.transform(storage[index].set("index", index))
        >>> batch["next", "reward"].squeeze(1).tolist()  # 1 + 0.5 + 0.25, ... at the ends
        [1.75, 1.75, 1.5, 1.0, 1.5, 1.0]
        >>> batch["next", "steps"].squeeze(1).tolist()
        [3, 3, 2, 1, 2, 1]
        >>> batch["next", "observation"].squeeze(1).tolist()  # the observation k steps later
        [3.0, 4.0, 4.0, 4.0, 6.0, 6.0]
        >>> batch["next", "done"].squeeze(1).tolist()
        [False, True, True, True, True, True]
    """

    def __init__(
        self,
        storage: Any,
        n: int,
        gamma: float,
        *,
        reward_key: str | tuple[str, ...] = ("next", "reward"),
        done_key: str | tuple[str, ...] = ("next", "done"),
        truncated_key: str | tuple[str, ...] | None = ("next", "truncated"),
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"n must be an int (the number of steps), got {n!r}")
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)):
            raise TypeError(f"gamma must be a number in [0, 1], got {gamma!r}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
        self.n = int(n)
        self.gamma = float(gamma)
        self.reward_key = as_key(reward_key, "reward_key")
        self.done_key = as_key(done_key, "done_key")
        self.truncated_key = (
            None if truncated_key is None else as_key(truncated_key, "truncated_key")
        )
        self.episodes = EpisodeIndex(storage, end_key=self.done_key)
        self.truncations: EpisodeIndex | None = None  # made when a batch has truncated_key
        self.storage = storage
        #: ``gamma ** i`` for ``i < n``
        self.discounts = self.gamma ** np.arange(self.n, dtype=np.float64)
        #: held while the episode indexes are in use (a transform may be called from several
        #: threads, as by a ``torchdata.nodes.ParallelMapper``)
        self.lock = threading.Lock()
        self._cpu = self._cpu_path()

    def _cpu_path(self) -> CpuNStep:
        """The CPU path (it declines storages without plain columns of their own)."""
        return CpuNStep(
            self.storage, self.reward_key, self.done_key, self.truncated_key, STEPS_KEY,
            self.discounts,
        )  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"NStepReturn(n={self.n}, gamma={self.gamma}, reward_key="
            f"{key_name(self.reward_key)}, done_key={key_name(self.done_key)})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["lock"] = None  # a lock does not pickle: a new one on arrival
        state["_cpu"] = None  # nor its plan of the storage's columns: made anew
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()
        self._cpu = self._cpu_path()

    # --- the windows --------------------------------------------------------------------------
    def ends(self, truncations: bool = False) -> tuple[np.ndarray, np.ndarray, int, int]:
        """The episode indexes' end times (done, truncation), their time and base slot.

        Syncs the indexes with the storage first. ``truncations``: whether
        ``truncated_key`` ends windows too (else the truncation ends are empty).

        Raises:
            ValueError: if the storage is empty.
        """
        with self.lock:
            episodes = self.episodes
            episodes.sync()
            if episodes.time == 0:
                raise ValueError("NStepReturn: the storage is empty")
            cuts = _NONE
            if truncations:
                index = self.truncations
                if index is None:
                    assert self.truncated_key is not None
                    index = EpisodeIndex(self.storage, end_key=self.truncated_key)
                    self.truncations = index
                index.sync()
                cuts = index.ends
            return episodes.ends, cuts, episodes.time, episodes.base

    def windows(
        self, index: torch.Tensor, truncations: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """The last slots and the lengths ``k`` of the windows of the slots ``index``.

        ``truncations``: whether ``truncated_key`` ends windows too. Syncs first.

        Raises:
            ValueError: if the storage is empty.
            IndexError: if a slot is not in ``[0, len(storage))``.
        """
        ends, cuts, time, base = self.ends(truncations)
        slots = index.numpy() if index.device.type == "cpu" else index.cpu().numpy()
        length = len(self.storage)
        if slots.size and (int(slots.min()) < 0 or int(slots.max()) >= length):
            raise IndexError(
                f"NStepReturn: the batch's 'index' must hold slots in [0, {length}), got "
                f"values from {int(slots.min())} to {int(slots.max())}"
            )
        capacity = self.episodes.capacity
        oldest = max(0, time - capacity)
        t = oldest + (slots.astype(np.int64) - base - oldest) % capacity
        last, k = nstep_windows(t, self.n, time, ends, cuts)
        return (last + base) % capacity, k

    # --- the transform ------------------------------------------------------------------------
    def __call__(self, batch: Any) -> Any:
        """Turn a sampled batch (a TensorDict carrying ``"index"``) into n-step transitions."""
        if type(batch) is TensorDict and self.n > 1 and self._cpu.apply(batch, self.ends, False):
            return batch  # the CPU path did the whole batch
        return self._apply(batch)

    def on_sampled(self, batch: Any) -> Any:
        """Turn a batch a :class:`~rbdata.ReplayBuffer` has just sampled; return it.

        The same values as calling the transform; on the CPU path the batch's rewards and
        ``("next", ...)`` entries, new tensors of the storage's gather that nothing else
        holds, are written in place rather than replaced.
        """
        if type(batch) is TensorDict and self.n > 1 and self._cpu.apply(batch, self.ends, True):
            return batch
        return self._apply(batch)

    def _apply(self, batch: Any) -> Any:
        """The general path (any storage, device and batch): the reference of the CPU path."""
        index = sampled_index(batch, "NStepReturn")
        reward = self._entry(batch, self.reward_key, "reward_key")
        done = self._entry(batch, self.done_key, "done_key")
        size = index.shape[0]
        if reward.shape[:1] != (size,) or done.numel() != size:
            raise ValueError(
                f"NStepReturn: expected one reward and one done flag per item ({size}), got "
                f"{key_name(self.reward_key)} of shape {tuple(reward.shape)} and "
                f"{key_name(self.done_key)} of shape {tuple(done.shape)}"
            )
        truncations = self.truncated_key is not None and isinstance(
            get_entry(batch, self.truncated_key), torch.Tensor
        )
        if self.n == 1:
            k = torch.ones(size, dtype=torch.int64)
        else:
            last_slots, k_np = self.windows(index, truncations)
            k = torch.from_numpy(k_np)
            last = torch.from_numpy(last_slots)
            put_entry(batch, self.reward_key, self._returns(last, k_np, reward))
            self._take_next(batch, last)
        put_entry(batch, STEPS_KEY, k.view(done.shape).to(done.device))
        return batch

    def _entry(self, batch: TensorDictBase, key: Key, name: str) -> torch.Tensor:
        value = get_entry(batch, key)
        if not isinstance(value, torch.Tensor):
            raise MissingKeyError(
                f"NStepReturn: the batch has no {name} {key_name(key)}; its keys: "
                f"{leaf_names(batch)}"
            )
        return value

    def _returns(self, last: torch.Tensor, k: np.ndarray, reward: torch.Tensor) -> torch.Tensor:
        """The discounted sums of the rewards of each window (shaped and typed as ``reward``).

        ``last``: the windows' last slots; ``k``: their lengths. The sums run in float64.
        """
        n, size, capacity = self.n, k.shape[0], self.episodes.capacity
        steps = np.arange(n)
        back = np.minimum(steps, k[:, None] - 1) - (k[:, None] - 1)  # never past the window
        slots = torch.from_numpy(((last.numpy()[:, None] + back) % capacity).reshape(-1))
        source = plain_columns(self.storage)
        keys = getattr(getattr(source, "layout", None), "keys", ())
        rewards = read_column(source if self.reward_key in keys else self.storage,
                              self.reward_key, slots)  # fmt: skip
        weights = torch.from_numpy(np.where(steps < k[:, None], self.discounts, 0.0))
        values = rewards.to(dtype=torch.float64, device="cpu").reshape(size, n, -1)
        total = (values * weights.unsqueeze(-1)).sum(1)
        dtype = reward.dtype if reward.dtype.is_floating_point else torch.get_default_dtype()
        return total.to(device=reward.device, dtype=dtype).view(reward.shape)

    def _take_next(self, batch: TensorDictBase, last_slots: torch.Tensor) -> None:
        """Set every ``("next", ...)`` entry (and ``done_key``) to the one at ``last_slots``."""
        nxt = get_entry(batch, ("next",))
        keys = [] if nxt is None else [("next", *key) for key in flatten(nxt)[1]]
        keys = [key for key in keys if key != self.reward_key and key != STEPS_KEY]
        if self.done_key not in keys:
            keys.append(self.done_key)
        storage = self.storage
        layout_keys = getattr(getattr(storage, "layout", None), "keys", None) or ()
        if plain_columns(storage) is storage and all(key in layout_keys for key in keys):
            values = [read_column(storage, key, last_slots) for key in keys]
        else:
            items = storage.gather(last_slots.to(storage.device), None)
            values = [get_entry(items, key) for key in keys]
        for key, value in zip(keys, values, strict=True):
            old = get_entry(batch, key)
            if not isinstance(value, torch.Tensor) or not isinstance(old, torch.Tensor):
                continue  # an entry only the batch has (added by a sampler): left as it is
            put_entry(batch, key, value.to(old.device))

    # --- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Nothing to save: the transform draws nothing, and reads its episodes from the storage."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (the episode indexes are rebuilt on the next call)."""
        del state
        self.episodes.reset()
        if self.truncations is not None:
            self.truncations.reset()
