"""MindSpore's ``LearningRateScheduler`` through small simulated runs (semantics §1.4-1.7)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp.callbacks.lr_scheduler import LearningRateScheduler
from tests.callbacks._helpers import (
    make_net,
    same,
    simulate_train,
    weights,
)


def test_lr_scheduler_changes_every_group() -> None:
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    opt = torch.optim.SGD(
        [{"params": [net.weight], "lr": 0.1}, {"params": [net.bias], "lr": 0.3}], lr=0.1
    )
    calls: list[tuple[float, int]] = []

    def fn(lr: float, step: int) -> float:
        calls.append((lr, step))
        return lr * 0.5 if step % 2 == 0 else lr

    simulate_train([LearningRateScheduler(fn)], epochs=2, batches=2, net=net, opt=opt)
    assert [s for _, s in calls] == [1, 2, 3, 4]
    assert calls[0][0] == pytest.approx(0.1)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.025, 0.025])


def test_lr_scheduler_affects_the_sgd_step() -> None:
    net, opt = make_net()
    before = weights(net)
    simulate_train(
        [LearningRateScheduler(lambda lr, step: 0.0)], epochs=1, batches=3, net=net, opt=opt
    )
    after_first = weights(net)
    assert not same(before, after_first)  # step 1 used lr 0.1
    frozen = weights(net)
    opt.state.clear()  # drop momentum so lr 0 means no change
    simulate_train([], epochs=1, batches=2, net=net, opt=opt)
    assert same(weights(net), frozen)


def test_lr_scheduler_bad_arguments() -> None:
    with pytest.raises(TypeError, match="learning_rate_function"):
        LearningRateScheduler(0.1)
    cb = LearningRateScheduler(lambda lr, step: "0.1")
    with pytest.raises(TypeError, match="learning_rate_function"):
        simulate_train([cb], epochs=1, batches=1)
