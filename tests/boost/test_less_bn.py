"""LessBN: normalized head math, gradient centralization, which BatchNorms go, optimizer sync."""

from __future__ import annotations

import torch
from torch import nn

from lit_amp.boost.less_bn import (
    CommonHeadLastFN,
    LessBN,
    centralize_gradients_,
    gc_parameters,
    remove_residual_bn,
    replace_head_with_fn,
)
from lit_amp.demos import ResNet1D


def test_fn_head_hand_computation():
    w = nn.Parameter(torch.tensor([[3.0, 4.0], [0.0, 2.0]]))
    head = CommonHeadLastFN(2, 2, w)
    assert head.weight is w and head.bias is None
    x = torch.tensor([[1.0, 0.0], [6.0, 8.0]])
    # normalized rows: W -> [[.6, .8], [0, 1]]; x -> [[1, 0], [.6, .8]]
    expected = torch.tensor([[0.6, 0.0], [0.36 + 0.64, 0.8]])
    torch.testing.assert_close(head(x), expected)
    with torch.no_grad():
        head.multiplier.fill_(2.5)
    torch.testing.assert_close(head(x), 2.5 * expected)
    # the multiplier is learnable and gets a gradient
    head(x).sum().backward()
    assert head.multiplier.grad is not None and w.grad is not None


def test_replace_head_only_the_last_linear():
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 3)))
    first, inner = net[0], net[2][0]
    head, dropped = replace_head_with_fn(net)
    assert isinstance(net[2][1], CommonHeadLastFN)
    assert net[0] is first and net[2][0] is inner  # MindSpore would also touch other cells
    assert len(dropped) == 1 and dropped[0].shape == (3,)  # the old bias
    assert net(torch.randn(5, 4)).shape == (5, 3)


def test_gc_hand_computation():
    w = nn.Parameter(torch.zeros(2, 1, 2))
    w.grad = torch.tensor([[[1.0, 3.0]], [[-2.0, 6.0]]])
    b = nn.Parameter(torch.zeros(2))
    b.grad = torch.tensor([1.0, 2.0])
    centralize_gradients_([w, b])
    torch.testing.assert_close(w.grad, torch.tensor([[[-1.0, 1.0]], [[-4.0, 4.0]]]))
    torch.testing.assert_close(b.grad, torch.tensor([1.0, 2.0]))  # 1-D: untouched
    # every output channel's gradient now sums to zero
    assert torch.allclose(w.grad.sum(dim=(1, 2)), torch.zeros(2))


def test_gc_parameter_selection():
    net = nn.Sequential(
        nn.Conv1d(2, 4, 3), nn.BatchNorm1d(4), nn.Conv1d(4, 4, 3, groups=2), nn.Linear(4, 4)
    )
    net.add_module("head", CommonHeadLastFN(4, 2))
    got = gc_parameters(net)
    assert [tuple(p.shape) for p in got] == [(4, 2, 3), (4, 4)]  # grouped conv, BN, head out


def test_bn_removal_basic_blocks():
    net = ResNet1D(channels=8, blocks=(2, 1))
    removed = remove_residual_bn(net)
    # inner bn1 of every block goes; bn2 (before the add), downsample BN and stem BN stay
    assert removed == ["layers.0.bn1", "layers.1.bn1", "layers.2.bn1"]
    assert isinstance(net.layers[2].bn1, nn.Identity)
    assert isinstance(net.layers[2].bn2, nn.BatchNorm1d)
    assert isinstance(net.layers[2].downsample[1], nn.BatchNorm1d)
    assert isinstance(net.bn1, nn.BatchNorm1d)
    assert net(torch.randn(3, 40)).shape == (3, 10)


class _Bottleneck(nn.Module):
    def __init__(self, c: int, downsample: bool = False) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv3, self.bn3 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.down = nn.Sequential(nn.Conv2d(c, c, 1), nn.BatchNorm2d(c)) if downsample else None

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += idt
        return self.relu(out)


class _NotResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))

    def forward(self, x, y):
        return self.b(self.a(x)) + y  # the two add inputs do not share a block input


def test_bn_removal_bottleneck_matches_mindspore_patterns():
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), _Bottleneck(8, True), _Bottleneck(8)
    )
    removed = sorted(remove_residual_bn(net))
    # MindSpore's pattern 1 (conv shortcut) and 2 (identity): bn1 and bn2 go, bn3 stays
    assert removed == ["3.bn1", "3.bn2", "4.bn1", "4.bn2"]
    assert isinstance(net[3].bn3, nn.BatchNorm2d) and isinstance(net[3].down[1], nn.BatchNorm2d)
    assert remove_residual_bn(_NotResidual()) == []


def test_untraceable_top_level_falls_back_to_children():
    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(_Bottleneck(4), _Bottleneck(4))

        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: not traceable
                x = x * 1.0
            return self.body(x)

    assert sorted(remove_residual_bn(Wrapper())) == [
        "body.0.bn1",
        "body.0.bn2",
        "body.1.bn1",
        "body.1.bn2",
    ]


def test_callback_syncs_optimizer_and_centralizes_on_step():
    torch.manual_seed(0)
    net = ResNet1D(channels=8, blocks=(1, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    n_before = len(opt.param_groups[0]["params"])
    algo = LessBN(fn_flag=True, gc_flag=True)
    algo.apply_to_network(net)
    algo.attach(net, [opt])
    params = opt.param_groups[0]["params"]
    ids = {id(p) for p in params}
    assert {id(p) for p in net.parameters()} == ids  # multiplier in, bias + bn1 params out
    assert len(params) == n_before - 2 * 2 - 1 + 1
    # the pre-step hook centralizes conv/linear weight gradients before the update
    seen = {}

    def spy(optimizer, args, kwargs):
        seen["mean"] = float(net.layers[0].conv1.weight.grad.mean(dim=(1, 2)).abs().max())

    net(torch.randn(4, 40)).sum().backward()
    opt.register_step_pre_hook(spy)
    opt.step()
    assert seen["mean"] < 1e-6
    # idempotent: a second apply does nothing more
    assert LessBN().apply_to_network(net) is net
    assert sum(isinstance(m, CommonHeadLastFN) for m in net.modules()) == 1
    algo.detach()
    w = net.layers[0].conv1.weight
    w.grad = torch.ones_like(w)
    opt.step()  # hook removed: an all-ones gradient is no longer zeroed
    assert w.grad.abs().sum() > 0
