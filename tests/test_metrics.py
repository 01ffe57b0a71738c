"""lit_amp.metrics: MindSpore's metric values, the name table, update_metrics, DDP sync."""

from __future__ import annotations

import os
import socket
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchmetrics
from torchmetrics.classification import MulticlassAccuracy

from lit_amp.metrics import (
    AUC,
    F1,
    MAE,
    MSE,
    Accuracy,
    ConfusionMatrix,
    Dice,
    Fbeta,
    Loss,
    Perplexity,
    Precision,
    Recall,
    Top1CategoricalAccuracy,
    Top5CategoricalAccuracy,
    TopKCategoricalAccuracy,
    get_metric_fn,
    get_metrics,
    metric_value_to_python,
    names,
    update_metrics,
)

EPS = sys.float_info.min

# torchmetrics warns before our own RuntimeError when compute() precedes update()
pytestmark = pytest.mark.filterwarnings("ignore:The ``compute`` method of metric")

# 3-class fixed inputs: class 2 is never predicted, class 1 is predicted twice (once wrongly)
LOGITS = np.array(
    [
        [0.9, 0.05, 0.05],  # pred 0, true 0
        [0.1, 0.8, 0.1],  # pred 1, true 1
        [0.6, 0.3, 0.1],  # pred 0, true 2
        [0.2, 0.7, 0.1],  # pred 1, true 0
        [0.5, 0.2, 0.3],  # pred 0, true 0
        [0.3, 0.4, 0.3],  # pred 1, true 2
    ]
)
LABELS = np.array([0, 1, 2, 0, 0, 2])


def _value(metric: torchmetrics.Metric) -> object:
    return metric_value_to_python(metric.compute())


def _hand_counts(logits: np.ndarray, labels: np.ndarray, c: int):
    pred = logits.argmax(1)
    tp = np.array([np.sum((pred == k) & (labels == k)) for k in range(c)], dtype=float)
    pred_pos = np.array([np.sum(pred == k) for k in range(c)], dtype=float)
    actual_pos = np.array([np.sum(labels == k) for k in range(c)], dtype=float)
    return tp, pred_pos, actual_pos


def _rank_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney: P(score_pos > score_neg) + 0.5 P(tie), by brute force over pairs."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = sum(float(p > n) + 0.5 * float(p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


# --------------------------------------------------------------------------------------
# Accuracy
# --------------------------------------------------------------------------------------


def test_accuracy_classification_matches_argmax_count():
    m = Accuracy()
    m.update(torch.tensor(LOGITS), torch.tensor(LABELS))
    expected = np.mean(LOGITS.argmax(1) == LABELS)
    assert _value(m) == pytest.approx(expected)
    assert isinstance(_value(m), float)


def test_accuracy_mindspore_doc_example_with_float_labels():
    m = Accuracy("classification")
    m.update(
        torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]),
        torch.tensor([1.0, 0.0, 1.0]),
    )
    assert _value(m) == pytest.approx(2 / 3)


def test_accuracy_one_hot_and_probability_labels_are_argmaxed():
    one_hot = np.eye(3)[LABELS]
    m = Accuracy()
    m.update(torch.tensor(LOGITS), torch.tensor(one_hot))
    assert _value(m) == pytest.approx(np.mean(LOGITS.argmax(1) == LABELS))

    probs = np.array([[0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
    m2 = Accuracy()
    m2.update(torch.tensor([[0.1, 0.9], [0.2, 0.8], [0.3, 0.7]]), torch.tensor(probs))
    assert _value(m2) == pytest.approx(2 / 3)  # labels 1, 0, 1; predictions 1, 1, 1


def test_accuracy_index_column_label_is_rejected_not_argmaxed():
    # an (N, 1) index label must not be argmaxed (to 0) silently
    with pytest.raises(ValueError, match="y \\(true value\\)"):
        Accuracy().update(torch.tensor(LOGITS), torch.tensor(LABELS).reshape(-1, 1))


def test_accuracy_segmentation_shape_counts_every_position():
    rng = np.random.default_rng(0)
    y_pred = rng.random((2, 3, 4))
    y = rng.integers(0, 3, size=(2, 4))
    m = Accuracy()
    m.update(torch.tensor(y_pred), torch.tensor(y))
    assert _value(m) == pytest.approx(np.mean(y_pred.argmax(1) == y))
    assert int(m.total_num) == 8


def test_accuracy_multilabel_needs_whole_row_match():
    y_pred = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 0]])
    y = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 1]])
    m = Accuracy("multilabel")
    m.update(torch.tensor(y_pred), torch.tensor(y))
    assert _value(m) == pytest.approx(np.mean((y_pred == y).all(1)))  # 0.5


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


