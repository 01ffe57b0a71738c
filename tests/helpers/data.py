"""Small real problems for tests: a seeded, linearly separable 2-class task and an MLP."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

__all__ = ["make_batches", "make_loaders", "make_net"]


def make_batches(n_batches: int = 6, batch: int = 16, dim: int = 4, seed: int = 0):
    """A linearly separable 2-class problem as a list of (x, y) batches."""
    w = torch.randn(dim, generator=torch.Generator().manual_seed(1234))  # one labelling rule
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, dim, generator=g)
        y = (x @ w > 0).long()
        out.append((x, y))
    return out


def make_net(dim: int = 4, hidden: int = 16, classes: int = 2) -> nn.Module:
    """A 2-layer MLP for :func:`make_batches`."""
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def make_loaders(train: int = 8, val: int = 4, batch: int = 16) -> tuple[DataLoader, DataLoader]:
    """:func:`make_batches` as a training and a validation DataLoader (seeds 0 and 1)."""

    def loader(seed: int, n: int) -> DataLoader:
        xs, ys = zip(*make_batches(n, batch=batch, seed=seed))
        return DataLoader(TensorDataset(torch.cat(xs), torch.cat(ys)), batch_size=batch)

    return loader(0, train), loader(1, val)
