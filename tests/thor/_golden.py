"""Recorded THOR trajectories: the fast paths must reproduce the parameters of the original code.

Issue #20 made THOR's step cheaper (patches by strided views, one host sync per refresh, a
cached per-step plan, exact-size inversion batches). ``golden_thor.bin`` holds the parameters
that the code *before* those changes produced on the scenarios below (recorded with
``.venv/bin/python -m tests.thor._golden`` at commit 6a9f799); ``test_fast_path.py``
checks that the current code still gives them to 1e-6.

Each scenario trains a small network on fixed random batches for ``STEPS`` steps with a
different part of THOR switched on: the issue #20 recipe (``pi_damping``, ``bias_in_a``) on an
MLP and on a small CNN (stride, dilation, a conv without bias), MindSpore's defaults (no bias
column, √λ on both factors) on the CNN, a network with Conv2d (reflect padding, dilation),
Embedding, LayerNorm, Nesterov momentum, clipping, a loss scale, a small ``split_dim`` and a
decay filter, and ``gaps``, which leaves a bias, or a whole layer, without a gradient on some
steps (the cached step plan). ``gaps`` was recorded later than the others from the same
reference code (a copy of the package at that commit standing in for ``THOR``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lit_amp.thor.optimizer import THOR

__all__ = ["GOLDEN", "SCENARIOS", "STEPS", "run_scenario"]

GOLDEN = Path(__file__).with_name("golden_thor.bin")
STEPS = 23


class _ResMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(40, 64), nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.l1(x))
        return self.l3(h + torch.relu(self.l2(h)))


class _CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(1, 8, 5, stride=2, padding=1)
        self.c2 = nn.Conv1d(8, 8, 3, stride=2, padding=1, dilation=1)
        self.c3 = nn.Conv1d(8, 8, 3, stride=1, padding=2, dilation=2, bias=False)
        self.head = nn.Linear(8 * 10, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.c1(x.unsqueeze(1)))
        h = torch.relu(self.c2(h))
        h = torch.relu(self.c3(h))
        return self.head(h.flatten(1))


class _Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 12)
        self.conv = nn.Conv2d(1, 6, (3, 3), padding=1, padding_mode="reflect", dilation=(1, 1))
        self.conv2 = nn.Conv2d(6, 6, (2, 3), stride=(1, 2), dilation=(2, 1))
        self.norm = nn.LayerNorm(12)
        self.fc = nn.Linear(6 * 4 * 2 + 12, 40)
        self.out = nn.Linear(40, 30, bias=False)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x.unsqueeze(1)))
        h = torch.relu(self.conv2(h)).flatten(1)
        e = self.norm(self.emb(ids).mean(1))
        return self.out(torch.relu(self.fc(torch.cat([h, e], 1))))


def _linear_data(step: int) -> tuple[Any, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return (torch.randn(32, 40, generator=g),), torch.randint(0, 10, (32,), generator=g)


def _mixed_data(step: int) -> tuple[Any, torch.Tensor]:
    g = torch.Generator().manual_seed(2000 + step)
    x = torch.randn(16, 6, 6, generator=g)
    ids = torch.randint(0, 30, (16, 5), generator=g)
    return (x, ids), torch.randint(0, 30, (16,), generator=g)


def _mlp_recipe() -> tuple[nn.Module, THOR, Callable]:
    torch.manual_seed(0)
    net = _ResMLP()
    opt = THOR(net, 0.02, 0.03, 0.9, weight_decay=0.02, frequency=5,
               trace_thresholds=(0.05, 0.0), pi_damping=True, bias_in_a=True)
    return net, opt, _linear_data


def _cnn_recipe() -> tuple[nn.Module, THOR, Callable]:
    torch.manual_seed(1)
    net = _CNN()
    opt = THOR(net, 0.05, 0.03, 0.9, weight_decay=0.02, frequency=4,
               trace_thresholds=(0.05, 0.0), pi_damping=True, bias_in_a=True)
    return net, opt, _linear_data


def _cnn_mindspore() -> tuple[nn.Module, THOR, Callable]:
    torch.manual_seed(2)
    net = _CNN()
    opt = THOR(net, 0.05, 0.03, 0.9, frequency=3, factor_decay=0.0,
               trace_thresholds=(0.0, 0.0))
    return net, opt, _linear_data


def _mixed() -> tuple[nn.Module, THOR, Callable]:
    torch.manual_seed(3)
    net = _Mixed()
    sched = [0.05 * (1 - k / 40) for k in range(40)]
    opt = THOR(net, sched, 0.02, 0.9, weight_decay=0.01, loss_scale=4.0, use_nesterov=True,
               decay_filter=lambda p: "bias" not in p.name, enable_clip_grad=True, frequency=3,
               split_dim=16, pi_damping=True, bias_in_a=True)
    return net, opt, _mixed_data


def _gaps() -> tuple[nn.Module, THOR, Callable]:
    torch.manual_seed(4)
    net = _ResMLP()
    opt = THOR(net, 0.02, 0.03, 0.9, weight_decay=0.02, frequency=3,
               trace_thresholds=(0.05, 0.0), pi_damping=True, bias_in_a=True)
    return net, opt, _linear_data


def _drop_grads(net: nn.Module, step: int) -> None:
    """``gaps``: some steps leave a bias, or a whole layer, without a gradient."""
    if step % 2 == 1:
        net.l1.bias.grad = None
    if step % 4 == 3:
        net.l3.weight.grad = None
        net.l3.bias.grad = None


SCENARIOS: dict[str, Callable[[], tuple[nn.Module, THOR, Callable]]] = {
    "mlp_recipe": _mlp_recipe,
    "cnn_recipe": _cnn_recipe,
    "cnn_mindspore": _cnn_mindspore,
    "mixed": _mixed,
    "gaps": _gaps,
}


def run_scenario(name: str, steps: int = STEPS) -> tuple[dict[str, torch.Tensor], int]:
    """Train scenario ``name``; returns its parameters and the optimizer's inversion count."""
    net, opt, data = SCENARIOS[name]()
    scale = opt.loss_scale
    for k in range(steps):
        inputs, y = data(k)
        opt.zero_grad(set_to_none=True)
        (F.cross_entropy(net(*inputs), y) * scale).backward()
        if name == "gaps":
            _drop_grads(net, k)
        opt.step()
    return {n: p.detach().clone() for n, p in net.named_parameters()}, opt.inversions


if __name__ == "__main__":  # record the golden file (only from the reference code!)
    import sys

    torch.set_num_threads(1)
    names = sys.argv[1:] or list(SCENARIOS)
    out = torch.load(GOLDEN, weights_only=True) if GOLDEN.exists() else {}
    out.update({name: run_scenario(name) for name in names})
    torch.save(out, GOLDEN)
    print({k: v[1] for k, v in out.items()}, "->", GOLDEN)
