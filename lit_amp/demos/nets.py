"""Small reference networks for MNIST-1D (examples, configs, tests and benchmarks).

- :class:`MLP` — a ReLU MLP (``model=mlp``; the overhead benchmark's 40-100-100-10).
- :class:`CNN1D` — MNIST-1D's reference CNN (``model=cnn1d``, the default experiment).
- :class:`ResNet1D` — a residual 1-D CNN with BatchNorm (``model=resnet1d``, the boost tests and
  benchmark): it exercises AMP's BatchNorm rules, boost's LessBN and GradientFreeze, and THOR's
  conv factors. Two layouts, one class: constant width with a flattened Linear head (the
  default, the boost benchmark's network) or, with ``widen=True, head="pool"``, channels that
  double per stage and a global-average-pooled head (the ``model=resnet1d`` config).

Example:
    >>> ResNet1D(channels=8, blocks=(1, 1))(torch.randn(2, 40)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lit_amp._validation import check_choice

__all__ = ["MLP", "CNN1D", "BasicBlock1D", "ResNet1D"]


class MLP(nn.Module):
    """A ReLU MLP, e.g. ``MLP(40, 100, 100, 10)`` (the overhead benchmark's 40-100-100-10).

    Args:
        *sizes: the layer widths, input first (at least 2).

    Raises:
        ValueError: fewer than 2 sizes.

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


class BasicBlock1D(nn.Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``.

    The shortcut is the identity, or ``downsample`` (a strided ``1x1 conv -> BN``) when the
    stride or the channels change.

    Args:
        cin: input channels.
        cout: output channels.
        stride: stride of the first convolution (and of the downsample shortcut).

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
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv1d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm1d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet1D(nn.Module):
    """A small residual CNN with BatchNorm for ``[B, L]`` or ``[B, C, L]`` sequences.

    A ``Conv1d -> BN -> ReLU`` stem (``conv1``, ``bn1``), one stage of :class:`BasicBlock1D`
    per entry of ``blocks`` in ``layers`` (every stage after the first starts with stride 2) and
    a Linear head ``fc``. Parameters are registered in forward order, as GradientFreeze's
    grouping assumes.

    Args:
        channels: channels of the stem and the first stage.
        blocks: basic blocks per stage.
        num_classes: outputs.
        length: input length (40 for MNIST-1D); sizes the flattened head.
        in_channels: input channels.
        widen: double the channels at every stage after the first (else constant width).
        head: ``"flatten"`` (a Linear on the flattened features) or ``"pool"`` (global average
            pooling, then a Linear).

    Raises:
        ValueError: ``blocks`` is empty or ``head`` is not one of the two.

    Example:
        >>> ResNet1D()(torch.randn(3, 40)).shape
        torch.Size([3, 10])
        >>> ResNet1D(channels=8, blocks=(2, 2), widen=True, head="pool").fc
        Linear(in_features=16, out_features=10, bias=True)
    """

    def __init__(
        self,
        channels: int = 32,
        blocks: Sequence[int] = (2, 2, 2),
        num_classes: int = 10,
        length: int = 40,
        in_channels: int = 1,
        *,
        widen: bool = False,
        head: str = "flatten",
    ) -> None:
        super().__init__()
        check_choice("ResNet1D", "head", head, ("flatten", "pool"))
        if not blocks:
            raise ValueError(f"ResNet1D: 'blocks' must list at least one stage, got {blocks!r}.")
        self.conv1 = nn.Conv1d(in_channels, channels, 5, padding=2, bias=False)
        self.bn1 = nn.BatchNorm1d(channels)
        self.relu = nn.ReLU()
        layers: list[nn.Module] = []
        cin = channels
        for i, n in enumerate(blocks):
            cout = channels * (2**i) if widen else channels
            for j in range(int(n)):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(BasicBlock1D(cin, cout, stride))
                cin = cout
                if stride == 2:
                    length = (length + 1) // 2
        self.layers = nn.Sequential(*layers)
        self.pool: nn.Module | None = nn.AdaptiveAvgPool1d(1) if head == "pool" else None
        self.fc = nn.Linear(cin if head == "pool" else cin * length, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(1)
        x = self.layers(self.relu(self.bn1(self.conv1(x))))
        if self.pool is not None:
            x = self.pool(x)
        return self.fc(x.flatten(1))
