"""lit_amp side helpers (imported only by scenarios' lit.py). Public import paths only."""

from __future__ import annotations

import torch
from torch import nn

from conformance import _common as C

torch.manual_seed(0)


class BNNet(nn.Module):
    def __init__(self, w=None, bn=True):
        super().__init__()
        w = w or C.weights()
        self.fc1 = nn.Linear(C.IN, C.HID)
        self.use_bn = bn
        if bn:
            self.bn = nn.BatchNorm1d(C.HID, momentum=0.1, eps=1e-5)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(C.HID, C.OUT)
        with torch.no_grad():
            self.fc1.weight.copy_(torch.from_numpy(w["fc1.weight"]))
            self.fc1.bias.copy_(torch.from_numpy(w["fc1.bias"]))
            self.fc2.weight.copy_(torch.from_numpy(w["fc2.weight"]))
            self.fc2.bias.copy_(torch.from_numpy(w["fc2.bias"]))

    def forward(self, x):
        x = self.fc1(x)
        if self.use_bn:
            x = self.bn(x)
        return self.fc2(self.relu(x))


def net(bn=True):
    return BNNet(bn=bn)


def loss_fn():
    return nn.CrossEntropyLoss()


def opt(n, lr=C.LR, momentum=C.MOMENTUM):
    return torch.optim.SGD(n.parameters(), lr=lr, momentum=momentum)


def dataset(x, y, batch=C.BATCH):
    return [
        (torch.from_numpy(bx), torch.from_numpy(by).long()) for bx, by in C.batches(x, y, batch)
    ]


def train_ds():
    return dataset(*C.data())


def valid_ds():
    return dataset(*C.valid_data())


def np_(t):
    if isinstance(t, (tuple, list)):
        return [np_(v) for v in t]
    if torch.is_tensor(t):
        return t.detach().float().cpu().numpy()
    return t


def loss_of(outputs):
    if isinstance(outputs, (tuple, list)):
        outputs = outputs[0]
    return float(outputs.detach().float().mean())
