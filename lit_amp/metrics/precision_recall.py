"""Precision, Recall, Fbeta and F1 with MindSpore's meaning: per-class values, MindSpore's eps.

The counts come from ``torchmetrics.functional.classification.multiclass_stat_scores``; what
stays here is MindSpore's arithmetic on top of them:

- the value is a **per-class** float64 tensor (MindSpore's ``eval(average=False)``), e.g.
  ``TP / (predicted_positive + eps)`` with ``eps = sys.float_info.min``, so a class never
  predicted (or never seen) gets 0 instead of NaN;
- the class count is fixed by the first update unless ``num_classes`` is given;
- ``eval_type='multilabel'`` Precision/Recall are MindSpore's **per-sample** values.

Because the class count may be unknown until the first update, the per-class counts are kept
as a ``"cat"`` list of count rows ``(k, 3, C)`` (true positives, predicted positives, actual
positives) that ``update`` folds into one row and ``compute`` sums: a rank that saw nothing
holds an empty list rather than a state of another shape, and torchmetrics' gather lines it
up (see :meth:`lit_amp.metrics.base.MindSporeMetric._sync_dist`).
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar

import numpy as np
import torch
from torchmetrics.functional.classification import multiclass_stat_scores
from torchmetrics.utilities import dim_zero_cat

from lit_amp._validation import check_bool, check_int, check_number
from lit_amp.metrics.base import (
    MindSporeMetric,
    _check_binary_values,
    _check_class_num,
    _check_classification_shape,
    _check_eval_type,
    _check_min_ndim2,
    _class_labels,
    _labels_to_index,
    _no_samples,
)

__all__ = ["Precision", "Recall", "Fbeta", "F1"]

_EPS = sys.float_info.min  # MindSpore's eps for precision / recall / fbeta
_TP, _PRED_POS, _ACTUAL_POS = 0, 1, 2  # the rows of a class-count block


class _PerClassBase(MindSporeMetric):
    """Per-class counts for single-label classification (the shared half of P/R/Fbeta).

    Args:
        num_classes: optional class count (default: fixed by the first update).
        **kwargs: torchmetrics ``Metric`` options.
    """

    higher_is_better: ClassVar[bool] = True

    def __init__(self, num_classes: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_classes = check_int(
            type(self).__name__, "num_classes", num_classes, minimum=1, allow_none=True
        )
        self.add_state("class_counts", [], dist_reduce_fx="cat")

    @property
    def _class_num(self) -> int:
        """``num_classes``, else the class count fixed by the first update (0: none yet)."""
        if self.num_classes:
            return self.num_classes
        return int(self.class_counts[0].shape[-1]) if self.class_counts else 0

    def _counts(self, row: int) -> torch.Tensor:
        """One row of the summed counts, shape ``(C,)`` (a 0-d zero before any class count)."""
        if isinstance(self.class_counts, list) and not self.class_counts:
            c = self._class_num
            return torch.zeros(c, dtype=torch.long) if c else torch.tensor(0)
        return dim_zero_cat(self.class_counts).sum(dim=0)[row]

    @property
    def true_positives(self) -> torch.Tensor:
        """True positives per class."""
        return self._counts(_TP)

    @property
    def positives(self) -> torch.Tensor:
        """Predicted positives per class (TP + FP)."""
        return self._counts(_PRED_POS)

    @property
    def actual_positives(self) -> torch.Tensor:
        """Actual positives per class (TP + FN, the support)."""
        return self._counts(_ACTUAL_POS)

    def _update_counts(self, y_pred: torch.Tensor, y: torch.Tensor) -> None:
        """Add one batch's ``(tp, predicted_pos, actual_pos)`` per class to the count row."""
        owner = type(self).__name__
        y = _labels_to_index(y_pred, y)
        _check_min_ndim2(owner, y_pred)
        _check_classification_shape(owner, y_pred, y)
        _check_class_num(owner, y_pred, self._class_num)
        c = int(y_pred.shape[1])
        y = _class_labels(owner, y, c).reshape(-1)
        pred = y_pred.argmax(dim=1).reshape(-1)  # ties: the lower class index (argmax's rule)
        stats = multiclass_stat_scores(pred, y, num_classes=c, average=None, validate_args=False)
        tp, fp, support = stats[:, 0], stats[:, 1], stats[:, 4]
        block = torch.stack([tp, tp + fp, support]).long().unsqueeze(0).to(self.device)
        if self.class_counts:  # keep one running block: memory stays O(C)
            block = block + dim_zero_cat(self.class_counts).sum(dim=0, keepdim=True)
        self.class_counts = [block]

    def _checked_counts(self, row: int) -> torch.Tensor:
        counts = self._counts(row)
        if int(counts.sum()) == 0:
            raise _no_samples(type(self).__name__)
        return counts.double()