def test_accuracy_accumulates_then_resets():
    m = Accuracy()
    m.update(torch.tensor(LOGITS[:2]), torch.tensor(LABELS[:2]))
    m.update(torch.tensor(LOGITS[2:]), torch.tensor(LABELS[2:]))
    assert _value(m) == pytest.approx(np.mean(LOGITS.argmax(1) == LABELS))
    m.reset()
    with pytest.raises(RuntimeError, match="number of samples is 0"):
        m.compute()
    m.update(torch.tensor([[0.0, 1.0]]), torch.tensor([1]))  # class count was reset too
    assert _value(m) == 1.0


def test_accuracy_accepts_numpy_and_lists():
    m = Accuracy()
    m.update(LOGITS, LABELS.tolist())
    assert _value(m) == pytest.approx(np.mean(LOGITS.argmax(1) == LABELS))


# --------------------------------------------------------------------------------------
# Precision / Recall / F1 / Fbeta
# --------------------------------------------------------------------------------------


def test_precision_recall_f1_per_class_arrays():
    tp, pred_pos, actual_pos = _hand_counts(LOGITS, LABELS, 3)
    x, y = torch.tensor(LOGITS), torch.tensor(LABELS)

    p, r, f1, f2 = Precision(), Recall(), F1(), Fbeta(2.0)
    for m in (p, r, f1, f2):
        m.update(x, y)

    precision = _value(p)
    assert isinstance(precision, np.ndarray) and precision.dtype == np.float64
    np.testing.assert_allclose(precision, tp / (pred_pos + EPS))
    np.testing.assert_allclose(precision, [2 / 3, 1 / 3, 0.0])  # never-predicted class -> 0
    np.testing.assert_allclose(_value(r), tp / (actual_pos + EPS))
    np.testing.assert_allclose(_value(r), [2 / 3, 1.0, 0.0])
    np.testing.assert_allclose(_value(f1), 2 * tp / (actual_pos + pred_pos + EPS))
    np.testing.assert_allclose(_value(f2), 5 * tp / (4 * actual_pos + pred_pos + EPS))


def test_precision_recall_f1_mindspore_doc_examples():
    x = torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]])
    y = torch.tensor([1, 0, 1])
    for cls, expected in ((Precision, [0.5, 1.0]), (Recall, [1.0, 0.5]), (F1, [2 / 3, 2 / 3])):
        m = cls()
        m.update(x, y)
        np.testing.assert_allclose(_value(m), expected)


def test_per_class_metrics_one_hot_labels_and_accumulation():
    one_hot = torch.tensor(np.eye(3)[LABELS])
    for cls in (Precision, Recall, F1):
        whole, parts = cls(), cls()
        whole.update(torch.tensor(LOGITS), torch.tensor(LABELS))
        parts.update(torch.tensor(LOGITS[:3]), one_hot[:3])
        parts.update(torch.tensor(LOGITS[3:]), one_hot[3:])
        np.testing.assert_allclose(_value(parts), _value(whole))
        parts.reset()
        with pytest.raises(RuntimeError, match="number of samples is 0"):
            parts.compute()
        parts.update(torch.tensor([[0.0, 1.0]]), torch.tensor([1]))  # 2 classes now
        assert _value(parts).shape == (2,)


