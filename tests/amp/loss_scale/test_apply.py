"""``LossScaleController.apply``, the one driver of a scaled step: unscale, hook, check, step,
update."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp.amp.loss_scale.controller import AppliedStep, LossScaleController
from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager, FixedLossScaleManager


def scaled_backward(ctl, net, bad=False):
    loss = net(torch.ones(3, 4)).pow(2).mean()
    if bad:
        loss = loss * float("inf")
    ctl.scale_loss(loss).backward()


def true_grads(net):
    ref = nn.Linear(4, 2)
    ref.load_state_dict(net.state_dict())
    ref(torch.ones(3, 4)).pow(2).mean().backward()
    return [p.grad.clone() for p in ref.parameters()]


def test_hook_sees_true_gradients_then_the_step_runs_and_the_scale_moves():
    net = nn.Linear(4, 2)
    expected = true_grads(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ctl = LossScaleController(DynamicLossScaleManager(2.0**10, scale_window=1))
    events = []
    scaled_backward(ctl, net)
    done = ctl.apply(
        opt,
        lambda: events.append("step") or "stepped",
        before_step=lambda: events.append([p.grad.clone() for p in net.parameters()]),
    )
    assert done == AppliedStep(overflow=False, skipped=False, output="stepped")
    assert events[1] == "step"
    for seen, ref in zip(events[0], expected):
        torch.testing.assert_close(seen, ref)
    assert ctl.scale == 2.0**11 and ctl.steps == 1


def test_overflow_skips_the_step_but_runs_the_hook_and_shrinks_once():
    net = nn.Linear(4, 2)
    before = [p.detach().clone() for p in net.parameters()]
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ctl = LossScaleController(DynamicLossScaleManager(2.0**10))
    hooks = []
    scaled_backward(ctl, net, bad=True)
    done = ctl.apply(opt, opt.step, before_step=lambda: hooks.append(1))
    assert done == AppliedStep(overflow=True, skipped=True, output=None)
    assert hooks == [1]  # as Lightning's on_before_optimizer_step: skipped steps too
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    assert ctl.scale == 2.0**9 and ctl.skipped_steps == 1


def test_several_optimizers_step_once_and_update_once():
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in net]
    ctl = LossScaleController(DynamicLossScaleManager(2.0**10, scale_window=2))
    calls = []
    for _ in range(2):
        scaled_backward(ctl, net)
        ctl.apply(opts, lambda: calls.append([o.step() for o in opts]))
    assert len(calls) == 2 and ctl.steps == 2 and ctl.scale == 2.0**11


def test_update_false_leaves_the_update_to_the_caller():
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ctl = LossScaleController(DynamicLossScaleManager(2.0**10))
    scaled_backward(ctl, net, bad=True)
    done = ctl.apply(opt, opt.step, update=False)
    assert done.skipped and ctl.scale == 2.0**10 and ctl.steps == 0
    ctl.update(done.overflow)
    assert ctl.scale == 2.0**9 and ctl.steps == 1


def test_never_skips_when_the_manager_keeps_overflowing_steps():
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ctl = LossScaleController(FixedLossScaleManager(8.0, drop_overflow_update=False))
    scaled_backward(ctl, net, bad=True)
    done = ctl.apply(opt, lambda: "stepped")
    assert done == AppliedStep(overflow=True, skipped=False, output="stepped")


@pytest.mark.parametrize("bad", [False, True])
def test_disabled_controller_runs_hook_and_step_only(bad):
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ctl = LossScaleController(None)
    scaled_backward(ctl, net, bad=bad)
    order = []
    done = ctl.apply(opt, lambda: order.append("step"), before_step=lambda: order.append("hook"))
    assert order == ["hook", "step"] and not done.overflow and not done.skipped
    assert ctl.steps == 0
