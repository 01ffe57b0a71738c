"""Offline datasets for examples, tests and benchmarks (no downloads).

MNIST-1D (Greydanus 2020) is generated locally by the ``mnist1d`` package (the ``[examples]``
extra): 4000 training and 1000 test sequences of length 40, 10 classes.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

__all__ = ["mnist1d_arrays", "mnist1d_loaders"]


@functools.lru_cache(maxsize=4)
def mnist1d_arrays(seed: int = 42) -> dict[str, np.ndarray]:
    """Generate MNIST-1D offline; returns ``{"x", "y", "x_test", "y_test"}`` numpy arrays.

    Raises:
        ImportError: the ``mnist1d`` package is missing (install ``lit_amp[examples]``).
    """
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "MNIST-1D needs the 'mnist1d' package: pip install 'lit_amp[examples]'."
        ) from exc
    args = get_dataset_args()
    args.seed = seed
    d = make_dataset(args)
    return {k: np.asarray(d[k]) for k in ("x", "y", "x_test", "y_test")}


def mnist1d_loaders(
    batch_size: int = 100, *, seed: int = 42, shuffle: bool = True
) -> tuple[DataLoader, DataLoader]:
    """MNIST-1D train and test DataLoaders of ``(x float32 [B, 40], y int64 [B])``.

    Example:
        >>> train, test = mnist1d_loaders(100)  # doctest: +SKIP
        >>> len(train), len(test)               # doctest: +SKIP
        (40, 10)
    """
    d = mnist1d_arrays(seed)
    train = TensorDataset(
        torch.as_tensor(d["x"], dtype=torch.float32), torch.as_tensor(d["y"], dtype=torch.long)
    )
    test = TensorDataset(
        torch.as_tensor(d["x_test"], dtype=torch.float32),
        torch.as_tensor(d["y_test"], dtype=torch.long),
    )
    gen = torch.Generator().manual_seed(seed)
    return (
        DataLoader(train, batch_size=batch_size, shuffle=shuffle, generator=gen),
        DataLoader(test, batch_size=batch_size, shuffle=False),
    )