def test_per_class_metrics_errors():
    with pytest.raises(ValueError, match="beta"):
        Fbeta(0.0)
    with pytest.raises(TypeError, match="beta"):
        Fbeta("1")
    with pytest.raises(TypeError, match="eval_type"):
        Precision("binary")
    with pytest.raises(RuntimeError, match="'Recall' can not be calculated"):
        Recall().compute()
    m = Precision()
    m.update(torch.zeros(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="class number"):
        m.update(torch.zeros(2, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="class indices in \\[0, 2\\)"):
        F1().update(torch.zeros(2, 2), torch.tensor([0, 2]))


def test_precision_num_classes_preallocates_states():
    m = Precision(num_classes=4)
    assert m.true_positives.shape == (4,)
    m.update(torch.tensor(np.eye(4)[[0, 1]]), torch.tensor([0, 3]))
    np.testing.assert_allclose(_value(m), [1.0, 0.0, 0.0, 0.0])


def test_precision_recall_multilabel_are_per_sample_like_mindspore():
    y_pred = np.array([[1, 0, 1], [0, 1, 1]])
    y = np.array([[1, 1, 0], [0, 1, 1]])
    p, r = Precision("multilabel"), Recall("multilabel")
    for m in (p, r):
        m.update(torch.tensor(y_pred), torch.tensor(y))
    tp = (y_pred * y).sum(1)
    np.testing.assert_allclose(_value(p), tp / y_pred.sum(1))
    np.testing.assert_allclose(_value(r), tp / y.sum(1))


def test_forward_returns_batch_value_and_keeps_accumulating():
    m = Precision()
    batch = m(torch.tensor(LOGITS[:3]), torch.tensor(LABELS[:3]))
    tp, pos, _ = _hand_counts(LOGITS[:3], LABELS[:3], 3)
    np.testing.assert_allclose(batch.numpy(), tp / (pos + EPS))
    m(torch.tensor(LOGITS[3:]), torch.tensor(LABELS[3:]))
    tp, pos, _ = _hand_counts(LOGITS, LABELS, 3)
    np.testing.assert_allclose(_value(m), tp / (pos + EPS))


# --------------------------------------------------------------------------------------
# MAE / MSE / Loss
# --------------------------------------------------------------------------------------


def test_mae_mse_divide_by_samples_not_elements():
    y_pred = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    y = np.array([[1.5, 2.0, 1.0], [4.0, 3.0, 6.5]])
    mae, mse = MAE(), MSE()
    for m in (mae, mse):
        m.update(torch.tensor(y_pred), torch.tensor(y))
    assert _value(mae) == pytest.approx(np.abs(y - y_pred).sum() / 2)  # 2.5, not 5/6
    assert _value(mse) == pytest.approx(((y - y_pred) ** 2).sum() / 2)


def test_mae_mse_accumulate_reshape_label_and_reset():
    rng = np.random.default_rng(1)
    y_pred, y = rng.random((7, 1)), rng.random(7)
    m = MSE()
    m.update(torch.tensor(y_pred[:3]), torch.tensor(y[:3]))  # y (3,) reshaped to (3, 1)
    m.update(torch.tensor(y_pred[3:]), torch.tensor(y[3:]))
    assert _value(m) == pytest.approx(((y.reshape(-1, 1) - y_pred) ** 2).sum() / 7)
    m.reset()
    with pytest.raises(RuntimeError, match="'MSE' can not be calculated"):
        m.compute()
    with pytest.raises(ValueError, match="as many elements"):
        MAE().update(torch.zeros(2, 2), torch.zeros(3))


def test_loss_is_unweighted_mean_of_batch_means():
    batches = [np.array([1.0]), np.array([2.0, 4.0]), np.array([0.0, 0.0, 0.0, 0.0, 10.0])]
    m = Loss()
    for b in batches:
        m.update(torch.tensor(b))
    m.update(torch.tensor(6.0))  # 0-d
    expected = (1.0 + 3.0 + 2.0 + 6.0) / 4
    assert _value(m) == pytest.approx(expected)
    weighted = np.concatenate([*batches, [6.0]]).mean()
    assert expected != pytest.approx(weighted)
    m.reset()
    with pytest.raises(RuntimeError, match="'Loss' can not be calculated"):
        m.compute()


def test_loss_errors_and_flag():
    assert Loss.is_loss_metric is True
    assert Accuracy.is_loss_metric is False and AUC.is_loss_metric is False
    with pytest.raises(ValueError, match="dimension of the input 'loss'"):
        Loss().update(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="needs 1 input"):
        Loss().update(torch.zeros(2), torch.zeros(2))


# --------------------------------------------------------------------------------------
# top-k
# --------------------------------------------------------------------------------------


def test_top5_against_numpy_argsort():
    rng = np.random.default_rng(2)
    y_pred = rng.random((20, 8))
    y = rng.integers(0, 8, size=20)
    m = Top5CategoricalAccuracy()
    m.update(torch.tensor(y_pred[:9]), torch.tensor(y[:9]))
    m.update(torch.tensor(y_pred[9:]), torch.tensor(y[9:]))
    top5 = np.argsort(-y_pred, axis=1)[:, :5]
    assert _value(m) == pytest.approx(np.mean([y[i] in top5[i] for i in range(20)]))


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
        assert _value(m) == pytest.approx(expected)
    tie = Top1CategoricalAccuracy()  # equal scores: the lower class index wins
    tie.update(torch.tensor([[0.5, 0.5], [0.5, 0.5]]), torch.tensor([0, 1]))
    assert _value(tie) == 0.5
    with pytest.raises(TypeError, match="'k'"):
        TopKCategoricalAccuracy(2.0)
    with pytest.raises(ValueError, match="'k' must be at least 1"):
        TopKCategoricalAccuracy(0)


# --------------------------------------------------------------------------------------
# AUC
# --------------------------------------------------------------------------------------


def test_auc_binary_matches_rank_statistic_with_ties():
    scores = np.array([0.1, 0.4, 0.35, 0.8, 0.4, 0.7, 0.2, 0.4])
    labels = np.array([0, 0, 1, 1, 1, 0, 0, 1])
    m = AUC()
    m.update(torch.tensor(scores[:5]), torch.tensor(labels[:5]))
    m.update(torch.tensor(scores[5:]), torch.tensor(labels[5:]))
    assert _value(m) == pytest.approx(_rank_auc(scores, labels))


def test_auc_binary_column_layouts():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(12, 2))
    labels = np.array([0, 1] * 6)
    # 2 columns of logits: ranked by the softmax of column 1 (= by logit difference)
    m = AUC()
    m.update(torch.tensor(logits), torch.tensor(labels))
    assert _value(m) == pytest.approx(_rank_auc(logits[:, 1] - logits[:, 0], labels))
    # one column of logits
    m1 = AUC()
    m1.update(torch.tensor(logits[:, :1]), torch.tensor(labels))
    assert _value(m1) == pytest.approx(_rank_auc(logits[:, 0], labels))


def test_auc_multiclass_is_one_vs_rest_macro():
    rng = np.random.default_rng(4)
    probs = rng.dirichlet(np.ones(3), size=15)
    labels = np.array([0, 1, 2] * 5)
    m = AUC()
    m.update(torch.tensor(probs[:7]), torch.tensor(labels[:7]))
    m.update(torch.tensor(probs[7:]), torch.tensor(np.eye(3)[labels[7:]]))  # one-hot too
    expected = np.mean([_rank_auc(probs[:, c], (labels == c).astype(int)) for c in range(3)])
    assert _value(m) == pytest.approx(expected)


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
    assert _value(m) == pytest.approx(1.0)


# --------------------------------------------------------------------------------------
# optional MindSpore metrics
# --------------------------------------------------------------------------------------


def test_confusion_matrix_counts_and_normalisation():
    m = ConfusionMatrix(num_classes=2)
    m.update(torch.tensor([1, 0, 1, 0]), torch.tensor([1, 0, 0, 1]))
    np.testing.assert_array_equal(_value(m), [[1.0, 1.0], [1.0, 1.0]])

    y_pred, y = LOGITS, LABELS
    expected = np.zeros((3, 3))
    for t, p in zip(y, y_pred.argmax(1)):
        expected[t, p] += 1
    m3 = ConfusionMatrix(3, normalize="target")
    m3.update(torch.tensor(y_pred), torch.tensor(y))
    np.testing.assert_allclose(_value(m3), expected / expected.sum(1, keepdims=True))
    thr = ConfusionMatrix(2, threshold=0.3)
    thr.update(torch.tensor([0.2, 0.4]), torch.tensor([0, 1]))
    np.testing.assert_array_equal(_value(thr), [[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="normalize"):
        ConfusionMatrix(2, normalize="rows")
    with pytest.raises(TypeError, match="num_classes"):
        ConfusionMatrix("2")


def test_perplexity_and_dice_mindspore_doc_examples():
    x = torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]])
    p = Perplexity()
    p.update(x, torch.tensor([1, 0, 1]))
    assert _value(p) == pytest.approx(2.231443166940565)
    ign = Perplexity(ignore_label=-100)
    ign.update(x, torch.tensor([1, -100, 1]))
    assert _value(ign) == pytest.approx(np.exp(-(np.log(0.5) + np.log(0.6)) / 2))

    d = Dice(smooth=1e-5)
    d.update(x, torch.tensor([[0, 1], [1, 0], [0, 1]]))
    assert _value(d) == pytest.approx(0.20467791371802546)
    with pytest.raises(ValueError, match="smooth"):
        Dice(smooth=0.0)


