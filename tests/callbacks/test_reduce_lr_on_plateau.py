"""MindSpore's ``ReduceLROnPlateau`` through small simulated runs (semantics §1.4-1.7)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp.callbacks.base import RunContext
from lit_amp.callbacks.lambda_callback import LambdaCallback
from lit_amp.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau
from tests.callbacks._helpers import (
    make_net,
    seq,
    simulate_train,
)


def test_reduce_lr_on_plateau_trajectory() -> None:
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    opt = torch.optim.SGD(
        [{"params": [net.weight], "lr": 0.1}, {"params": [net.bias], "lr": 0.2}], lr=0.1
    )
    values = [1.0] * 6 + [0.5] * 7
    cb = ReduceLROnPlateau(factor=0.5, patience=2, cooldown=1, min_lr=0.01, min_delta=0)
    trajectory: list[tuple[float, float]] = []

    def rec(rc: RunContext) -> None:
        trajectory.append(tuple(g["lr"] for g in opt.param_groups))

    simulate_train(
        [cb, LambdaCallback(on_train_epoch_end=rec)],
        epochs=13,
        batches=1,
        net=net,
        opt=opt,
        eval_results=seq(values, "eval_loss"),
    )
    # hand computation of MindSpore's rule (wait, cooldown_counter per epoch):
    # e1 best=1; e2 wait1; e3 wait2 -> x0.5, cd=1; e4 cd->0, wait1; e5 wait2 -> x0.5, cd=1;
    # e6 cd->0, wait1; e7 best=.5; e8 wait1; e9 wait2 -> x0.5; e10 wait1; e11 wait2 -> floor .01
    # e12 wait1; e13 wait2 -> group0 already at min_lr, group1 .0125 -> .01
    g0 = [0.1, 0.1, 0.05, 0.05, 0.025, 0.025, 0.025, 0.025, 0.0125, 0.0125, 0.01, 0.01, 0.01]
    g1 = [0.2, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025, 0.0125, 0.0125, 0.01]
    assert [t[0] for t in trajectory] == pytest.approx(g0)
    assert [t[1] for t in trajectory] == pytest.approx(g1)


def test_reduce_lr_on_plateau_max_mode_and_verbose(capsys: pytest.CaptureFixture) -> None:
    net, opt = make_net(lr=1.0)
    cb = ReduceLROnPlateau(monitor="acc", factor=0.5, patience=1, verbose=True)
    simulate_train(
        [cb], epochs=3, batches=1, net=net, opt=opt, eval_results=seq([0.5, 0.4, 0.9], "acc")
    )
    assert opt.param_groups[0]["lr"] == 0.5
    assert capsys.readouterr().out.strip() == (
        "Epoch 00002: ReduceLROnPlateau reducing learning rate to 0.5."
    )


def test_reduce_lr_on_plateau_needs_optimizer() -> None:
    cb = ReduceLROnPlateau(monitor="loss")
    with pytest.raises(ValueError, match="optimizer"):
        cb.on_train_epoch_end(RunContext({"optimizer": None, "net_outputs": torch.tensor(1.0)}))


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"factor": 1.0}, ValueError, r"factor.*\(0, 1\)"),
        ({"factor": 0}, TypeError, "factor"),  # mindspore 2.10: an int factor is a TypeError
        ({"factor": 1.5}, ValueError, "factor"),
        ({"factor": "0.1"}, TypeError, "factor"),
        ({"mode": "up"}, ValueError, "mode"),
        ({"patience": -1}, ValueError, "patience"),
        ({"cooldown": -1}, ValueError, "cooldown"),
        ({"cooldown": 0.5}, TypeError, "cooldown"),
        ({"min_lr": -0.1}, ValueError, "min_lr"),
        ({"min_delta": None}, TypeError, "min_delta"),
        ({"monitor": None}, TypeError, "monitor"),
        ({"verbose": "yes"}, TypeError, "verbose"),
    ],
)
def test_reduce_lr_on_plateau_bad_arguments(kwargs: dict, exc: type, name: str) -> None:
    with pytest.raises(exc, match=name):
        ReduceLROnPlateau(**kwargs)
