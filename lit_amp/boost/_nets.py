"""A small residual 1-D CNN with BatchNorm for MNIST-1D (boost tests and benchmark).

``ResNet1D`` is a residual version of MNIST-1D's reference CNN (constant width, strided
stages): a ``Conv1d -> BN -> ReLU`` stem, stages of basic blocks
(``conv1 -> bn1 -> relu -> conv2 -> bn2 (+ shortcut) -> relu``; the first block of every stage
after the first halves the length and has a ``1x1 conv -> BN`` downsample shortcut) and a
Linear head on the flattened features. Parameters are registered in forward order, as
GradientFreeze's grouping assumes.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["BasicBlock1D", "ResNet1D"]


class BasicBlock1D(nn.Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``.

    Example:
        >>> BasicBlock1D(4, 4)(torch.randn(2, 4, 10)).shape
        torch.Size([2, 4, 10])
    """

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm1d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv1d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm1d(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv1d(cin, cout, 1, stride, bias=False), nn.BatchNorm1d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet1D(nn.Module):
    """Residual CNN with BatchNorm for ``[B, L]`` or ``[B, 1, L]`` sequences.

    Args:
        channels: width of every stage.
        blocks: basic blocks per stage; stage ``i > 0`` starts with stride 2.
        num_classes: outputs.
        length: input length (40 for MNIST-1D).

    Example:
        >>> ResNet1D()(torch.randn(3, 40)).shape
        torch.Size([3, 10])
    """

    def __init__(
        self,
        channels: int = 32,
        blocks: tuple[int, ...] = (2, 2, 2),
        num_classes: int = 10,
        length: int = 40,
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 5, 1, 2, bias=False)
        self.bn1 = nn.BatchNorm1d(channels)
        self.relu = nn.ReLU()
        layers: list[nn.Module] = []
        for i, n in enumerate(blocks):
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(BasicBlock1D(channels, channels, stride))
                if stride == 2:
                    length = (length + 1) // 2
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(channels * length, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(1)
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        return self.fc(x.flatten(1))