# --------------------------------------------------------------------------------------
# the name table
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("acc", Accuracy),
        ("accuracy", Accuracy),
        ("precision", Precision),
        ("recall", Recall),
        ("F1", F1),
        ("f1", F1),
        ("mae", MAE),
        ("mse", MSE),
        ("loss", Loss),
        ("top_1_accuracy", Top1CategoricalAccuracy),
        ("top_5_accuracy", Top5CategoricalAccuracy),
        ("auc", AUC),
        ("perplexity", Perplexity),
        ("dice", Dice),
    ],
)
def test_get_metric_fn_name_table(name, cls):
    a, b = get_metric_fn(name), get_metric_fn(name)
    assert type(a) is cls and a is not b
    assert isinstance(a, torchmetrics.Metric)


def test_get_metric_fn_required_args_unknown_and_unsupported_names():
    with pytest.raises(TypeError, match=r"needs 'k'.*TopKCategoricalAccuracy\(k=3\)"):
        get_metric_fn("topk")
    assert get_metric_fn("topk", k=3).k == 3
    with pytest.raises(TypeError, match=r"ConfusionMatrix\(num_classes=10\)"):
        get_metric_fn("confusion_matrix")
    with pytest.raises(KeyError, match="unknown metric name 'F2'.*'acc'.*'f1'"):
        get_metric_fn("F2")
    with pytest.raises(KeyError, match="'roc' is not provided by lit_amp"):
        get_metric_fn("roc")
    with pytest.raises(TypeError, match="'name' must be a str"):
        get_metric_fn(3)
    assert names() == sorted(names()) and {"F1", "f1", "acc", "accuracy", "auc"} <= set(names())


