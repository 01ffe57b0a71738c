"""Accuracy, top-k accuracy, AUC and the confusion matrix, with MindSpore's meaning.

- :class:`Accuracy` counts argmax hits (``'classification'``) or whole-row matches
  (``'multilabel'``), with one-hot/probability labels argmaxed first;
- :class:`TopKCategoricalAccuracy` keeps MindSpore's documented tie rule (equal scores: the
  lower class index is ranked first). ``torchmetrics``' ``MulticlassAccuracy(top_k=k)`` is
  not used because ``torch.topk`` orders ties arbitrarily and torchmetrics counts a tied
  label as a hit, so tied scores would give other values than MindSpore;
- :class:`AUC` scores the stored scores with ``torchmetrics.functional``'s ``binary_auroc``
  / ``multiclass_auroc``;
- :class:`ConfusionMatrix` counts with ``torchmetrics.functional``'s
  ``multiclass_confusion_matrix`` into a fixed ``(C, C)`` state and normalises the sum in
  float64 (MindSpore's dtype; torchmetrics would normalise in float32).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torchmetrics.functional.classification import (
    binary_auroc,
    multiclass_auroc,
    multiclass_confusion_matrix,
)
from torchmetrics.utilities import dim_zero_cat

from lit_amp._validation import check_choice, check_int, check_type
from lit_amp.metrics.base import (
    MindSporeMetric,
    _check_binary_values,
    _check_class_num,
    _check_classification_shape,
    _check_eval_type,
    _check_min_ndim2,
    _class_labels,
    _is_distribution,
    _labels_to_index,
    _no_samples,
)

__all__ = [
    "Accuracy",
    "TopKCategoricalAccuracy",
    "Top1CategoricalAccuracy",
    "Top5CategoricalAccuracy",
    "AUC",
    "ConfusionMatrix",
]


class Accuracy(MindSporeMetric):
    """MindSpore's ``Accuracy``: the fraction of samples whose predicted class is the label.

    ``'classification'``: ``argmax(y_pred, 1) == y`` for ``y_pred`` of shape ``(N, C, ...)``
    and integer labels ``y`` of shape ``(N, ...)``; a one-hot (or probability) label shaped
    like ``y_pred`` is argmaxed first. ``'multilabel'``: ``y_pred`` and ``y`` hold 0/1 and a
    sample counts only when its whole row matches. The class count is fixed at the first
    update.

    Args:
        eval_type: ``'classification'`` (default) or ``'multilabel'``.
        **kwargs: torchmetrics ``Metric`` options (``sync_on_compute``, ``process_group``, ...).

    Raises:
        TypeError: ``eval_type`` is not one of the two.

    Example:
        >>> import torch
        >>> m = Accuracy()
        >>> m.update(torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]), torch.tensor([1, 0, 1]))
        >>> round(float(m.compute()), 4)
        0.6667
    """

    higher_is_better: ClassVar[bool] = True

    def __init__(self, eval_type: str = "classification", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.eval_type = _check_eval_type(type(self).__name__, eval_type)
        self._class_num = 0
        self.add_state("correct_num", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total_num", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def reset(self) -> None:
        """Clear the counts and the class count fixed at the first update."""
        super().reset()
        self._class_num = 0

    def _fix_class_num(self, y_pred: torch.Tensor) -> None:
        owner = type(self).__name__
        _check_min_ndim2(owner, y_pred)
        _check_class_num(owner, y_pred, self._class_num)
        self._class_num = int(y_pred.shape[1])

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(y_pred, y)``."""
        owner = type(self).__name__
        y_pred, y = self._inputs(inputs)
        if self.eval_type == "classification":
            y = _labels_to_index(y_pred, y)
            _check_classification_shape(owner, y_pred, y)
            self._fix_class_num(y_pred)
            result = (y_pred.argmax(dim=1) == y).reshape(-1)
        else:
            if y_pred.shape != y.shape:
                raise ValueError(
                    f"For '{owner}.update', in the multilabel case y_pred (predicted value) and y "
                    f"(true value) must have the same shape, but got {tuple(y_pred.shape)} and "
                    f"{tuple(y.shape)}."
                )
            _check_binary_values(owner, y_pred, y)
            self._fix_class_num(y_pred)
            c = self._class_num
            rows_pred = y_pred.transpose(1, y_pred.ndim - 1).reshape(-1, c)
            rows_true = y.transpose(1, y.ndim - 1).reshape(-1, c)
            result = (rows_pred == rows_true).all(dim=1)
        self._add("correct_num", result.sum())
        self._add("total_num", torch.tensor(result.numel()))

    def compute(self) -> torch.Tensor:
        """``correct / total`` as a float64 0-d tensor.

        Raises:
            RuntimeError: no samples were seen.
        """
        if int(self.total_num) == 0:
            raise _no_samples(type(self).__name__)
        return self.correct_num.double() / self.total_num.double()


