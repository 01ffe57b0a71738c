"""MindSpore's ``EarlyStopping`` through small simulated runs (semantics §1.4-1.7)."""

from __future__ import annotations

import logging

import pytest
import torch

from lit_amp.callbacks.base import Callback
from lit_amp.callbacks.early_stopping import EarlyStopping
from tests.callbacks._helpers import (
    make_net,
    same,
    seq,
    simulate_train,
    weights,
)


@pytest.mark.parametrize(
    ("values", "patience", "stopped"),
    [
        ([0.5, 0.6, 0.6, 0.6, 0.6, 0.6], 2, 4),  # epochs 3, 4 don't improve
        ([0.5, 0.6, 0.7, 0.8, 0.9, 1.0], 0, 0),  # patience 0: improving epochs never stop
        ([0.5, 0.6, 0.6, 0.9, 1.0, 1.0], 0, 3),  # patience 0: the first stall stops
        ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0], 1, 2),  # 0 is a real value
    ],
)
def test_early_stopping_stops_at_the_right_epoch(
    values: list[float], patience: int, stopped: int
) -> None:
    es = EarlyStopping(monitor="acc", patience=patience)
    run = simulate_train([es], epochs=6, batches=1, eval_results=seq(values, "acc"))
    assert es.stopped_epoch == stopped
    assert run.epochs_run[-1] == (stopped or 6)
    assert es.best == max(values[: run.epochs_run[-1]])


def test_early_stopping_baseline_must_be_beaten() -> None:
    values = [0.9, 0.8, 0.7, 0.6, 0.5]
    es = EarlyStopping(patience=2, baseline=0.5)  # eval_loss: min mode
    run = simulate_train([es], epochs=5, batches=1, eval_results=seq(values, "eval_loss"))
    assert es.stopped_epoch == 2 and run.epochs_run == [1, 2]
    assert es.best == 0.8
    es = EarlyStopping(patience=2)
    simulate_train([es], epochs=5, batches=1, eval_results=seq(values, "eval_loss"))
    assert es.stopped_epoch == 0
    # baseline 0 is a real baseline too
    es = EarlyStopping(monitor="acc", patience=1, baseline=0)
    simulate_train([es], epochs=3, batches=1, eval_results=seq([-1.0, -0.5, -0.2], "acc"))
    assert es.stopped_epoch == 1


def test_early_stopping_min_delta() -> None:
    es = EarlyStopping(monitor="eval_loss", patience=1, min_delta=-0.1)  # abs() is used
    simulate_train([es], epochs=4, batches=1, eval_results=seq([1.0, 0.95, 0.5, 0.45], "eval_loss"))
    assert es.stopped_epoch == 2


def test_early_stopping_restores_best_weights_at_stop() -> None:
    net, opt = make_net()
    es = EarlyStopping(patience=2, restore_best_weights=True)
    values = [1.0, 0.5, 0.7, 0.8, 0.9]
    run = simulate_train(
        [es], epochs=5, batches=2, net=net, opt=opt, eval_results=seq(values, "eval_loss")
    )
    assert es.stopped_epoch == 4
    # epoch_weights[4] was recorded after the callbacks ran, i.e. after the restore
    assert same(weights(net), run.epoch_weights[2])
    assert same(run.epoch_weights[4], run.epoch_weights[2])
    assert not same(run.epoch_weights[3], run.epoch_weights[2])


def test_early_stopping_restore_keeps_the_optimizer_state() -> None:
    """Issue #48 item 7: only the network's weights are restored. MindSpore 2.10 reloads
    ``train_network.parameters_dict()``, which rolls the optimizer's moments and global_step
    back to the best epoch too (observed: Momentum, global_step 6 -> 4); docs/differences.md."""
    net, opt = make_net()
    es = EarlyStopping(patience=2, restore_best_weights=True)
    momentum: list[torch.Tensor] = []

    class Keep(Callback):  # the momentum buffer after each epoch's steps, before EarlyStopping
        def on_train_epoch_end(self, rc):
            momentum.append(opt.state[net.weight]["momentum_buffer"].clone())

    simulate_train([Keep(), es], epochs=5, batches=2, net=net, opt=opt,
                   eval_results=seq([1.0, 0.5, 0.7, 0.8, 0.9], "eval_loss"))
    assert es.stopped_epoch == 4
    assert torch.equal(opt.state[net.weight]["momentum_buffer"], momentum[3])  # epoch 4's
    assert not torch.equal(momentum[3], momentum[1])


def test_early_stopping_restores_best_weights_at_train_end(capsys: pytest.CaptureFixture) -> None:
    net, opt = make_net()
    es = EarlyStopping(patience=10, restore_best_weights=True, verbose=True)
    run = simulate_train(
        [es], epochs=3, batches=2, net=net, opt=opt, eval_results=seq([1.0, 0.5, 0.7], "eval_loss")
    )
    assert es.stopped_epoch == 0
    assert not same(run.epoch_weights[3], run.epoch_weights[2])
    assert same(weights(net), run.epoch_weights[2])
    assert "Restoring model weights" in capsys.readouterr().out


def test_early_stopping_on_train_loss_with_tuple_outputs() -> None:
    losses = {1: 3.0, 2: 2.0, 3: 2.5, 4: 2.6}
    es = EarlyStopping(monitor="loss", patience=1)
    simulate_train(
        [es],
        epochs=4,
        batches=1,
        outputs=lambda e, s, loss: (
            torch.tensor(losses[e]),
            torch.tensor(False),
            torch.tensor(1.0),
        ),
    )
    assert es.stopped_epoch == 3 and es.best == 2.0


def test_early_stopping_missing_monitor_warns(caplog: pytest.LogCaptureFixture) -> None:
    es = EarlyStopping(monitor="acc", patience=0)
    with caplog.at_level(logging.WARNING):
        run = simulate_train([es], epochs=2, batches=1)
    assert es.stopped_epoch == 0 and run.epochs_run == [1, 2]
    assert "conditioned on 'acc'" in caplog.text


def test_early_stopping_rejects_non_scalar_monitor() -> None:
    es = EarlyStopping(monitor="acc")
    with pytest.raises(ValueError, match="scalar"):
        simulate_train([es], epochs=1, batches=1, eval_results=lambda e: {"acc": [0.1, 0.2]})


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"mode": "maximum"}, ValueError, "mode.*maximum"),
        ({"mode": 1}, TypeError, "mode"),
        ({"monitor": 1}, TypeError, "monitor"),
        ({"patience": -1}, ValueError, "patience"),
        ({"patience": 1.0}, TypeError, "patience"),
        ({"min_delta": "0.1"}, TypeError, "min_delta"),
        ({"baseline": "0.1"}, TypeError, "baseline"),
        ({"verbose": 1}, TypeError, "verbose"),
        ({"restore_best_weights": None}, TypeError, "restore_best_weights"),
    ],
)
def test_early_stopping_bad_arguments(kwargs: dict, exc: type, name: str) -> None:
    with pytest.raises(exc, match=name):
        EarlyStopping(**kwargs)