def test_get_metrics_set_dict_none_and_bad_types():
    assert get_metrics(None) is None
    got = get_metrics({"acc", "loss", "f1"})
    assert list(got) == ["acc", "f1", "loss"]
    assert isinstance(got["acc"], Accuracy) and isinstance(got["loss"], Loss)

    stock = MulticlassAccuracy(num_classes=3)
    mine = TopKCategoricalAccuracy(k=3)
    assert get_metrics({"stock": stock, "topk": mine}) == {"stock": stock, "topk": mine}
    assert get_metrics(torch.nn.ModuleDict({"topk": mine})) == {"topk": mine}

    with pytest.raises(TypeError, match="'metrics' must be a set .* but got list"):
        get_metrics(["acc"])
    with pytest.raises(TypeError, match="but got tuple"):
        get_metrics(("acc",))
    with pytest.raises(TypeError, match="but got str"):
        get_metrics("acc")
    with pytest.raises(TypeError, match=r"metrics\['acc'\].*Metric instance, but got str"):
        get_metrics({"acc": "accuracy"})
    with pytest.raises(TypeError, match="keys of 'metrics' must be str"):
        get_metrics({1: Accuracy()})
    with pytest.raises(KeyError, match="unknown metric name"):
        get_metrics({"acc", "nope"})


# --------------------------------------------------------------------------------------
# update_metrics
# --------------------------------------------------------------------------------------


def test_update_metrics_with_eval_indexes_routes_loss_and_stock_metrics():
    metrics = get_metrics({"loss", "acc"})
    metrics["stock"] = MulticlassAccuracy(num_classes=3, average="micro")
    x, y = torch.tensor(LOGITS), torch.tensor(LABELS)
    # (label, loss, logits): eval_indexes = [loss, prediction, label]
    update_metrics(metrics, (y, torch.tensor(0.25), x), eval_indexes=[1, 2, 0])
    update_metrics(metrics, [y[:2], torch.tensor([0.5, 1.0]), x[:2]], eval_indexes=[1, 2, 0])
    acc = (np.sum(LOGITS.argmax(1) == LABELS) + 2) / 8
    assert _value(metrics["loss"]) == pytest.approx((0.25 + 0.75) / 2)
    assert _value(metrics["acc"]) == pytest.approx(acc)
    assert _value(metrics["stock"]) == pytest.approx(acc)


def test_update_metrics_without_eval_indexes_passes_all_outputs():
    metrics = {"mae": MAE(), "loss_only": Loss()}
    update_metrics({"mae": metrics["mae"]}, (torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0])))
    assert _value(metrics["mae"]) == pytest.approx(1.5)
    update_metrics({"loss": metrics["loss_only"]}, torch.tensor([2.0, 4.0]))  # tensor -> 1-tuple
    assert _value(metrics["loss_only"]) == pytest.approx(3.0)
    # set_indexes picks the inputs MindSpore-style when eval_indexes is None
    acc = Accuracy().set_indexes([2, 0])
    update_metrics({"acc": acc}, (torch.tensor(LABELS), torch.tensor(1.0), torch.tensor(LOGITS)))
    assert _value(acc) == pytest.approx(np.mean(LOGITS.argmax(1) == LABELS))


