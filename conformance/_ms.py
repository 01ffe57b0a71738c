"""MindSpore side helpers (imported only by scenarios' ms.py, run in the MindSpore venv)."""

from __future__ import annotations

import os

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402
from mindspore import dataset as ds  # noqa: E402

from conformance import _common as C  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
ms.set_seed(0)
VERSION = ms.__version__


class BNNet(nn.Cell):
    def __init__(self, w=None):
        super().__init__()
        w = w or C.weights()
        self.fc1 = nn.Dense(
            C.IN, C.HID, weight_init=Tensor(w["fc1.weight"]), bias_init=Tensor(w["fc1.bias"])
        )
        self.bn = nn.BatchNorm1d(C.HID, momentum=0.9, eps=1e-5)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(
            C.HID, C.OUT, weight_init=Tensor(w["fc2.weight"]), bias_init=Tensor(w["fc2.bias"])
        )

    def construct(self, x):
        return self.fc2(self.relu(self.bn(self.fc1(x))))


class PlainNet(BNNet):
    """BNNet without the BatchNorm (no control flow in construct: ms.rewrite needs that)."""

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def net(bn=True):
    return BNNet() if bn else PlainNet()


def loss_fn():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def opt(n, lr=C.LR, momentum=C.MOMENTUM):
    return nn.Momentum(n.trainable_params(), learning_rate=lr, momentum=momentum)


def dataset(x, y, batch=C.BATCH):
    d = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False)
    return d.batch(batch)


def train_ds():
    return dataset(*C.data())


def valid_ds():
    return dataset(*C.valid_data())


def np_(t):
    if isinstance(t, (tuple, list)):
        return [np_(v) for v in t]
    if isinstance(t, Tensor):
        return t.asnumpy()
    return t


def loss_of(outputs):
    if isinstance(outputs, (tuple, list)):
        outputs = outputs[0]
    return float(np.mean(outputs.asnumpy()))


def params(n):
    return {p.name: p.asnumpy() for p in n.get_parameters()}