class _MultilabelMixin:
    """MindSpore's multilabel Precision/Recall: one value per sample, kept as ``"cat"`` states."""

    def _add_multilabel_states(self: Any) -> None:
        self.add_state("sample_true_positives", [], dist_reduce_fx="cat")
        self.add_state("sample_positives", [], dist_reduce_fx="cat")

    def _update_multilabel(
        self: Any, y_pred: torch.Tensor, y: torch.Tensor, use_pred: bool
    ) -> None:
        owner = type(self).__name__
        if y_pred.shape != y.shape or y_pred.ndim < 2:
            raise ValueError(
                f"For '{owner}.update', in the multilabel case y_pred (predicted value) and y "
                f"(true value) must have the same shape (N, C, ...), but got "
                f"{tuple(y_pred.shape)} and {tuple(y.shape)}."
            )
        _check_binary_values(owner, y_pred, y)
        c = int(y_pred.shape[1])
        pred = y_pred.transpose(0, 1).reshape(c, -1).double()
        true = y.transpose(0, 1).reshape(c, -1).double()
        self.sample_true_positives.append((pred * true).sum(dim=0).to(self.device))
        self.sample_positives.append((pred if use_pred else true).sum(dim=0).to(self.device))

    def _compute_multilabel(self: Any) -> torch.Tensor:
        owner = type(self).__name__
        if isinstance(self.sample_true_positives, list) and not self.sample_true_positives:
            raise _no_samples(owner)
        tp, pos = dim_zero_cat(self.sample_true_positives), dim_zero_cat(self.sample_positives)
        if tp.numel() == 0:
            raise _no_samples(owner)
        return tp.double() / (pos.double() + _EPS)


