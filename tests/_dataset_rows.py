"""An offline dataset's rows against a per-row reference (the dataset tests' shared check)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["assert_rows"]


def assert_rows(ds: Any, expected: list[dict[Any, np.ndarray]]) -> None:
    """Every key, dtype, shape and value of ``ds`` equal to ``expected``, one dict per row."""
    batch = ds.__getitems__(torch.arange(len(ds)))
    keys = {tuple(k) if isinstance(k, tuple) else (k,) for k in batch.keys(True, True)}
    assert keys == set(expected[0]), keys ^ set(expected[0])
    for key in expected[0]:
        column = np.stack([row[key] for row in expected])
        got = batch[key].numpy()
        assert got.dtype == column.dtype, (key, got.dtype, column.dtype)
        assert got.shape == column.shape, (key, got.shape, column.shape)
        assert np.array_equal(got, column), key
