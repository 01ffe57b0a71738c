"""Small reference networks for MNIST-1D (examples, tests, benchmarks)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MLP", "CNN1D"]


class MLP(nn.Module):
    """A ReLU MLP, e.g. ``MLP(40, 100, 100, 10)`` (the overhead benchmark's 40-100-100-10).

    Example:
        >>> MLP(40, 100, 10)(torch.randn(2, 40)).shape
        torch.Size([2, 10])
    """

    def __init__(self, *sizes: int) -> None:
        super().__init__()
        if len(sizes) < 2:
            raise ValueError(f"MLP: 'sizes' needs at least 2 ints, but got {sizes}.")
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class CNN1D(nn.Module):
    """MNIST-1D's CNN (the paper's ConvBase: three strided Conv1d + ReLU, a Linear head).

    Args:
        channels: conv channels (25 in the paper).
        num_classes: output classes.
        batch_norm: add a BatchNorm1d after each conv (used by the AMP tests and demos).

    Example:
        >>> CNN1D()(torch.randn(2, 40)).shape
        torch.Size([2, 10])
    """

    def __init__(self, channels: int = 25, num_classes: int = 10, batch_norm: bool = False):
        super().__init__()

        def block(cin: int, k: int) -> list[nn.Module]:
            mods: list[nn.Module] = [nn.Conv1d(cin, channels, k, stride=2, padding=1)]
            if batch_norm:
                mods.append(nn.BatchNorm1d(channels))
            mods.append(nn.ReLU())
            return mods

        self.features = nn.Sequential(*block(1, 5), *block(channels, 3), *block(channels, 3))
        self.head = nn.Linear(channels * 5, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(1)
        return self.head(self.features(x).flatten(1))
