"""MindSpore's metric names computed on the device: the same values as on the CPU and by hand.

Moved from tests/metrics/test_registry.py (``test_metrics_on_cuda``), which fed MAE ``(6, 2)``
predictions with ``(6,)`` labels — a shape MAE rightly refuses — and only checked that values
were not None. Here every metric gets inputs of the shape it takes, in two uneven batches, its
state lives on the device, and its value is checked against a hand-computed reference and
against the same metric on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_amp.metrics import ConfusionMatrix, get_metric_fn, metric_value_to_python

pytestmark = pytest.mark.cuda


# 2-class scores (rows do not sum to 1: AUC softmaxes them) and labels
SCORES = np.array([[0.9, 0.05], [0.1, 0.8], [0.6, 0.3], [0.2, 0.7], [0.5, 0.25], [0.3, 0.4]])
LABELS = np.array([0, 1, 1, 0, 0, 1])
ONE_HOT = np.eye(2)[LABELS]
# argmax predictions 0,1,0,1,0,1 against 0,1,1,0,0,1: 4 of 6 right, 2 of 3 per class both ways
TWO_THIRDS = [2 / 3, 2 / 3]
# AUC on softmax(scores)[:, 1], i.e. on s1 - s0 = [-.85, .7, -.3, .5, -.25, .1] (no ties):
# of the 9 (positive, negative) pairs 6 are ordered right
CASES = {
    "acc": (SCORES, LABELS, 4 / 6),
    "accuracy": (SCORES, ONE_HOT, 4 / 6),  # one-hot labels are argmaxed
    "top_1_accuracy": (SCORES, LABELS, 4 / 6),
    "precision": (SCORES, LABELS, TWO_THIRDS),
    "recall": (SCORES, LABELS, TWO_THIRDS),
    "F1": (SCORES, LABELS, TWO_THIRDS),
    "auc": (SCORES, LABELS, 6 / 9),
    # MindSpore's MAE / MSE: the error summed over all elements, divided by the sample count
    "mae": (SCORES, ONE_HOT, float(np.abs(SCORES - ONE_HOT).sum() / 6)),
    "mse": (SCORES, ONE_HOT, float(((SCORES - ONE_HOT) ** 2).sum() / 6)),
}


def _compute(metric, device: torch.device, pred: np.ndarray, label: np.ndarray):
    metric = metric.to(device)
    metric.reset()
    for rows in (slice(0, 4), slice(4, 6)):  # two uneven batches
        metric.update(torch.tensor(pred[rows], dtype=torch.float32, device=device),
                      torch.tensor(label[rows], device=device))
    assert metric.device.type == device.type
    return metric_value_to_python(metric.compute())


@pytest.mark.parametrize("name", sorted(CASES))
def test_metric_values_on_the_device(device, name):
    pred, label, ref = CASES[name]
    got = _compute(get_metric_fn(name), device, pred, label)
    cpu = _compute(get_metric_fn(name), torch.device("cpu"), pred, label)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7, err_msg=name)
    np.testing.assert_allclose(got, cpu, rtol=1e-6, atol=1e-7, err_msg=name)
    assert isinstance(got, float) == isinstance(ref, float), (name, got)  # scalar or per class


def test_loss_and_confusion_matrix_on_the_device(device):
    loss = get_metric_fn("loss").to(device)
    loss.update(torch.tensor([1.0, 2.0], device=device))  # batch mean 1.5
    loss.update(torch.tensor(4.5, device=device))
    assert metric_value_to_python(loss.compute()) == 3.0  # the mean of the batch means
    cm = ConfusionMatrix(num_classes=2).to(device)
    cm.update(torch.tensor(SCORES, dtype=torch.float32, device=device),
              torch.tensor(LABELS, device=device))
    # rows: true class, columns: predicted class
    np.testing.assert_array_equal(metric_value_to_python(cm.compute()), [[2, 1], [1, 2]])
