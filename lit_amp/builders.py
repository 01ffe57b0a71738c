"""Small factories the Hydra configs in ``conf/`` point at (no downloads, seeded).

- :func:`synthetic_loaders` — a learnable, seeded classification problem shaped like MNIST-1D
  (``data=synthetic``): quick to make, used by fast tests and throughput sweeps.
- :class:`ResNet1D` — a small ResNet-style 1-D CNN with BatchNorm and residual blocks
  (``model=resnet1d``): exercises AMP's BatchNorm rules, boost's LessBN and THOR's conv factors.

Example:
    >>> train, valid = synthetic_loaders(num_train=64, num_valid=32, batch_size=16)
    >>> x, y = next(iter(train))
    >>> ResNet1D(channels=8)(x).shape, y.shape
    (torch.Size([16, 10]), torch.Size([16]))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

__all__ = ["synthetic_loaders", "ResNet1D", "BasicBlock1D"]


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
        ValueError: a size or count below 1.
    """
    for name, v in (
        ("num_train", num_train),
        ("num_valid", num_valid),
        ("num_features", num_features),
        ("num_classes", num_classes),
        ("batch_size", batch_size),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"synthetic_loaders: '{name}' must be an int >= 1, but got {v!r}.")
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


class BasicBlock1D(nn.Module):
    """Conv-BN-ReLU-Conv-BN plus an identity (or 1x1 strided) shortcut, then ReLU.

    Args:
        cin: input channels.
        cout: output channels.
        stride: stride of the first convolution (and of the projection shortcut).

    Example:
        >>> BasicBlock1D(4, 8, stride=2)(torch.randn(2, 4, 40)).shape
        torch.Size([2, 8, 20])
    """

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm1d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv1d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm1d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv1d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm1d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet1D(nn.Module):
    """A small ResNet for 1-D sequences (MNIST-1D: ``[B, 40]`` or ``[B, 1, 40]``).

    A stem convolution, one stage of :class:`BasicBlock1D` per entry of ``blocks`` (the channels
    double and the length halves from the second stage on), global average pooling and a Linear
    head.

    Args:
        channels: channels of the first stage.
        blocks: residual blocks per stage.
        num_classes: output classes.
        in_channels: input channels.

    Example:
        >>> ResNet1D(channels=8, blocks=(1, 1))(torch.randn(2, 40)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        channels: int = 32,
        blocks: Sequence[int] = (2, 2),
        num_classes: int = 10,
        in_channels: int = 1,
    ) -> None:
        super().__init__()
        if not blocks:
            raise ValueError(f"ResNet1D: 'blocks' must list at least one stage, got {blocks!r}.")
        self.stem = nn.Sequential(
            nn.Conv1d(in_channels, channels, 5, padding=2, bias=False),
            nn.BatchNorm1d(channels),
            nn.ReLU(),
        )
        layers: list[nn.Module] = []
        cin = channels
        for i, n in enumerate(blocks):
            cout = channels * (2**i)
            for j in range(int(n)):
                layers.append(BasicBlock1D(cin, cout, stride=2 if (i > 0 and j == 0) else 1))
                cin = cout
        self.stages = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(1)
        return self.head(self.pool(self.stages(self.stem(x))).flatten(1))
