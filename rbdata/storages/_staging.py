"""Leaves on their way to a ``TensorStorage``'s device: pinned staging, device identity.

A CUDA storage's ``prepare`` queues each CPU leaf for the GPU through fresh pinned memory
(:func:`to_device`), so the host never waits for the device; ``gather`` asks
:func:`same_device` whether a sampler's extras already sit on the storage's GPU.
"""

from __future__ import annotations

import torch

__all__ = ["same_device", "to_device"]


def to_device(t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A leaf on ``device`` as ``dtype``, queued without the host waiting for the device.

    A CPU leaf is copied (and cast) into fresh pinned memory first, even a pinned one: the
    caller may change its tensor as soon as the write returns, before the GPU has read it;
    torch's pinned allocator reuses the block only once that copy is done.
    """
    if same_device(t.device, device):
        return t if t.dtype == dtype else t.to(dtype)
    if t.is_cpu:
        staged = torch.empty(t.shape, dtype=dtype, pin_memory=True)
        staged.copy_(t)
        return staged.to(device, non_blocking=True)
    return t.to(device, dtype, non_blocking=True)


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether ``a`` and ``b`` name one device (``"cuda"`` is the current GPU)."""
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        current = torch.cuda.current_device() if a.type == "cuda" else 0
        return (a.index if a.index is not None else current) == (
            b.index if b.index is not None else current
        )
    return a.index == b.index
