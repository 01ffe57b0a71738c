"""Precision, Recall, Fbeta and F1 (``lit_amp.metrics.precision_recall``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_amp.metrics import F1, Fbeta, Precision, Recall
from tests.metrics._data import (
    EPS,
    LABELS,
    LOGITS,
    class_batches,
    hand_counts,
    labels_of,
    multilabel_batches,
    stacked,
)
from tests.metrics._tester import MetricCase, MetricTester, case_id, value

pytestmark = pytest.mark.filterwarnings("ignore:The ``compute`` method of metric")


def _per_class_ref(kind, c=4, beta=1.0):
    def ref(batches):
        x, y = stacked(batches, 0), labels_of(stacked(batches, 1))
        tp, pred_pos, actual_pos = hand_counts(x, y, c)
        if kind == "precision":
            return tp / (pred_pos + EPS)
        if kind == "recall":
            return tp / (actual_pos + EPS)
        b2 = beta**2
        return (1 + b2) * tp / (b2 * actual_pos + pred_pos + EPS)

    return ref


def _multilabel_ref(use_pred):
    def ref(batches):
        p, y = stacked(batches, 0), stacked(batches, 1)
        tp = (p * y).sum(1)
        return tp / ((p if use_pred else y).sum(1) + EPS)

    return ref


def _five_class_batches():
    # num_classes=5 but label/prediction 4 never occurs: its value is 0
    return [(x, y) for x, y in ((np.pad(x, ((0, 0), (0, 1)), constant_values=-1.0), y)
                                for x, y in class_batches())]


CASES = [
    MetricCase("precision", Precision, class_batches, _per_class_ref("precision")),
    MetricCase("precision-one-hot", Precision, lambda: class_batches(one_hot=True),
               _per_class_ref("precision")),
    MetricCase("precision-num-classes", lambda: Precision(num_classes=5), _five_class_batches,
               _per_class_ref("precision", c=5)),
    MetricCase("recall", Recall, class_batches, _per_class_ref("recall")),
    MetricCase("f1", F1, class_batches, _per_class_ref("fbeta")),
    MetricCase("fbeta2", lambda: Fbeta(2.0), class_batches, _per_class_ref("fbeta", beta=2.0)),
    MetricCase("precision-multilabel", lambda: Precision("multilabel"), multilabel_batches,
               _multilabel_ref(True), per_sample=True),
    MetricCase("recall-multilabel", lambda: Recall("multilabel"), multilabel_batches,
               _multilabel_ref(False), per_sample=True),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
class TestPrecisionRecall(MetricTester):
    """(a)-(d) of the shared tester for every per-class case."""


def test_precision_recall_f1_per_class_arrays():
    tp, pred_pos, actual_pos = hand_counts(LOGITS, LABELS, 3)
    x, y = torch.tensor(LOGITS), torch.tensor(LABELS)

    p, r, f1, f2 = Precision(), Recall(), F1(), Fbeta(2.0)
    for m in (p, r, f1, f2):
        m.update(x, y)

    precision = value(p)
    assert isinstance(precision, np.ndarray) and precision.dtype == np.float64
    np.testing.assert_allclose(precision, tp / (pred_pos + EPS))
    np.testing.assert_allclose(precision, [2 / 3, 1 / 3, 0.0])  # never-predicted class -> 0
    np.testing.assert_allclose(value(r), [2 / 3, 1.0, 0.0])
    np.testing.assert_allclose(value(f1), 2 * tp / (actual_pos + pred_pos + EPS))
    np.testing.assert_allclose(value(f2), 5 * tp / (4 * actual_pos + pred_pos + EPS))


def test_precision_recall_f1_mindspore_doc_examples():
    x = torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]])
    y = torch.tensor([1, 0, 1])
    for cls, expected in ((Precision, [0.5, 1.0]), (Recall, [1.0, 0.5]), (F1, [2 / 3, 2 / 3])):
        m = cls()
        m.update(x, y)
        np.testing.assert_allclose(value(m), expected)


def test_per_class_metrics_reset_also_resets_the_class_count():
    for cls in (Precision, Recall, F1):
        m = cls()
        m.update(torch.tensor(LOGITS), torch.tensor(LABELS))
        m.reset()
        with pytest.raises(RuntimeError, match="number of samples is 0"):
            m.compute()
        m.update(torch.tensor([[0.0, 1.0]]), torch.tensor([1]))  # 2 classes now
        assert value(m).shape == (2,)


def test_per_class_metrics_errors():
    with pytest.raises(ValueError, match="beta"):
        Fbeta(0.0)
    with pytest.raises(ValueError, match="beta"):
        Fbeta(float("inf"))
    with pytest.raises(TypeError, match="beta"):
        Fbeta("1")
    with pytest.raises(TypeError, match="eval_type"):
        Precision("binary")
    with pytest.raises(TypeError, match="num_classes"):
        Recall(num_classes="3")
    with pytest.raises(ValueError, match="num_classes"):
        Recall(num_classes=0)
    with pytest.raises(RuntimeError, match="'Recall' can not be calculated"):
        Recall().compute()
    m = Precision()
    m.update(torch.zeros(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="class number"):
        m.update(torch.zeros(2, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="class number"):
        Precision(num_classes=3).update(torch.zeros(2, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="class indices in \\[0, 2\\)"):
        F1().update(torch.zeros(2, 2), torch.tensor([0, 2]))


def test_precision_num_classes_preallocates_states():
    m = Precision(num_classes=4)
    assert m.true_positives.shape == (4,)
    m.update(torch.tensor(np.eye(4)[[0, 1]]), torch.tensor([0, 3]))
    np.testing.assert_allclose(value(m), [1.0, 0.0, 0.0, 0.0])


def test_precision_recall_multilabel_are_per_sample_like_mindspore():
    y_pred = np.array([[1, 0, 1], [0, 1, 1]])
    y = np.array([[1, 1, 0], [0, 1, 1]])
    p, r = Precision("multilabel"), Recall("multilabel")
    for m in (p, r):
        m.update(torch.tensor(y_pred), torch.tensor(y))
    tp = (y_pred * y).sum(1)
    np.testing.assert_allclose(value(p), tp / y_pred.sum(1))
    np.testing.assert_allclose(value(r), tp / y.sum(1))


def test_forward_blocks_are_folded_by_the_next_update():
    m = Precision()
    for _ in range(3):
        m(torch.tensor(LOGITS), torch.tensor(LABELS))
    assert len(m.class_counts) == 3  # forward() appends one count block per call
    m.update(torch.tensor(LOGITS), torch.tensor(LABELS))
    assert len(m.class_counts) == 1  # update() folds them: memory stays O(C)
    tp, pos, _ = hand_counts(LOGITS, LABELS, 3)
    np.testing.assert_allclose(value(m), tp / (pos + EPS))


def test_fbeta_eval_average_matches_mindspore():
    """Issue #48 item 7. Recorded from mindspore 2.10: Fbeta(1) on MindSpore's docstring data
    gives eval() == eval(False) == [0.6667, 0.6667], eval(True) == 0.6667, and a non-bool
    ``average`` (1, "x", None) is a TypeError; F1 the same."""
    x = torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]])
    y = torch.tensor([1, 0, 1])
    for m in (Fbeta(1), F1()):
        m.update(x, y)
        np.testing.assert_allclose(m.eval(), [2 / 3, 2 / 3])
        np.testing.assert_allclose(m.eval(False), [2 / 3, 2 / 3])
        avg = m.eval(average=True)
        assert isinstance(avg, np.float64) and avg == pytest.approx(2 / 3)
        for bad in (1, "x", None):
            with pytest.raises(TypeError, match="'average'"):
                m.eval(bad)
