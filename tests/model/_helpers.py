"""Shared helpers of the ``tests/model`` tests."""

from __future__ import annotations

import torch
from torch import nn

from lit_amp import LitModel

__all__ = ["graph_lit"]


def graph_lit(net: nn.Module | None = None, opt=None, **kw) -> LitModel:
    """A small LitModel that opts in to the sink CUDA graph (``sink_graph="auto"``).

    ``opt``: an optimizer, a callable taking the parameters, or None (SGD, lr 0.1).
    """
    net = net if net is not None else nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    if opt is None:
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
    elif callable(opt):
        opt = opt(net.parameters())
    lit = LitModel(net, nn.CrossEntropyLoss(), opt, **kw)
    lit.sink_graph = "auto"  # opt in (the default is off)
    return lit
