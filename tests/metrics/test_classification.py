"""Accuracy, top-k, AUC and ConfusionMatrix (``lit_amp.metrics.classification``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_amp.metrics import (
    AUC,
    Accuracy,
    ConfusionMatrix,
    Top1CategoricalAccuracy,
    Top5CategoricalAccuracy,
    TopKCategoricalAccuracy,
)
from tests.metrics._data import (
    LABELS,
    LOGITS,
    SIZES,
    class_batches,
    labels_of,
    multilabel_batches,
    rank_auc,
    rng,
    stacked,
)
from tests.metrics._tester import MetricCase, MetricTester, case_id, value

# torchmetrics warns before our own RuntimeError when compute() precedes update()
pytestmark = pytest.mark.filterwarnings("ignore:The ``compute`` method of metric")


# --------------------------------------------------------------------------------------
# references and cases
# --------------------------------------------------------------------------------------


def _accuracy_ref(batches):
    x, y = stacked(batches, 0), stacked(batches, 1)
    y = labels_of(y) if y.shape == x.shape else y  # one-hot labels are argmaxed
    return np.mean(x.argmax(1) == y)


def _segmentation_batches():
    g = rng(2)
    return [(g.random((n, 3, 4)), g.integers(0, 3, size=(n, 4))) for n in SIZES]


def _multilabel_accuracy_ref(batches):
    return np.mean((stacked(batches, 0) == stacked(batches, 1)).all(1))


def _topk_ref(k):
    def ref(batches):
        x, y = stacked(batches, 0), stacked(batches, 1)
        top = np.argsort(-x, axis=1, kind="stable")[:, :k]  # ties: the lower class index first
        return np.mean([y[i] in top[i] for i in range(len(y))])

    return ref


def _confusion_ref(normalize):
    def ref(batches):
        x, y = stacked(batches, 0), stacked(batches, 1)
        pred = x.argmax(1) if x.ndim == 2 else (x >= 0.3).astype(int)
        c = 4 if x.ndim == 2 else 2
        cm = np.zeros((c, c))
        np.add.at(cm, (y, pred), 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            if normalize == "target":
                cm = cm / cm.sum(1, keepdims=True)
            elif normalize == "prediction":
                cm = cm / cm.sum(0, keepdims=True)
            elif normalize == "all":
                cm = cm / cm.sum()
        return np.nan_to_num(cm)

    return ref


def _binary_batches():
    g = rng(3)
    return [(np.round(g.random(n), 1), g.permutation(np.arange(n) % 2)) for n in SIZES]


def _two_column_batches():
    g = rng(4)
    return [(g.normal(size=(n, 2)), g.permutation(np.arange(n) % 2)) for n in SIZES]


def _multiclass_batches():
    g = rng(5)
    return [(g.dirichlet(np.ones(3), size=n), g.permutation(np.arange(n) % 3)) for n in SIZES]


def _threshold_batches():
    g = rng(6)
    return [(g.random(n), g.integers(0, 2, size=n)) for n in SIZES]


def _auc_binary_ref(batches):
    return rank_auc(stacked(batches, 0), stacked(batches, 1))


def _auc_two_column_ref(batches):
    x = stacked(batches, 0)
    return rank_auc(x[:, 1] - x[:, 0], stacked(batches, 1))


def _auc_multiclass_ref(batches):
    p, y = stacked(batches, 0), stacked(batches, 1)
    return np.mean([rank_auc(p[:, c], (y == c).astype(int)) for c in range(3)])


CASES = [
    MetricCase("accuracy", Accuracy, class_batches, _accuracy_ref),
    MetricCase("accuracy-one-hot", Accuracy, lambda: class_batches(one_hot=True), _accuracy_ref),
    MetricCase("accuracy-segmentation", Accuracy, _segmentation_batches, _accuracy_ref),
    MetricCase("accuracy-multilabel", lambda: Accuracy("multilabel"), multilabel_batches,
               _multilabel_accuracy_ref),
    MetricCase("top1-ties", Top1CategoricalAccuracy, lambda: class_batches(6, ties=True),
               _topk_ref(1)),
    MetricCase("top3-ties", lambda: TopKCategoricalAccuracy(3), lambda: class_batches(6, ties=True),
               _topk_ref(3)),
    MetricCase("top5", Top5CategoricalAccuracy, lambda: class_batches(8), _topk_ref(5)),
    *(
        MetricCase(f"confusion-{n}", lambda n=n: ConfusionMatrix(4, normalize=n), class_batches,
                   _confusion_ref(n))
        for n in ("no_norm", "target", "prediction", "all")
    ),
    MetricCase("confusion-threshold", lambda: ConfusionMatrix(2, threshold=0.3),
               _threshold_batches, _confusion_ref("no_norm")),
    MetricCase("auc-binary", AUC, _binary_batches, _auc_binary_ref, rtol=1e-6),
    MetricCase("auc-two-columns", AUC, _two_column_batches, _auc_two_column_ref, rtol=1e-6),
    MetricCase("auc-multiclass", AUC, _multiclass_batches, _auc_multiclass_ref, rtol=1e-6),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
class TestClassification(MetricTester):
    """(a)-(d) of the shared tester for every classification case."""


# --------------------------------------------------------------------------------------
# Accuracy
# --------------------------------------------------------------------------------------


def test_accuracy_classification_matches_argmax_count():
    m = Accuracy()
    m.update(torch.tensor(LOGITS), torch.tensor(LABELS))
    expected = np.mean(LOGITS.argmax(1) == LABELS)
    assert value(m) == pytest.approx(expected)
    assert isinstance(value(m), float)


def test_accuracy_mindspore_doc_example_with_float_labels():
    m = Accuracy("classification")
    m.update(
        torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]),
        torch.tensor([1.0, 0.0, 1.0]),
    )
    assert value(m) == pytest.approx(2 / 3)


def test_accuracy_probability_labels_are_argmaxed():
    probs = np.array([[0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
    m2 = Accuracy()
    m2.update(torch.tensor([[0.1, 0.9], [0.2, 0.8], [0.3, 0.7]]), torch.tensor(probs))
    assert value(m2) == pytest.approx(2 / 3)  # labels 1, 0, 1; predictions 1, 1, 1


def test_accuracy_index_column_label_is_rejected_not_argmaxed():
    # an (N, 1) index label must not be argmaxed (to 0) silently
    with pytest.raises(ValueError, match="y \\(true value\\)"):
        Accuracy().update(torch.tensor(LOGITS), torch.tensor(LABELS).reshape(-1, 1))


def test_accuracy_segmentation_counts_every_position():
    m = Accuracy()
    m.update(torch.rand(2, 3, 4), torch.randint(0, 3, (2, 4)))
    assert int(m.total_num) == 8


def test_accuracy_multilabel_rejects_non_binary_values():
    with pytest.raises(ValueError, match="0 or 1"):
        Accuracy("multilabel").update(torch.tensor([[0.7, 0.2]]), torch.tensor([[1, 0]]))


def test_accuracy_errors():
    with pytest.raises(TypeError, match="eval_type"):
        Accuracy("binary")
    with pytest.raises(RuntimeError, match="'Accuracy' can not be calculated, because the number"):
        Accuracy().compute()
    with pytest.raises(ValueError, match="needs 2 inputs"):
        Accuracy().update(torch.zeros(2, 2))
    with pytest.raises(TypeError, match="input data type"):
        Accuracy().update("abc", torch.zeros(2))
    m = Accuracy()
    m.update(torch.zeros(2, 3), torch.zeros(2))
    with pytest.raises(ValueError, match="class number"):
        m.update(torch.zeros(2, 4), torch.zeros(2))


def test_accuracy_reset_also_resets_the_class_count():
    m = Accuracy()
    m.update(torch.tensor(LOGITS), torch.tensor(LABELS))
    m.reset()
    m.update(torch.tensor([[0.0, 1.0]]), torch.tensor([1]))  # 2 classes now
    assert value(m) == 1.0


def test_accuracy_accepts_lists():
    m = Accuracy()
    m.update(LOGITS, LABELS.tolist())
    assert value(m) == pytest.approx(np.mean(LOGITS.argmax(1) == LABELS))


# --------------------------------------------------------------------------------------
# top-k
# --------------------------------------------------------------------------------------


def test_topk_mindspore_doc_examples_ties_and_errors():
    x = torch.tensor(
        [[0.2, 0.5, 0.3, 0.6, 0.2], [0.1, 0.35, 0.5, 0.2, 0.0], [0.9, 0.6, 0.2, 0.01, 0.3]]
    )
    y = torch.tensor([2.0, 0.0, 1.0])
    for m, expected in (
        (TopKCategoricalAccuracy(3), 2 / 3),
        (Top1CategoricalAccuracy(), 0.0),
        (Top5CategoricalAccuracy(), 1.0),
    ):
        m.update(x, y)
        assert value(m) == pytest.approx(expected)
    tie = Top1CategoricalAccuracy()  # equal scores: the lower class index wins
    tie.update(torch.tensor([[0.5, 0.5], [0.5, 0.5]]), torch.tensor([0, 1]))
    assert value(tie) == 0.5
    tie2 = TopKCategoricalAccuracy(2)  # torch.topk would pick classes 1 and 3 here
    tie2.update(torch.tensor([[0.1, 0.5, 0.5, 0.5, 0.2]]), torch.tensor([3]))
    assert value(tie2) == 0.0
    with pytest.raises(TypeError, match="'k'"):
        TopKCategoricalAccuracy(2.0)
    with pytest.raises(ValueError, match="'k' must be an int >= 1"):
        TopKCategoricalAccuracy(0)


# --------------------------------------------------------------------------------------
# AUC
# --------------------------------------------------------------------------------------


def test_auc_one_column_of_logits_and_one_hot_labels():
    g = rng(3)
    logits = g.normal(size=(12, 1))
    labels = np.array([0, 1] * 6)
    m1 = AUC()
    m1.update(torch.tensor(logits), torch.tensor(labels))
    assert value(m1) == pytest.approx(rank_auc(logits[:, 0], labels))
    probs = g.dirichlet(np.ones(3), size=15)
    labels3 = np.array([0, 1, 2] * 5)
    m = AUC()
    m.update(torch.tensor(probs[:7]), torch.tensor(labels3[:7]))
    m.update(torch.tensor(probs[7:]), torch.tensor(np.eye(3)[labels3[7:]]))  # one-hot too
    expected = np.mean([rank_auc(probs[:, c], (labels3 == c).astype(int)) for c in range(3)])
    assert value(m) == pytest.approx(expected)


def test_auc_errors_and_reset():
    m = AUC()
    with pytest.raises(RuntimeError, match="'AUC' can not be calculated"):
        m.compute()
    with pytest.raises(ValueError, match="0 or 1"):
        m.update(torch.tensor([0.1, 0.9]), torch.tensor([0, 2]))
    m.update(torch.tensor([0.1, 0.9]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="does not match earlier batches"):
        m.update(torch.rand(2, 3), torch.tensor([0, 2]))
    m.reset()
    m.update(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]]), [0, 1, 2])
    assert value(m) == pytest.approx(1.0)


# --------------------------------------------------------------------------------------
# ConfusionMatrix
# --------------------------------------------------------------------------------------


def test_confusion_matrix_doc_example_threshold_and_errors():
    m = ConfusionMatrix(num_classes=2)
    m.update(torch.tensor([1, 0, 1, 0]), torch.tensor([1, 0, 0, 1]))
    np.testing.assert_array_equal(value(m), [[1.0, 1.0], [1.0, 1.0]])
    thr = ConfusionMatrix(2, threshold=0.3)
    thr.update(torch.tensor([0.2, 0.4]), torch.tensor([0, 1]))
    np.testing.assert_array_equal(value(thr), [[1.0, 0.0], [0.0, 1.0]])
    assert value(thr).dtype == np.float64
    with pytest.raises(ValueError, match="normalize"):
        ConfusionMatrix(2, normalize="rows")
    with pytest.raises(TypeError, match="num_classes"):
        ConfusionMatrix("2")
    with pytest.raises(TypeError, match="threshold"):
        ConfusionMatrix(2, threshold=1)


def test_topk_one_hot_label_of_another_width_is_argmaxed():
    """Issue #48 item 7. Recorded from mindspore 2.10 (MindSpore's own test_topk feeds a
    one-hot label narrower than y_pred): TopKCategoricalAccuracy(2) -> 2/3 and
    Top5CategoricalAccuracy -> 1.0 for one-hot labels 4, 6 and 3 wide beside 5 scores."""
    x = torch.tensor(
        [[0.2, 0.5, 0.3, 0.6, 0.2], [0.1, 0.35, 0.5, 0.2, 0.0], [0.9, 0.6, 0.2, 0.01, 0.3]]
    )
    for width in (4, 6, 3):
        y = torch.eye(width)[[2, 1, 0]]
        top2, top5 = TopKCategoricalAccuracy(2), Top5CategoricalAccuracy()
        top2.update(x, y)
        top5.update(x, y)
        assert value(top2) == pytest.approx(2 / 3)
        assert value(top5) == 1.0
    wide = Top5CategoricalAccuracy()  # class 5 is not among 5 scores: a miss, as in MindSpore
    wide.update(x, torch.eye(6)[[5, 1, 0]])
    assert value(wide) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="one class index per row"):  # not one-hot: refused
        TopKCategoricalAccuracy(2).update(x, torch.full((3, 4), 0.25))
