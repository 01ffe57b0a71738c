"""Offline data for examples, configs, tests and benchmarks (no downloads, seeded).

- :func:`synthetic_loaders` — a learnable, seeded classification problem shaped like MNIST-1D
  (``data=synthetic``): quick to make, used by fast tests and throughput sweeps.
- :func:`mnist1d_loaders` / :func:`mnist1d_arrays` — MNIST-1D (Greydanus 2020) generated
  locally by the ``mnist1d`` package (a dependency of lit_amp): 4000 training and 1000 test
  sequences of length 40, 10 classes (``data=mnist1d``, the default experiment).

Example:
    >>> train, valid = synthetic_loaders(num_train=64, num_valid=32, batch_size=16)
    >>> x, y = next(iter(train))
    >>> x.shape, y.shape
    (torch.Size([16, 40]), torch.Size([16]))
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from lit_amp._validation import check_int

__all__ = ["synthetic_loaders", "mnist1d_arrays", "mnist1d_loaders"]


def synthetic_loaders(
    num_train: int = 2000,
    num_valid: int = 500,
    num_features: int = 40,
    num_classes: int = 10,
    batch_size: int = 100,
    *,
    noise: float = 6.0,
    seed: int = 0,
) -> tuple[DataLoader, DataLoader]:
    """Seeded Gaussian clusters: train and validation DataLoaders of ``(x [B, F], y [B])``.

    Each class has a random centre; a sample is its centre plus ``noise``-scaled Gaussian noise,
    so a small network reaches high accuracy in a few epochs.

    Args:
        num_train: training samples.
        num_valid: validation samples.
        num_features: features per sample (40 = MNIST-1D's length).
        num_classes: classes.
        batch_size: batch size of both loaders.
        noise: standard deviation of the noise around each class centre.
        seed: the generator seed (data and shuffling).

    Returns:
        ``(train, valid)`` DataLoaders; ``train`` shuffles with a seeded generator.

    Raises:
        TypeError: a size or count that is not an int.
        ValueError: a size or count below 1.

    Example:
        >>> len(synthetic_loaders(num_train=50, batch_size=10)[0])
        5
    """
    for name, v in (
        ("num_train", num_train),
        ("num_valid", num_valid),
        ("num_features", num_features),
        ("num_classes", num_classes),
        ("batch_size", batch_size),
    ):
        check_int("synthetic_loaders", name, v, minimum=1)
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_classes, num_features, generator=g) * 2.0

    def make(n: int) -> TensorDataset:
        y = torch.randint(0, num_classes, (n,), generator=g)
        x = centres[y] + noise * torch.randn(n, num_features, generator=g)
        return TensorDataset(x, y)

    train, valid = make(num_train), make(num_valid)
    shuffle_gen = torch.Generator().manual_seed(seed + 1)
    return (
        DataLoader(train, batch_size=batch_size, shuffle=True, generator=shuffle_gen),
        DataLoader(valid, batch_size=batch_size, shuffle=False),
    )


@functools.lru_cache(maxsize=4)
def mnist1d_arrays(seed: int = 42) -> dict[str, np.ndarray]:
    """Generate MNIST-1D offline.

    Args:
        seed: the generator seed of the ``mnist1d`` package.

    Returns:
        ``{"x", "y", "x_test", "y_test"}`` numpy arrays (cached per seed).

    Raises:
        ImportError: the ``mnist1d`` package is missing (a dependency: reinstall lit_amp).

    Example:
        >>> mnist1d_arrays()["x"].shape  # doctest: +SKIP
        (4000, 40)
    """
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "MNIST-1D needs the 'mnist1d' package, a dependency of lit_amp: pip install lit_amp "
            "(or pip install mnist1d)."
        ) from exc
    args = get_dataset_args()
    args.seed = seed
    d = make_dataset(args)
    return {k: np.asarray(d[k]) for k in ("x", "y", "x_test", "y_test")}


def mnist1d_loaders(
    batch_size: int = 100, *, seed: int = 42, shuffle: bool = True
) -> tuple[DataLoader, DataLoader]:
    """MNIST-1D train and test DataLoaders of ``(x float32 [B, 40], y int64 [B])``.

    Args:
        batch_size: batch size of both loaders.
        seed: the data seed (also seeds the training loader's shuffling).
        shuffle: shuffle the training loader.

    Returns:
        ``(train, test)`` DataLoaders.

    Raises:
        ImportError: the ``mnist1d`` package is missing.

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