class _PrecisionRecall(_MultilabelMixin, _PerClassBase):
    """Precision and Recall: ``TP / (positives + eps)``, the positives chosen by ``_use_pred``."""

    _use_pred: ClassVar[bool] = True  # divide by predicted (True) or actual (False) positives

    def __init__(
        self, eval_type: str = "classification", num_classes: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        self.eval_type = _check_eval_type(type(self).__name__, eval_type)
        if self.eval_type == "multilabel":
            self._add_multilabel_states()

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(y_pred, y)``."""
        y_pred, y = self._inputs(inputs)
        if self.eval_type == "multilabel":
            self._update_multilabel(y_pred, y, use_pred=self._use_pred)
        else:
            self._update_counts(y_pred, y)

    def compute(self) -> torch.Tensor:
        """Per-class (or, for multilabel, per-sample) values, float64.

        Raises:
            RuntimeError: no samples were seen.
        """
        if self.eval_type == "multilabel":
            return self._compute_multilabel()
        positives = self._checked_counts(_PRED_POS if self._use_pred else _ACTUAL_POS)
        return self.true_positives.double() / (positives + _EPS)

    def eval(self, average: bool = False) -> Any:
        """MindSpore's ``eval(average=False)``: per-class values, or their mean with ``average``.

        Args:
            average: return the mean over classes (a ``numpy.float64``) instead of the
                per-class numpy array.

        Raises:
            TypeError: ``average`` is not a bool.
            RuntimeError: no sample was seen since the last ``clear``.

        Example:
            >>> import torch
            >>> m = Recall()
            >>> y_pred = torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]])
            >>> m.update(y_pred, torch.tensor([1, 0, 1]))
            >>> m.eval(), m.eval(average=True)
            (array([1. , 0.5]), np.float64(0.75))
        """
        check_bool(type(self).__name__ + ".eval", "average", average)
        value = super().eval()
        return np.float64(np.mean(value)) if average else value


class Precision(_PrecisionRecall):
    """MindSpore's ``Precision``: per-class ``TP / (predicted_positive + eps)``.

    ``compute()`` returns a float64 tensor with one value per class (MindSpore's
    ``eval(average=False)``, which is what ``Model.eval`` reports); a class never predicted
    gets 0. ``eps`` is ``sys.float_info.min``. With ``eval_type='multilabel'`` (0/1 inputs of
    the same shape) the value is MindSpore's: one precision per sample, concatenated.

    Args:
        eval_type: ``'classification'`` (default) or ``'multilabel'``.
        num_classes: optional class count (default: fixed by the first update).
        **kwargs: torchmetrics ``Metric`` options.

    Raises:
        TypeError: ``eval_type`` is not one of the two, or ``num_classes`` not an int.
        ValueError: ``num_classes`` < 1.

    Example:
        >>> import torch
        >>> m = Precision()
        >>> m.update(torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]), torch.tensor([1, 0, 1]))
        >>> m.compute().tolist()
        [0.5, 1.0]
    """


class Recall(_PrecisionRecall):
    """MindSpore's ``Recall``: per-class ``TP / (actual_positive + eps)``.

    ``compute()`` returns a float64 tensor with one value per class; a class absent from the
    labels gets 0. With ``eval_type='multilabel'`` the value is one recall per sample.

    Args:
        eval_type: ``'classification'`` (default) or ``'multilabel'``.
        num_classes: optional class count (default: fixed by the first update).
        **kwargs: torchmetrics ``Metric`` options.

    Raises:
        TypeError: ``eval_type`` is not one of the two, or ``num_classes`` not an int.
        ValueError: ``num_classes`` < 1.

    Example:
        >>> import torch
        >>> m = Recall()
        >>> m.update(torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]), torch.tensor([1, 0, 1]))
        >>> m.compute().tolist()
        [1.0, 0.5]
    """

    _use_pred = False


class Fbeta(_PerClassBase):
    """MindSpore's ``Fbeta``: per-class ``(1+β²)·TP / (β²·actual_pos + pred_pos + eps)``.

    ``compute()`` returns a float64 tensor with one value per class.

    Args:
        beta: the weight of recall (a finite number > 0).
        num_classes: optional class count (default: fixed by the first update).
        **kwargs: torchmetrics ``Metric`` options.

    Raises:
        TypeError: ``beta`` is not a number.
        ValueError: ``beta`` <= 0 or not finite.

    Example:
        >>> import torch
        >>> m = Fbeta(1.0)
        >>> m.update(torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]), torch.tensor([1, 0, 1]))
        >>> [round(v, 4) for v in m.compute().tolist()]
        [0.6667, 0.6667]
    """

    def __init__(self, beta: float, num_classes: int | None = None, **kwargs: Any) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        self.beta = check_number(type(self).__name__, "beta", beta, minimum=0.0, strict=True)

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(y_pred, y)``."""
        self._update_counts(*self._inputs(inputs))

    def eval(self, average: bool = False) -> Any:
        """MindSpore's ``eval(average=False)``: per-class F-beta, or their mean with ``average``.

        Args:
            average: return the mean over classes (a ``numpy.float64``) instead of the
                per-class numpy array.

        Raises:
            TypeError: ``average`` is not a bool (MindSpore 2.10 raises TypeError too).
            RuntimeError: no sample was seen since the last ``clear``.

        Example:
            >>> import torch
            >>> m = Fbeta(1)
            >>> y_pred = torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]])
            >>> m.update(y_pred, torch.tensor([1, 0, 1]))
            >>> m.eval(), round(float(m.eval(average=True)), 4)
            (array([0.66666667, 0.66666667]), 0.6667)
        """
        check_bool(type(self).__name__ + ".eval", "average", average)
        value = super().eval()
        return np.float64(np.mean(value)) if average else value

    def compute(self) -> torch.Tensor:
        """Per-class F-beta, float64.

        Raises:
            RuntimeError: no samples were seen.
        """
        positives = self._checked_counts(_PRED_POS)
        b2 = self.beta**2
        tp, actual = self.true_positives.double(), self.actual_positives.double()
        return (1.0 + b2) * tp / (b2 * actual + positives + _EPS)


class F1(Fbeta):
    """``Fbeta(1.0)`` (MindSpore's ``'F1'``; ``'f1'`` is accepted too).

    Args:
        num_classes: optional class count (default: fixed by the first update).
        **kwargs: torchmetrics ``Metric`` options.

    Example:
        >>> import torch
        >>> m = F1()
        >>> m.update(torch.tensor([[0.9, 0.1], [0.2, 0.8]]), torch.tensor([0, 0]))
        >>> [round(v, 4) for v in m.compute().tolist()]
        [0.6667, 0.0]
    """

    def __init__(self, num_classes: int | None = None, **kwargs: Any) -> None:
        super().__init__(1.0, num_classes=num_classes, **kwargs)
