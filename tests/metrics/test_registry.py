"""The name table, get_metrics, update_metrics and metric_value_to_python (``lit_amp.metrics``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torchmetrics
from torchmetrics.classification import MulticlassAccuracy

import lit_amp.metrics as metrics_pkg
from lit_amp.metrics import (
    AUC,
    F1,
    MAE,
    MSE,
    Accuracy,
    ConfusionMatrix,
    Dice,
    Loss,
    MindSporeMetric,
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
from tests.metrics._data import LABELS, LOGITS
from tests.metrics._tester import MetricTester, case_id, cases_of, value

pytestmark = pytest.mark.filterwarnings("ignore:The ``compute`` method of metric")

FAMILY_MODULES = tuple(
    f"tests.metrics.test_{m}" for m in ("classification", "precision_recall", "regression",
                                        "aggregation")
)
# the constructor arguments a name needs, and the family case whose data fits the metric
_NAME_ARGS = {"topk": {"k": 3}, "confusion_matrix": {"num_classes": 4}}
_NAME_CASE = {
    "acc": "accuracy", "accuracy": "accuracy", "precision": "precision", "recall": "recall",
    "F1": "f1", "f1": "f1", "mae": "mae", "mse": "mse", "loss": "loss",
    "top_1_accuracy": "top1-ties", "top_5_accuracy": "top5", "topk": "top3-ties",
    "auc": "auc-binary", "confusion_matrix": "confusion-no_norm", "perplexity": "perplexity",
    "dice": "dice",
}


def _name_cases():
    by_id = {c.id: c for c in cases_of(FAMILY_MODULES)}
    return [
        dataclasses.replace(by_id[_NAME_CASE[n]], id=f"name-{n}",
                            make=lambda n=n: get_metric_fn(n, **_NAME_ARGS.get(n, {})))
        for n in names()
    ]


CASES = _name_cases()


@pytest.mark.parametrize("case", CASES, ids=case_id)
class TestEveryName(MetricTester):
    """Every registered name goes through (a)-(d) of the shared tester."""


def test_every_metric_class_and_name_has_a_tester_case():
    assert set(_NAME_CASE) == set(names())
    classes = {
        obj for name in metrics_pkg.__all__
        if isinstance(obj := getattr(metrics_pkg, name), type)
        and issubclass(obj, MindSporeMetric) and obj is not MindSporeMetric
    }
    covered = {type(c.make()) for c in cases_of(FAMILY_MODULES)}
    assert classes - covered == set()


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
    assert isinstance(get_metric_fn("confusion_matrix", 3), ConfusionMatrix)
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


def test_update_metrics_with_eval_indexes_routes_loss_and_stock_metrics():
    metrics = get_metrics({"loss", "acc"})
    metrics["stock"] = MulticlassAccuracy(num_classes=3, average="micro")
    x, y = torch.tensor(LOGITS), torch.tensor(LABELS)
    # (label, loss, logits): eval_indexes = [loss, prediction, label]
    update_metrics(metrics, (y, torch.tensor(0.25), x), eval_indexes=[1, 2, 0])
    update_metrics(metrics, [y[:2], torch.tensor([0.5, 1.0]), x[:2]], eval_indexes=[1, 2, 0])
    acc = (np.sum(LOGITS.argmax(1) == LABELS) + 2) / 8
    assert value(metrics["loss"]) == pytest.approx((0.25 + 0.75) / 2)
    assert value(metrics["acc"]) == pytest.approx(acc)
    assert value(metrics["stock"]) == pytest.approx(acc)


def test_update_metrics_without_eval_indexes_passes_all_outputs():
    metrics = {"mae": MAE(), "loss_only": Loss()}
    update_metrics({"mae": metrics["mae"]}, (torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0])))
    assert value(metrics["mae"]) == pytest.approx(1.5)
    update_metrics({"loss": metrics["loss_only"]}, torch.tensor([2.0, 4.0]))  # tensor -> 1-tuple
    assert value(metrics["loss_only"]) == pytest.approx(3.0)
    # set_indexes picks the inputs MindSpore-style when eval_indexes is None
    acc = Accuracy().set_indexes([2, 0])
    update_metrics({"acc": acc}, (torch.tensor(LABELS), torch.tensor(1.0), torch.tensor(LOGITS)))
    assert value(acc) == pytest.approx(np.mean(LOGITS.argmax(1) == LABELS))


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
