"""Checking a device once, where it is given: one message for every part that holds tensors."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["resolve_device"]


def resolve_device(device: Any, hint: str = "use device='cpu'") -> torch.device:
    """``device`` as the torch device its tensors report, or an error that says why not.

    ``hint`` ends the message for CUDA without CUDA (what the caller may pass instead).

    Examples:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    device = torch.device(device)
    if device.type == "cpu":
        return device
    if device.type == "meta":
        raise ValueError("device: a 'meta' device holds no data; use 'cpu' or 'cuda'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"device {str(device)!r}: CUDA is not available (no GPU visible, or a CPU-only "
            f"PyTorch build); {hint}"
        )
    try:  # 'cuda' becomes 'cuda:<current>'
        return torch.empty(0, device=device).device
    except (RuntimeError, AssertionError) as err:  # e.g. 'cuda:3' with one GPU
        raise RuntimeError(f"device {str(device)!r} is not available: {err}") from err
