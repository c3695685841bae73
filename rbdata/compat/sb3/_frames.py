"""``storage="frames"`` of :mod:`rbdata.compat.sb3`: image stacks in a ``FrameStackStorage``.

SB3 hands a buffer whole frame stacks, observation and next observation, for every env at
every step. With ``storage="frames"`` the image observation (the one ``Box`` of a
:class:`~rbdata.compat.sb3.ReplayBuffer`, or one key of a ``Dict`` space) goes to a
:class:`~rbdata.storages.FrameStackStorage`, which keeps each frame once (optionally
compressed), and every other field is stored as with ``storage="tensor"``:

- the storage's stacks are ``[stack, H, W]`` (or ``[stack, H, W, C]``). A channels-first
  space — ``(stack, H, W)`` from gymnasium's ``FrameStackObservation`` on grayscale frames, or
  ``(stack, H, W, C)`` on color ones — is stored as it is. A channel-last one — ``(H, W,
  stack)`` from SB3's ``VecFrameStack`` on Atari — is transposed to ``[stack, H, W]`` when
  written and back to ``(H, W, stack)`` (contiguous) when sampled. Which of the two a 3-D
  space is follows SB3's rule (``is_image_space_channels_first``: the smallest dimension
  first means channels first); a space whose smallest dimension is the middle one is refused.
- a step of ``n_envs`` transitions is one write of ``n_envs`` items, position ``j`` for env
  ``j``: the storage follows each env's stream, so each env's new frame is stored once.
- ``optimize_memory_usage`` changes nothing: the next observation is stored exactly (its
  frames are the observation's, shifted), so no slot is left out of the draw, and it is not
  refused together with ``handle_timeout_termination``.
- SB3's arrays ``actions``, ``rewards``, ``dones`` and ``timeouts`` are views of the storage
  as usual; ``observations`` and ``next_observations`` do not exist (no
  ``[buffer_size, n_envs, ...]`` array of stacks is ever built): ``sample`` and ``rb.storage``
  read the transitions.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np
import torch

from rbdata.compat.sb3._spaces import ObsSpec
from rbdata.compat.sb3._writes import (
    ACTION,
    ARRAYS,
    DONE,
    NEXT_OBS,
    OBS,
    REWARD,
    TRUNCATED,
    Key,
    StepWriter,
    obs_key,
)
from rbdata.storages.base import Storage
from rbdata.storages.frames import FrameStackStorage

__all__ = ["FrameStepWriter", "PixelStack", "pixels_key", "step_writer", "wants_frames"]


class PixelStack(NamedTuple):
    """How an SB3 image observation maps onto a ``FrameStackStorage``'s stacks.

    ``shape``: SB3's per-env shape; ``stack``: frames per stack; ``channels_last``: SB3's
    shape is ``(H, W, stack)``, stored as ``[stack, H, W]``.

    Examples:
        >>> import numpy as np
        >>> from rbdata.compat.sb3._spaces import ObsSpec
        >>> atari = PixelStack.of(ObsSpec((84, 84, 4), np.dtype(np.uint8), False), "obs")
        >>> atari.stack, atari.channels_last, atari.stored
        (4, True, (4, 84, 84))
        >>> PixelStack.of(ObsSpec((4, 84, 84), np.dtype(np.uint8), False), "obs").stored
        (4, 84, 84)
    """

    shape: tuple[int, ...]
    stack: int
    channels_last: bool

    @classmethod
    def of(cls, spec: ObsSpec, what: str) -> PixelStack:
        """The stack layout of an observation space (named ``what`` in errors).

        Raises:
            ValueError: the space is not a stack of images.
        """
        shape = spec.shape
        if spec.discrete or len(shape) not in (3, 4) or 0 in shape:
            raise ValueError(
                f"{what}: storage='frames' stores stacks of images, a Box of shape "
                f"(stack, H, W), (H, W, stack) or (stack, H, W, C); got shape {shape}"
            )
        if len(shape) == 4:
            return cls(shape, shape[0], False)
        first = int(np.argmin(shape))  # SB3's is_image_space_channels_first
        if first == 1:
            raise ValueError(
                f"{what}: shape {shape} has its smallest dimension in the middle: neither "
                "channels first (stack, H, W) nor channel last (H, W, stack)"
            )
        return cls(shape, shape[0] if first == 0 else shape[2], first != 0)

    @property
    def stored(self) -> tuple[int, ...]:
        """The per-env shape in the storage: ``(stack, H, W)`` or ``(stack, H, W, C)``."""
        if self.channels_last:
            return (self.shape[2], self.shape[0], self.shape[1])
        return self.shape

    def sb3_view(self, staged: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """``[n, *stored]`` seen as ``[n, *shape]`` (a view: writes land in ``staged``)."""
        return staged.transpose(0, 2, 3, 1) if self.channels_last else staged

    def to_sb3(self, stacks: torch.Tensor) -> torch.Tensor:
        """Sampled ``[B, *stored]`` stacks in SB3's shape ``[B, *shape]`` (contiguous)."""
        return stacks.permute(0, 2, 3, 1).contiguous() if self.channels_last else stacks


