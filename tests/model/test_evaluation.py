"""LitModel's evaluation passes (``lit_amp.model.evaluation``): begin, a step per batch, end; in
a Trainer's validation and test epochs and outside one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp import LitModel
from tests.helpers.data import make_batches, make_loaders, make_net
from tests.helpers.trainer import quiet_trainer


def test_a_pass_outside_a_trainer_computes_the_metrics_and_the_mean_loss():
    lit = LitModel(make_net(), nn.CrossEntropyLoss(), metrics={"acc", "loss"})
    batches = make_batches(3)
    lit.begin_eval()
    for b in batches:
        lit.eval_step(b)
    lit.end_eval()
    with torch.no_grad():
        losses = [nn.functional.cross_entropy(lit.network(x), y) for x, y in batches]
    expected = float(sum(losses) / len(losses))
    assert lit.last_eval_results["eval_loss"] == pytest.approx(expected)
    assert lit.last_eval_results["metrics"]["loss"] == pytest.approx(expected)
    assert 0.0 <= lit.last_eval_results["metrics"]["acc"] <= 1.0
    lit.begin_eval()  # a new pass starts from nothing
    lit.eval_step(batches[0])
    lit.end_eval()
    assert lit.last_eval_results["eval_loss"] == pytest.approx(float(losses[0]))


def test_evaluation_needs_metrics():
    with pytest.raises(ValueError, match="Evaluation needs 'metrics'"):
        LitModel(make_net(), nn.CrossEntropyLoss()).begin_eval()


def test_validation_and_test_epochs_log_under_their_prefix(tmp_path):
    lit = LitModel(make_net(), nn.CrossEntropyLoss(), metrics={"acc", "loss"})
    _, val = make_loaders()
    trainer = quiet_trainer(tmp_path)
    trainer.validate(lit, val, verbose=False)
    assert {"val/acc", "val/eval_loss"} <= set(trainer.callback_metrics)
    assert "val/loss" not in trainer.callback_metrics  # a Loss metric is logged as eval_loss
    trainer.test(lit, val, verbose=False)
    assert {"test/acc", "test/eval_loss"} <= set(trainer.callback_metrics)
