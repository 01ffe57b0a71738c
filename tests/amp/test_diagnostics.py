"""OverflowDiagnostics: name the first layer whose 16-bit output or gradient was non-finite."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp.amp.convert import auto_mixed_precision
from lit_amp.amp.diagnostics import OverflowDiagnostics
from lit_amp.amp.loss_scale.controller import LossScaleController
from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager

F16, BF16 = torch.float16, torch.bfloat16


def net3() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 1))


def test_forward_overflow_names_the_first_layer():
    net = auto_mixed_precision(net3(), "O2", BF16)
    diag = OverflowDiagnostics(net).attach()
    with torch.no_grad():
        net[2].weight.fill_(1e30)  # finite in fp32, inf in ... bf16 keeps it; times 1e30 again
        net[3].weight.fill_(1e30)
    net(torch.ones(2, 4))
    rec = diag.report()
    assert rec is not None and rec.phase == "forward" and rec.module == "3"
    assert rec.module_type == "Linear" and rec.dtype == BF16
    assert diag.first_nonfinite() == "'3' (Linear): non-finite forward output (torch.bfloat16)"


def test_backward_overflow_and_reset():
    net = auto_mixed_precision(net3(), "O3", F16)
    diag = OverflowDiagnostics(net).attach()
    with pytest.warns(UserWarning):  # fp16 on CPU
        out = net(torch.ones(2, 4))
    assert diag.first_nonfinite() is None
    (out * 1e8).sum().backward()  # the scaled loss overflows fp16 in the backward pass
    rec = diag.report()
    assert rec is not None and rec.phase == "backward" and rec.module == "3"  # nearest the loss
    net(torch.ones(2, 4))  # a new forward starts new records
    assert diag.first_nonfinite() is None


def test_low_precision_only_and_detach():
    net = net3()  # fp32
    diag = OverflowDiagnostics(net).attach()
    net(torch.full((1, 4), float("nan")))
    assert diag.first_nonfinite() is None  # fp32 not watched by default
    diag.detach()
    assert not diag.attached and not any(m._forward_hooks for m in net.modules())
    with OverflowDiagnostics(net, low_precision_only=False) as d:
        net(torch.full((1, 4), float("nan")))
        assert d.report().module == "0"


def test_controller_guard_names_the_layer():
    net = auto_mixed_precision(net3(), "O2", BF16)
    diag = OverflowDiagnostics(net).attach()
    ctl = LossScaleController(DynamicLossScaleManager(2.0**4), max_consecutive_overflows=2,
                              diagnostics=diag)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with torch.no_grad():
        net[0].bias.fill_(float("inf"))
    with pytest.raises(RuntimeError, match="first layer .* is ''0' \\(Linear\\)"):
        for _ in range(3):
            opt.zero_grad()
            ctl.step(opt, net(torch.ones(2, 4)).float().sum())


def test_type_check():
    with pytest.raises(TypeError, match="'network' must be a torch.nn.Module"):
        OverflowDiagnostics("net")
