"""MindSpore's metric names: the name table, ``get_metrics`` and ``update_metrics``.

``Model(metrics={"acc", "loss"})`` takes MindSpore's metric names: :func:`get_metrics` turns
them into metric objects and :func:`update_metrics` feeds them the eval network's outputs as
MindSpore's ``Model._update_metrics`` does (docs/semantics.md §1.4, §1.8). The metric classes
live by family, as in ``torchmetrics``: :mod:`~lit_amp.metrics.base`,
:mod:`~lit_amp.metrics.classification`, :mod:`~lit_amp.metrics.precision_recall`,
:mod:`~lit_amp.metrics.regression` and :mod:`~lit_amp.metrics.aggregation`. Names that differ
from MindSpore's table are listed in docs/differences.md, "Metrics".

Example:
    >>> import torch
    >>> from lit_amp.metrics.base import metric_value_to_python
    >>> metrics = get_metrics({"acc", "loss"})
    >>> outputs = (torch.tensor(0.5), torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
    >>> update_metrics(metrics, outputs, eval_indexes=[0, 1, 2])
    >>> {name: metric_value_to_python(m.compute()) for name, m in sorted(metrics.items())}
    {'acc': 0.5, 'loss': 0.5}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torchmetrics import Metric

from lit_amp._validation import check_str, value_error
from lit_amp.metrics.aggregation import Dice, Loss, Perplexity
from lit_amp.metrics.classification import (
    AUC,
    Accuracy,
    ConfusionMatrix,
    Top1CategoricalAccuracy,
    Top5CategoricalAccuracy,
    TopKCategoricalAccuracy,
)
from lit_amp.metrics.precision_recall import F1, Precision, Recall
from lit_amp.metrics.regression import MAE, MSE

__all__ = ["names", "get_metric_fn", "get_metrics", "update_metrics"]

_FACTORY: dict[str, type[Metric]] = {
    "accuracy": Accuracy,
    "acc": Accuracy,
    "precision": Precision,
    "recall": Recall,
    "F1": F1,
    "f1": F1,  # MindSpore registers 'F1' only
    "mae": MAE,
    "mse": MSE,
    "loss": Loss,
    "top_1_accuracy": Top1CategoricalAccuracy,
    "top_5_accuracy": Top5CategoricalAccuracy,
    "topk": TopKCategoricalAccuracy,
    "auc": AUC,  # MindSpore maps it to a plain function that fails in a set
    "confusion_matrix": ConfusionMatrix,
    "perplexity": Perplexity,
    "dice": Dice,
}

# names whose class needs a constructor argument: the argument and an example value
_REQUIRED_ARG: dict[str, str] = {"topk": "k=3", "confusion_matrix": "num_classes=10"}

# MindSpore names that lit_amp does not provide
_UNSUPPORTED: tuple[str, ...] = (
    "roc",
    "bleu_score",
    "cosine_similarity",
    "occlusion_sensitivity",
    "hausdorff_distance",
    "mean_surface_distance",
    "root_mean_square_distance",
    "confusion_matrix_metric",
)


def names() -> list[str]:
    """The metric names :func:`get_metric_fn` knows, sorted (MindSpore's ``names()``).

    Returns:
        The names; ``'topk'`` and ``'confusion_matrix'`` need a constructor argument.

    Example:
        >>> "F1" in names() and "f1" in names() and "auc" in names()
        True
    """
    return sorted(_FACTORY)


def get_metric_fn(name: str, *args: Any, **kwargs: Any) -> Metric:
    """A new metric instance for a MindSpore metric name.

    Args:
        name: one of :func:`names` (``'acc'``, ``'F1'``, ``'loss'``, ...).
        *args: constructor arguments (``get_metric_fn('topk', 3)``).
        **kwargs: constructor keyword arguments (``eval_type='multilabel'``, ...).

    Returns:
        A fresh :class:`torchmetrics.Metric` on each call.

    Raises:
        TypeError: ``name`` is not a str, or the metric needs an argument that was not given
            (``'topk'``, ``'confusion_matrix'``).
        KeyError: ``name`` is unknown or a MindSpore metric lit_amp does not provide.

    Example:
        >>> type(get_metric_fn("acc")).__name__
        'Accuracy'
        >>> get_metric_fn("topk", k=3).k
        3
    """
    check_str("get_metric_fn", "name", name)
    if name not in _FACTORY:
        allowed = ", ".join(repr(n) for n in names())
        if name in _UNSUPPORTED:
            raise KeyError(
                f"For 'get_metric_fn', the MindSpore metric {name!r} is not provided by lit_amp; "
                f"supported names: {allowed}. Pass a torchmetrics Metric in a dict instead, "
                f"e.g. metrics={{{name!r}: torchmetrics.<SomeMetric>(...)}}."
            )
        raise KeyError(
            f"For 'get_metric_fn', unknown metric name {name!r}; supported names: {allowed}."
        )
    if name in _REQUIRED_ARG and not args and not kwargs:
        cls = _FACTORY[name]
        raise TypeError(
            f"For 'get_metric_fn', the metric {name!r} ({cls.__name__}) needs "
            f"'{_REQUIRED_ARG[name].split('=')[0]}', so it cannot be used by name alone; pass an "
            f"instance in a dict: metrics={{{name!r}: {cls.__name__}({_REQUIRED_ARG[name]})}}."
        )
    return _FACTORY[name](*args, **kwargs)


def get_metrics(metrics: Any) -> dict[str, Metric] | None:
    """Metric objects from ``Model``'s ``metrics`` argument (MindSpore's ``get_metrics``).

    Args:
        metrics: None; a set of names (``{"acc", "loss"}``); or a dict (or ``ModuleDict``)
            name -> a :class:`torchmetrics.Metric` instance (any torchmetrics metric works).

    Returns:
        None for None, else a new dict name -> metric (names of a set are sorted); the metric
        objects of a dict are used as given.

    Raises:
        TypeError: ``metrics`` is another type (a list, tuple, str, ...), a dict key is not a
            str, a dict value is not a Metric, or a set holds a non-str.
        KeyError: a name is unknown (see :func:`get_metric_fn`).

    Example:
        >>> sorted(get_metrics({"acc", "F1"}))
        ['F1', 'acc']
        >>> get_metrics(None) is None
        True
    """
    if metrics is None:
        return None
    if isinstance(metrics, (Mapping, torch.nn.ModuleDict)):
        out: dict[str, Metric] = {}
        for name, metric in metrics.items():
            if not isinstance(name, str):
                raise TypeError(
                    "For 'get_metrics', the keys of 'metrics' must be str, but got "
                    f"{type(name).__name__} ({name!r})."
                )
            if not isinstance(metric, Metric):
                raise TypeError(
                    f"For 'get_metrics', the value of 'metrics[{name!r}]' must be a "
                    f"torchmetrics.Metric instance, but got {type(metric).__name__}."
                )
            out[name] = metric
        return out
    if isinstance(metrics, (set, frozenset)):
        for name in metrics:
            if not isinstance(name, str):
                raise TypeError(
                    "For 'get_metrics', a set 'metrics' must hold metric names (str), but got "
                    f"{type(name).__name__} ({name!r})."
                )
        return {name: get_metric_fn(name) for name in sorted(metrics)}
    raise TypeError(
        "For 'get_metrics', 'metrics' must be a set of metric names or a dict name -> Metric, "
        f"but got {type(metrics).__name__}."
    )


def update_metrics(
    metrics: Mapping[str, Metric],
    outputs: Any,
    eval_indexes: Sequence[int] | None = None,
) -> None:
    """Feed one eval step's outputs to the metrics (MindSpore's ``Model._update_metrics``).

    A tensor is wrapped as a 1-tuple. With ``eval_indexes = [i_loss, i_pred, i_label]``, loss
    metrics (``is_loss_metric`` True, e.g. :class:`Loss`) get ``update(outputs[i_loss])`` and
    every other metric -- including stock torchmetrics metrics -- gets
    ``update(outputs[i_pred], outputs[i_label])``. Without ``eval_indexes`` every metric gets
    ``update(*outputs)``.

    Args:
        metrics: name -> metric, as returned by :func:`get_metrics` (a ``ModuleDict`` works).
        outputs: the eval network's output: a tensor, or a tuple/list of them.
        eval_indexes: three positions ``[loss, prediction, label]`` in ``outputs``, or None.

    Raises:
        ValueError: ``outputs`` is not a tensor, tuple or list; ``eval_indexes`` does not hold
            three ints; or ``eval_indexes`` is set and ``outputs`` has fewer than 3 items.

    Example:
        >>> import torch
        >>> ms = {"mae": MAE()}
        >>> update_metrics(ms, (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0])))
        >>> float(ms["mae"].compute())
        1.0
    """
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    if not isinstance(outputs, (tuple, list)):
        raise ValueError(
            "For 'update_metrics', the argument 'outputs' must be a tensor, tuple or list, "
            f"but got {type(outputs).__name__}."
        )
    if eval_indexes is not None:
        if (
            isinstance(eval_indexes, (str, bytes))
            or not isinstance(eval_indexes, Sequence)
            or len(eval_indexes) != 3
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in eval_indexes)
        ):
            allowed = "None or a list of 3 ints [loss, prediction, label]"
            raise value_error("update_metrics", "eval_indexes", allowed, eval_indexes)
        if len(outputs) < 3:
            raise ValueError(
                "For 'update_metrics', the length of 'outputs' must be greater than or equal to 3 "
                f"when 'eval_indexes' is set, but got {len(outputs)}. When the eval network has "
                "multiple outputs, set 'eval_indexes' to the positions of [loss, prediction, "
                "label]."
            )
    for metric in metrics.values():
        if eval_indexes is None:
            metric.update(*outputs)
        elif getattr(metric, "is_loss_metric", False):
            metric.update(outputs[eval_indexes[0]])
        else:
            metric.update(outputs[eval_indexes[1]], outputs[eval_indexes[2]])
