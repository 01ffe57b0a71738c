"""MindSpore's metrics on ``torchmetrics``: one module per family and the name table.

Names are imported lazily (PEP 562); :mod:`~lit_amp.metrics.registry` maps MindSpore's
metric names (``Model(metrics={"acc", "loss"})``) onto the classes.

Example:
    >>> from lit_amp.metrics import get_metric_fn
    >>> type(get_metric_fn("acc")).__name__
    'Accuracy'
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "MindSporeMetric": "lit_amp.metrics.base",
    "metric_value_to_python": "lit_amp.metrics.base",
    "Accuracy": "lit_amp.metrics.classification",
    "TopKCategoricalAccuracy": "lit_amp.metrics.classification",
    "Top1CategoricalAccuracy": "lit_amp.metrics.classification",
    "Top5CategoricalAccuracy": "lit_amp.metrics.classification",
    "AUC": "lit_amp.metrics.classification",
    "ConfusionMatrix": "lit_amp.metrics.classification",
    "Precision": "lit_amp.metrics.precision_recall",
    "Recall": "lit_amp.metrics.precision_recall",
    "Fbeta": "lit_amp.metrics.precision_recall",
    "F1": "lit_amp.metrics.precision_recall",
    "MAE": "lit_amp.metrics.regression",
    "MSE": "lit_amp.metrics.regression",
    "Loss": "lit_amp.metrics.aggregation",
    "Perplexity": "lit_amp.metrics.aggregation",
    "Dice": "lit_amp.metrics.aggregation",
    "names": "lit_amp.metrics.registry",
    "get_metric_fn": "lit_amp.metrics.registry",
    "get_metrics": "lit_amp.metrics.registry",
    "update_metrics": "lit_amp.metrics.registry",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
