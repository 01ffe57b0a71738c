"""MindSpore's ``Metric`` API on lit_amp metrics (``lit_amp.metrics.base``): ``clear()`` /
``update()`` / ``eval()``.

The expected values and types were read from mindspore 2.10 (``mindspore.train.Accuracy`` etc.):
``eval()`` returns a ``numpy.float64`` for a scalar metric and a numpy array per class, and
raises RuntimeError when nothing was seen.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lit_amp.metrics import MAE, Accuracy, Loss, Precision
from lit_amp.model import Model
from tests.helpers.data import make_batches, make_net

PRED = torch.tensor([[0.2, 0.8], [0.9, 0.1]])
LABEL = torch.tensor([1, 1])


def test_custom_eval_loop_clear_update_eval() -> None:
    m = Accuracy()
    m.clear()
    m.update(PRED, LABEL)
    v = m.eval()
    assert type(v) is np.float64 and v == 0.5  # mindspore 2.10: numpy.float64 0.5
    m.clear()
    m.update(PRED, torch.tensor([1, 0]))
    assert m.eval() == 1.0  # clear() forgot the first batch


def test_eval_values_match_mindspore() -> None:
    p = Precision()
    p.update(PRED, LABEL)
    np.testing.assert_allclose(p.eval(), [0.0, 1.0])  # mindspore 2.10: array([0., 1.])
    mae = MAE()
    mae.update(torch.tensor([1.0]), torch.tensor([3.0]))
    assert mae.eval() == 2.0
    loss = Loss()
    loss.update(torch.tensor(1.5))
    assert loss.eval() == 1.5


def test_eval_without_samples_raises_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="number of samples is 0"):
        Accuracy().eval()


def test_module_train_eval_switch_still_works_with_metrics_inside() -> None:
    """torch's Module.eval() / train(False) on a parent reaches the metric via train(mode)."""
    parent = nn.ModuleDict({"acc": Accuracy()})
    assert parent.eval() is parent and not parent["acc"].training
    parent.train()
    assert parent["acc"].training
    # Model.eval (Lightning's validate, which switches modes recursively) still gives values
    model = Model(make_net(), nn.CrossEntropyLoss(), metrics={"acc"})
    out = model.eval(make_batches(2))
    assert set(out) == {"acc"} and 0.0 <= out["acc"] <= 1.0


def test_precision_and_recall_eval_average_is_the_mean_over_classes() -> None:
    """MindSpore's ``Precision().eval(average=True)`` (#16.3): the per-class mean."""
    import numpy as np
    import torch

    from lit_amp.metrics import Precision, Recall

    y_pred = torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]])
    for cls in (Precision, Recall):
        m = cls()
        m.update(y_pred, torch.tensor([1, 0, 1]))
        per_class = m.eval()
        assert m.eval(average=True) == np.mean(per_class)