def pixels_key(specs: dict[str, ObsSpec], frames_key: str | None) -> str:
    """The key of a ``Dict`` space whose stacks go to the frame storage.

    ``frames_key``, or else the only key of a 3-D or 4-D ``Box``.

    Raises:
        ValueError: ``frames_key`` is not a key of the space, or it is ``None`` and the space
            has no image key or several.

    Examples:
        >>> import numpy as np
        >>> u8 = np.dtype(np.uint8)
        >>> specs = {"pos": ObsSpec((2,), u8, False), "img": ObsSpec((4, 8, 8), u8, False)}
        >>> pixels_key(specs, None)
        'img'
    """
    if frames_key is not None:
        if frames_key not in specs:
            raise ValueError(
                f"frames_key: expected a key of the observation space {list(specs)}, "
                f"got {frames_key!r}"
            )
        return frames_key
    images = [k for k, s in specs.items() if not s.discrete and len(s.shape) in (3, 4)]
    if len(images) != 1:
        found = f"image keys {images}" if images else "no image key (a 3-D or 4-D Box)"
        raise ValueError(
            f"frames_key: the observation space {list(specs)} has {found}; name the key of "
            "the frame stacks with frames_key="
        )
    return images[0]


class FrameStepWriter(StepWriter):
    """:class:`StepWriter` over a :class:`~rbdata.storages.FrameStackStorage`.

    ``pixels``: the observation stored as frames (``None``: the one observation array, else
    a key of the ``Dict`` space); ``codec``: the new storage's codec. ``next_in_slot`` must
    be ``False`` (the frame storage keeps the next observation itself).
    """

    def __init__(
        self,
        n_slots: int,
        n_envs: int,
        obs: ObsSpec | dict[str, ObsSpec],
        action_dim: int,
        action_dtype: np.dtype[Any],
        *,
        next_in_slot: bool = False,
        timeouts: bool,
        pixels: str | None,
        codec: str | tuple[str, int] | None,
    ) -> None:
        if next_in_slot:
            raise ValueError("next_in_slot: a frame storage keeps the next observation itself")
        spec = obs if isinstance(obs, ObsSpec) else obs[pixels]  # type: ignore[index]
        what = "observation_space" if pixels is None else f"observation_space[{pixels!r}]"
        self.pixels = pixels
        self.stacks = PixelStack.of(spec, what)
        self.codec = codec
        self.frames: Key = obs_key(OBS, pixels)
        super().__init__(
            n_slots, n_envs, obs, action_dim, action_dtype, next_in_slot=False, timeouts=timeouts
        )

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["flags"] = {**state["flags"], "pixels": self.pixels, "codec": self.codec}
        return state

    def stored_shape(self, name: str | None) -> tuple[int, ...]:
        """The stacks' stored shape (see :class:`PixelStack`); other observations as SB3's."""
        return self.stacks.stored if name == self.pixels else self.specs[name].shape

    def sb3_view(self, name: str | None, staged: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The staged stacks seen in SB3's shape; other observations as they are."""
        return self.stacks.sb3_view(staged) if name == self.pixels else staged

    # --- storage ------------------------------------------------------------------------------
    def open_storage(self, storage: Any, path: str | os.PathLike[str] | None) -> Storage:
        """A new ``FrameStackStorage`` (``"frames"``), or a given one checked against the schema."""
        stack = self.stacks.stack
        if isinstance(storage, str) and storage == "frames":
            return FrameStackStorage(
                self.capacity, stack, key=self.frames, path=path, codec=self.codec
            )
        if not isinstance(storage, FrameStackStorage):
            raise TypeError(
                f"storage: expected 'frames' or a FrameStackStorage, got {storage!r:.80}"
            )
        if path is not None or self.codec is not None:
            raise ValueError(
                "path, codec: give them to FrameStackStorage itself, not with a storage"
            )
        if (storage.key, storage.stack) != (self.frames, stack):
            raise ValueError(
                f"storage: expected stacks of {stack} frames under key {self.frames}, got "
                f"{storage.stack} under {storage.key}"
            )
        return self.checked(storage)

    # --- reads --------------------------------------------------------------------------------
    def gather(self, storage: Storage, flat: torch.Tensor) -> tuple[Any, ...]:
        """As :meth:`StepWriter.gather`: the storage's batch, stacks in SB3's shape."""
        if flat.device != storage.device:
            flat = flat.to(storage.device)
        batch = storage.gather(flat, None)
        obs, next_obs = self._observations(batch, OBS), self._observations(batch, NEXT_OBS)
        dones = batch.get(DONE)
        dones.mul_(batch.get(TRUNCATED).neg().add_(1))
        rewards = batch.get(REWARD)
        return obs, batch.get(ACTION), next_obs, dones.view(-1, 1), rewards.view(-1, 1)

    def _observations(self, batch: Any, prefix: Key) -> Any:
        if not self.dict_obs:
            return self.stacks.to_sb3(batch.get(prefix))
        return {
            n: self.stacks.to_sb3(batch.get(obs_key(prefix, n)))
            if n == self.pixels
            else batch.get(obs_key(prefix, n))
            for n in self.specs
        }

    # --- SB3's arrays ---------------------------------------------------------------------
    def array(self, storage: Storage, attr: str) -> Any:
        """SB3's array ``attr``: ``actions``, ``rewards``, ``dones`` and ``timeouts`` only.

        Raises:
            AttributeError: ``observations`` and ``next_observations`` (the frames are
                stored once: no array of stacks exists), or an unknown name.
        """
        prefix = ARRAYS.get(attr)
        if prefix is None or prefix in (OBS, NEXT_OBS):
            why = (
                " (storage='frames' keeps each frame once, never an array of stacks: "
                "sample() or rb.storage read the transitions)"
                if prefix
                else ""
            )
            raise AttributeError(f"the buffer has no array {attr!r}{why}")
        steps = storage.steps  # type: ignore[attr-defined]
        keys = [leaf.key for leaf in steps.layout.leaves]
        return self.slots_view(steps.buffers[keys.index(prefix)])


def wants_frames(storage: Any) -> bool:
    """Whether ``storage`` asks for the frame storage (``"frames"`` or a ``FrameStackStorage``)."""
    return (isinstance(storage, str) and storage == "frames") or isinstance(
        storage, FrameStackStorage
    )


def step_writer(
    storage: Any,
    args: tuple[int, int, ObsSpec | dict[str, ObsSpec], int],
    action_dtype: np.dtype[Any],
    *,
    next_in_slot: bool,
    timeouts: bool,
    codec: str | tuple[str, int] | None,
    frames_key: str | None,
) -> StepWriter:
    """The buffer's writer: a :class:`FrameStepWriter` if ``storage`` asks for frames.

    ``args``, ``action_dtype``: :class:`StepWriter`'s positional arguments. ``frames_key``:
    the ``Dict`` space's key of the stacks (``None``: its only image key).

    Raises:
        ValueError: ``codec`` or ``frames_key`` without frames, or no such key.
    """
    if not wants_frames(storage):
        for name, value in (("codec", codec), ("frames_key", frames_key)):
            if value is not None:
                raise ValueError(f"{name}: only storage='frames' takes one, got {value!r}")
        return StepWriter(*args, action_dtype, next_in_slot=next_in_slot, timeouts=timeouts)
    obs = args[2]
    pixels = None if isinstance(obs, ObsSpec) else pixels_key(obs, frames_key)
    return FrameStepWriter(*args, action_dtype, timeouts=timeouts, pixels=pixels, codec=codec)