def _is_other_width_one_hot(y_pred: torch.Tensor, y: torch.Tensor) -> bool:
    """True for an exact one-hot ``(N, C')`` label, ``C' >= 2``, beside ``(N, C)`` scores, C' != C.

    MindSpore's ``_check_onehot_data`` (0/1 values, one 1 per row) with the width left free; a
    ``(N, 1)`` label stays a column of class indices.
    """
    if y.ndim != 2 or y_pred.ndim != 2 or y.shape[0] != y_pred.shape[0]:
        return False
    if y.shape[1] < 2 or y.shape[1] == y_pred.shape[1]:
        return False
    return bool(((y == 0) | (y == 1)).all()) and bool((y.sum(dim=1) == 1).all())


class TopKCategoricalAccuracy(MindSporeMetric):
    """MindSpore's ``TopKCategoricalAccuracy``: the label is among the ``k`` highest scores.

    ``y_pred`` has shape ``(N, C)``; ``y`` holds class indices ``(N,)`` or is one-hot. Ties go
    to the lower class index (a stable sort), as MindSpore documents. As in MindSpore 2.10, a
    one-hot ``y`` ``(N, C')`` of another width (``C' >= 2``) is argmaxed too: a narrower one
    names some of the classes, and a row whose class is ``>= C`` counts as a miss.

    Args:
        k: how many top classes count (an int >= 1).
        **kwargs: torchmetrics ``Metric`` options.

    Raises:
        TypeError: ``k`` is not an int.
        ValueError: ``k`` < 1.

    Example:
        >>> import torch
        >>> x = torch.tensor([[0.2, 0.5, 0.3, 0.6, 0.2], [0.1, 0.35, 0.5, 0.2, 0.0],
        ...                   [0.9, 0.6, 0.2, 0.01, 0.3]])
        >>> m = TopKCategoricalAccuracy(3)
        >>> m.update(x, torch.tensor([2, 0, 1]))
        >>> round(float(m.compute()), 4)
        0.6667
    """

    higher_is_better: ClassVar[bool] = True

    def __init__(self, k: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.k = check_int(type(self).__name__, "k", k, minimum=1)
        self.add_state("correct_num", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("samples_num", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(y_pred, y)``."""
        y_pred, y = self._inputs(inputs)
        if y_pred.ndim != 2:
            raise ValueError(
                f"For '{type(self).__name__}.update', y_pred (predicted value) must have shape "
                f"(N, C), but got shape {tuple(y_pred.shape)}."
            )
        if _is_other_width_one_hot(y_pred, y):
            y = y.long().argmax(dim=1)  # MindSpore argmaxes a one-hot label of any width
        y = _labels_to_index(y_pred, y).reshape(-1, 1)
        if y.shape[0] != y_pred.shape[0]:
            raise ValueError(
                f"For '{type(self).__name__}.update', y (true value) must have one class index "
                f"per row of y_pred, but got {y.shape[0]} labels for {y_pred.shape[0]} rows."
            )
        order = torch.sort(y_pred, dim=1, descending=True, stable=True).indices
        top = order[:, : self.k]
        correct = (top == y.to(top.dtype)).any(dim=1)
        self._add("correct_num", correct.sum())
        self._add("samples_num", torch.tensor(y.shape[0]))

    def compute(self) -> torch.Tensor:
        """``correct / samples`` as a float64 0-d tensor.

        Raises:
            RuntimeError: no samples were seen.
        """
        if int(self.samples_num) == 0:
            raise _no_samples(type(self).__name__)
        return self.correct_num.double() / self.samples_num.double()


class Top1CategoricalAccuracy(TopKCategoricalAccuracy):
    """``TopKCategoricalAccuracy(1)`` (MindSpore's ``'top_1_accuracy'``).

    Example:
        >>> import torch
        >>> m = Top1CategoricalAccuracy()
        >>> m.update(torch.tensor([[0.1, 0.9], [0.6, 0.4]]), torch.tensor([1, 1]))
        >>> float(m.compute())
        0.5
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(1, **kwargs)


class Top5CategoricalAccuracy(TopKCategoricalAccuracy):
    """``TopKCategoricalAccuracy(5)`` (MindSpore's ``'top_5_accuracy'``).

    Example:
        >>> import torch
        >>> m = Top5CategoricalAccuracy()
        >>> m.update(torch.arange(12.0).reshape(2, 6), torch.tensor([0, 5]))
        >>> float(m.compute())
        0.5
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(5, **kwargs)


class AUC(MindSporeMetric):
    """ROC AUC from scores and labels: what MindSpore's ``'auc'`` name was meant to give.

    - **binary** when ``y_pred`` is 1-D or ``(N, 1)`` (a score for the positive class; logits
      are passed through a sigmoid), or ``(N, 2)`` (column 1 of the probabilities; logits are
      softmaxed first); labels are 0/1;
    - **multiclass** one-vs-rest, macro-averaged, when ``y_pred`` is ``(N, C)`` with ``C > 2``
      (rows that are not probabilities are softmaxed); labels are class indices or one-hot.

    The mode and class count are fixed at the first update. Scores and labels are kept
    (``dist_reduce_fx="cat"``) and scored by ``torchmetrics.functional``'s ``binary_auroc``
    / ``multiclass_auroc``.

    Args:
        **kwargs: torchmetrics ``Metric`` options.

    Example:
        >>> import torch
        >>> m = AUC()
        >>> m.update(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
        >>> float(m.compute())
        0.75
    """

    higher_is_better: ClassVar[bool] = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._num_columns = 0  # 1 for binary, C for multiclass; fixed at the first update
        self.add_state("preds", [], dist_reduce_fx="cat")
        self.add_state("target", [], dist_reduce_fx="cat")

    def reset(self) -> None:
        """Clear the stored scores and the mode fixed at the first update."""
        super().reset()
        self._num_columns = 0

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(y_pred, y)``."""
        owner = type(self).__name__
        y_pred, y = self._inputs(inputs)
        y_pred = y_pred.double()
        if y_pred.ndim == 2 and y_pred.shape[1] == 1:
            y_pred = y_pred[:, 0]
        if y_pred.ndim == 2 and y_pred.shape[1] == 2:
            y = _labels_to_index(y_pred, y)
            if not _is_distribution(y_pred):
                y_pred = y_pred.softmax(dim=1)
            y_pred = y_pred[:, 1]
        if y_pred.ndim == 1:
            columns = 1
            y = y.reshape(-1)
            if not bool(((y == 0) | (y == 1)).all()):
                raise ValueError(
                    f"For '{owner}.update', binary AUC needs labels y (true value) of 0 or 1."
                )
            if y_pred.numel() and not bool(((y_pred >= 0) & (y_pred <= 1)).all()):
                y_pred = y_pred.sigmoid()
        elif y_pred.ndim == 2:
            columns = int(y_pred.shape[1])
            y = _class_labels(owner, _labels_to_index(y_pred, y), columns).reshape(-1)
            if not _is_distribution(y_pred):
                y_pred = y_pred.softmax(dim=1)
        else:
            raise ValueError(
                f"For '{owner}.update', y_pred (predicted value) must have shape (N,), (N, 1), "
                f"(N, 2) or (N, C), but got shape {tuple(y_pred.shape)}."
            )
        if y.shape[0] != y_pred.shape[0]:
            raise ValueError(
                f"For '{owner}.update', y (true value) must have one label per score, but got "
                f"{y.shape[0]} labels for {y_pred.shape[0]} scores."
            )
        if self._num_columns == 0:
            self._num_columns = columns
        elif columns != self._num_columns:
            raise ValueError(
                f"For '{owner}.update', the score layout does not match earlier batches: "
                f"{'binary' if self._num_columns == 1 else f'{self._num_columns} classes'} "
                f"before, {'binary' if columns == 1 else f'{columns} classes'} now."
            )
        self.preds.append(y_pred.to(self.device))
        self.target.append(y.long().to(self.device))

    def compute(self) -> torch.Tensor:
        """ROC AUC (binary, or one-vs-rest macro for multiclass) as a 0-d tensor.

        Raises:
            RuntimeError: no samples were seen.
        """
        if isinstance(self.preds, list) and not self.preds:
            raise _no_samples(type(self).__name__)
        preds, target = dim_zero_cat(self.preds), dim_zero_cat(self.target)
        if preds.numel() == 0:
            raise _no_samples(type(self).__name__)
        if preds.ndim == 1:
            return binary_auroc(preds, target)
        return multiclass_auroc(preds, target, num_classes=preds.shape[1], average="macro")


class ConfusionMatrix(MindSporeMetric):
    """MindSpore's ``ConfusionMatrix``: rows are true classes, columns predicted classes.

    ``y_pred`` of shape ``(N, C, ...)`` is argmaxed on dim 1; a float ``y_pred`` shaped like
    ``y`` is thresholded (``>= threshold``); integer ``y_pred`` is taken as class indices.

    Args:
        num_classes: the number of classes (required).
        normalize: ``'no_norm'`` (counts), ``'target'`` (rows sum to 1), ``'prediction'``
            (columns sum to 1) or ``'all'``; empty rows/columns give 0.
        threshold: the threshold for same-shape float predictions.
        **kwargs: torchmetrics ``Metric`` options.

    Raises:
        TypeError: ``num_classes`` is not an int or ``threshold`` not a float.
        ValueError: ``normalize`` is not one of the four, or ``num_classes`` < 1.

    Example:
        >>> import torch
        >>> m = ConfusionMatrix(num_classes=2)
        >>> m.update(torch.tensor([1, 0, 1, 0]), torch.tensor([1, 0, 0, 1]))
        >>> m.compute().tolist()
        [[1.0, 1.0], [1.0, 1.0]]
    """

    _NORMALIZE = ("no_norm", "target", "prediction", "all")

    def __init__(
        self,
        num_classes: int,
        normalize: str = "no_norm",
        threshold: float = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        owner = type(self).__name__
        self.num_classes = check_int(owner, "num_classes", num_classes, minimum=1)
        self.normalize = check_choice(owner, "normalize", normalize, self._NORMALIZE)
        self.threshold = check_type(owner, "threshold", threshold, float, "a float")
        self.add_state(
            "confmat", torch.zeros(num_classes, num_classes, dtype=torch.long), dist_reduce_fx="sum"
        )

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(y_pred, y)``."""
        owner = type(self).__name__
        y_pred, y = self._inputs(inputs)
        if y_pred.ndim == y.ndim + 1:
            y_pred = y_pred.argmax(dim=1)
        elif y_pred.ndim == y.ndim:
            if y_pred.is_floating_point():
                y_pred = (y_pred >= self.threshold).long()
        else:
            raise ValueError(
                f"For '{owner}.update', y_pred (predicted value) must have the same dimension as "
                f"y (true value) or one more, but got y_pred ndim {y_pred.ndim} and y ndim "
                f"{y.ndim}."
            )
        c = self.num_classes
        y = _class_labels(owner, y, c).reshape(-1)
        y_pred = _class_labels(owner, y_pred, c).reshape(-1)
        if y.numel() != y_pred.numel():
            raise ValueError(
                f"For '{owner}.update', y_pred (predicted value) and y (true value) must give one "
                f"prediction per label, but got {y_pred.numel()} and {y.numel()}."
            )
        counts = multiclass_confusion_matrix(y_pred, y, num_classes=c, validate_args=False)
        self._add("confmat", counts)

    def compute(self) -> torch.Tensor:
        """The (optionally normalised) confusion matrix, float64 ``(C, C)``.

        Raises:
            RuntimeError: no samples were seen.
        """
        if int(self.confmat.sum()) == 0:
            raise _no_samples(type(self).__name__)
        cm = self.confmat.double()
        if self.normalize == "target":
            cm = cm / cm.sum(dim=1, keepdim=True)
        elif self.normalize == "prediction":
            cm = cm / cm.sum(dim=0, keepdim=True)
        elif self.normalize == "all":
            cm = cm / cm.sum()
        return torch.nan_to_num(cm, nan=0.0)
