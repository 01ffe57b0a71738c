"""get_thor_lr / get_thor_damping against MindSpore's model-zoo loops (docs/semantics.md §4.4)."""

from __future__ import annotations

import pytest
import torch

from lit_amp.thor.schedules import get_thor_damping, get_thor_lr


def _ms_lr(global_step, lr_init, decay, total_epochs, steps_per_epoch, decay_epochs=100):
    out = []
    for i in range(steps_per_epoch * total_epochs):
        epoch = (i + 1) / steps_per_epoch
        lr = lr_init * (1.0 - float(epoch) / total_epochs) ** decay
        if epoch >= decay_epochs:
            lr *= 0.5
        if epoch >= decay_epochs + 1:
            lr *= 0.5
        out.append(lr)
    return torch.tensor(out, dtype=torch.float32)[global_step:]


def _ms_damping(global_step, damping_init, decay_rate, total_epochs, steps_per_epoch):
    out = []
    for step in range(steps_per_epoch * total_epochs):
        epoch = (step + 1) / steps_per_epoch
        out.append(damping_init * decay_rate ** (epoch / 10))
    return torch.tensor(out, dtype=torch.float32)[global_step:]


@pytest.mark.parametrize("global_step", [0, 37])
def test_thor_lr_matches_mindspore(global_step):
    got = get_thor_lr(global_step, 0.05803, 4.0839, 53, 20, decay_epochs=39)
    torch.testing.assert_close(got, _ms_lr(global_step, 0.05803, 4.0839, 53, 20, 39))
    assert got.dtype == torch.float32 and got.shape == (53 * 20 - global_step,)
    assert got[-1] == 0.0  # the last step reaches epoch == total_epochs


@pytest.mark.parametrize("global_step", [0, 11])
def test_thor_damping_matches_mindspore(global_step):
    got = get_thor_damping(global_step, 0.03, 0.50036, 70, 7)
    torch.testing.assert_close(got, _ms_damping(global_step, 0.03, 0.50036, 70, 7))


@pytest.mark.parametrize(
    ("fn", "kwargs", "exc", "match"),
    [
        (get_thor_lr, {"steps_per_epoch": 0}, ValueError, "'steps_per_epoch'"),
        (get_thor_lr, {"total_epochs": 2.5}, TypeError, "'total_epochs'"),
        (get_thor_lr, {"lr_init": "0.1"}, TypeError, "'lr_init'"),
        (get_thor_lr, {"global_step": -1}, ValueError, "'global_step'"),
        (get_thor_damping, {"decay_rate": None}, TypeError, "'decay_rate'"),
    ],
)
def test_bad_arguments(fn, kwargs, exc, match):
    base = {"global_step": 0, "total_epochs": 2, "steps_per_epoch": 3}
    if fn is get_thor_lr:
        base.update(lr_init=0.1, decay=2.0)
    else:
        base.update(damping_init=0.03, decay_rate=0.5)
    with pytest.raises(exc, match=match):
        fn(**{**base, **kwargs})
