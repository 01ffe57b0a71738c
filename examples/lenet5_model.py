"""LeNet5 trained through ``Model``: the MindSpore seeds' LeNet5 example, ported to lit_amp.

The seeds (``mindspore.amp.build_train_network`` and ``mindspore.train.Model``) write::

    network = LeNet5()
    net_loss = nn.SoftmaxCrossEntropyWithLogits(reduction="mean")
    net_opt = nn.Momentum(network.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = Model(network, loss_fn=net_loss, optimizer=net_opt, metrics={"acc"}, amp_level="O3")
    model.train(2, dataset, callbacks=[LossMonitor(), TimeMonitor()])
    model.eval(dataset)

Here, with PyTorch conventions (docs/migration.md): ``LeNet5`` is the classic two-conv, three-
Linear network in its 1-D form for MNIST-1D (generated offline, no download); the loss is
``nn.CrossEntropyLoss`` (sparse labels, mean); MindSpore's ``nn.Momentum`` is
``torch.optim.SGD(momentum=0.9)`` built over ``network.parameters()``. ``amp_level="O3"``
computes everything, BatchNorm included, in the low dtype (bfloat16 on CPU, float16 on CUDA),
with the loss in float32. The second half builds the same train step with
``build_train_network`` and drives it by hand, as the first seed does.

Run: ``.venv/bin/python examples/lenet5_model.py [--epochs 10] [--amp-level O3]``
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from lit_amp import Model, build_train_network
from lit_amp.callbacks import LossMonitor, TimeMonitor
from lit_amp.demos import mnist1d_loaders


class LeNet5(nn.Module):
    """LeNet5 for 1-D signals: conv(6, k5)-pool-conv(16, k5)-pool-120-84-classes.

    Args:
        num_class: output classes (MindSpore's name).
        num_channel: input channels.
        length: input length (40 for MNIST-1D).

    Example:
        >>> LeNet5()(torch.randn(2, 40)).shape
        torch.Size([2, 10])
    """

    def __init__(self, num_class: int = 10, num_channel: int = 1, length: int = 40) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(num_channel, 6, 5, padding=2)
        self.conv2 = nn.Conv1d(6, 16, 5)
        self.relu = nn.ReLU()
        self.max_pool = nn.MaxPool1d(2, 2)
        flat = 16 * (((length // 2) - 4) // 2)
        self.fc1 = nn.Linear(flat, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_class)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(1)
        x = self.max_pool(self.relu(self.conv1(x)))
        x = self.max_pool(self.relu(self.conv2(x)))
        x = self.relu(self.fc1(x.flatten(1)))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


def main(argv: list[str] | None = None) -> float:
    """Train LeNet5 with ``Model`` and evaluate it; returns the test accuracy."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--amp-level", default="O3", choices=["O0", "O1", "O2", "O3", "auto"])
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    train, test = mnist1d_loaders(32)

    # 1. the Model facade (seed: mindspore.train.Model)
    network = LeNet5()
    net_loss = nn.CrossEntropyLoss()
    net_opt = torch.optim.SGD(network.parameters(), lr=args.lr, momentum=0.9)
    model = Model(network, loss_fn=net_loss, optimizer=net_opt, metrics={"acc", "loss"},
                  amp_level=args.amp_level)
    model.train(args.epochs, train, callbacks=[LossMonitor(len(train)), TimeMonitor()])
    result = model.eval(test)
    print(f"Model.eval: {result}")

    # 2. the same train step from build_train_network (seed: mindspore.amp), driven by hand
    net2 = LeNet5()
    opt2 = torch.optim.SGD(net2.parameters(), lr=args.lr, momentum=0.9)
    step = build_train_network(net2, opt2, nn.CrossEntropyLoss(), level=args.amp_level)
    for x, y in list(train)[:20]:
        out = step(x, y)
    loss = out[0] if isinstance(out, (tuple, list)) else out
    print(f"build_train_network: loss after 20 steps {float(loss):.4f}")
    return float(result["acc"])


if __name__ == "__main__":
    main()