def test_update_metrics_errors():
    metrics = {"acc": Accuracy()}
    with pytest.raises(ValueError, match="'outputs' must be a tensor, tuple or list, but got dict"):
        update_metrics(metrics, {"a": torch.zeros(1)})
    with pytest.raises(ValueError, match="length of 'outputs' must be greater than or equal to 3"):
        update_metrics(metrics, (torch.zeros(2, 2), torch.zeros(2)), eval_indexes=[0, 1, 2])
    with pytest.raises(ValueError, match="'eval_indexes' must be None or a list of 3 ints"):
        update_metrics(metrics, (torch.zeros(1),) * 3, eval_indexes=[0, 1])
    with pytest.raises(ValueError, match="'indexes' must be a list of int"):
        Accuracy().set_indexes((0, 1))


def test_metric_value_to_python():
    assert metric_value_to_python(torch.tensor(0.25, dtype=torch.float64)) == 0.25
    arr = metric_value_to_python(torch.tensor([0.5, 1.0], dtype=torch.bfloat16))
    assert isinstance(arr, np.ndarray) and arr.tolist() == [0.5, 1.0]
    assert metric_value_to_python((torch.tensor(1.0), [torch.tensor([2.0])]))[0] == 1.0
    assert metric_value_to_python({"a": np.float64(0.5)}) == {"a": 0.5}
    assert metric_value_to_python("x") == "x"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_metrics_on_cuda():
    for name in ("acc", "precision", "F1", "top_1_accuracy", "auc", "mae"):
        m = get_metric_fn(name).to("cuda")
        labels = torch.tensor([0, 1, 1, 0, 0, 1], device="cuda")
        m.update(torch.tensor(LOGITS[:, :2], device="cuda"), labels)
        assert metric_value_to_python(m.compute()) is not None
    loss = Loss().to("cuda")
    loss.update(torch.tensor([1.0, 3.0], device="cuda"))
    assert _value(loss) == 2.0


# --------------------------------------------------------------------------------------
# DDP sync (gloo, 2 processes on CPU)
# --------------------------------------------------------------------------------------


def _ddp_batches() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    out = []
    for size in (5, 3, 7, 4, 6):  # uneven batches, uneven split (3 vs 2 batches)
        logits = torch.rand(size, 4, generator=g, dtype=torch.float64)
        labels = torch.arange(size) % 4
        loss = torch.rand(size, generator=g, dtype=torch.float64)
        out.append((loss, logits, labels))
    return out


def _ddp_metrics() -> dict[str, torchmetrics.Metric]:
    metrics = get_metrics({"acc", "precision", "recall", "F1", "loss", "auc"})
    metrics["top2"] = TopKCategoricalAccuracy(2)
    metrics["confusion"] = ConfusionMatrix(4)
    metrics["perplexity"] = Perplexity()
    return metrics


def _ddp_worker(
    rank: int, world_size: int, port: int, expected: dict, all_on_rank0: bool = False
) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        metrics = _ddp_metrics()
        for i, outputs in enumerate(_ddp_batches()):
            owner = 0 if all_on_rank0 else i % world_size
            if owner == rank:
                update_metrics(metrics, outputs, eval_indexes=[0, 1, 2])
        for name, m in metrics.items():
            np.testing.assert_allclose(_value(m), expected[name], rtol=1e-10, err_msg=name)
        dist.barrier()  # neither rank tears gloo down while the other still talks
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("all_on_rank0", [False, True], ids=["split", "rank1_saw_nothing"])
def test_ddp_sync_equals_single_process(all_on_rank0):
    """Also when one rank saw no sample at all (an uneven stream's last validation): its empty
    "cat" states (AUC's float64 (N, C) scores) must still gather with the other rank's."""
    metrics = _ddp_metrics()
    for outputs in _ddp_batches():
        update_metrics(metrics, outputs, eval_indexes=[0, 1, 2])
    expected = {name: _value(m) for name, m in metrics.items()}
    mp.spawn(
        _ddp_worker, args=(2, _free_port(), expected, all_on_rank0), nprocs=2, join=True
    )
