"""Shared fixtures: small real models and data (seeded), quiet Lightning."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from torch import nn


@pytest.fixture(autouse=True)
def _seed_and_quiet():
    torch.manual_seed(0)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*LeafSpec.*")
        yield


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
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))


@pytest.fixture
def batches():
    return make_batches()


@pytest.fixture
def net():
    return make_net()
