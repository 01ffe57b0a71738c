"""MindSpore's metric names, as ``torchmetrics`` metrics with MindSpore's meaning.

``Model(metrics={"acc", "loss"})`` takes MindSpore's metric names; :func:`get_metrics` turns
them into metric objects and :func:`update_metrics` feeds them the eval network's outputs
exactly as MindSpore's ``Model._update_metrics`` does (spec §1.4). Every metric here is a
:class:`torchmetrics.Metric`, so its states are reduced across processes under DDP
(``dist_reduce_fx="sum"``, or ``"cat"`` for AUC) and Lightning moves it with the module.

The values are MindSpore's, not torchmetrics' defaults (spec §1.8):

- ``Precision``, ``Recall`` and ``F1`` return a **per-class** tensor
  (``TP / (predicted_positive + eps)`` with ``eps = sys.float_info.min``);
- ``MAE`` and ``MSE`` divide the error summed over all elements by the **number of samples**
  (dim 0), not by the element count;
- ``Loss`` is the **unweighted** mean of the per-batch mean losses.

Differences from MindSpore's name table (listed in ``docs/differences.md``):

- ``'f1'`` is accepted as well as MindSpore's ``'F1'``;
- ``'auc'`` is a working metric (ROC AUC from scores and labels, :class:`AUC`); in MindSpore
  the name maps to a plain function and fails when used in a set;
- ``'topk'`` and ``'confusion_matrix'`` by name still fail (their constructors need an
  argument), with a TypeError showing how to pass an instance instead;
- ``'roc'``, ``'bleu_score'``, ``'cosine_similarity'``, ``'occlusion_sensitivity'``,
  ``'hausdorff_distance'``, ``'mean_surface_distance'``, ``'root_mean_square_distance'`` and
  ``'confusion_matrix_metric'`` are not provided: pass a ``torchmetrics`` metric in a dict.

Any ``torchmetrics.Metric`` (``torchmetrics.classification.MulticlassAccuracy``, ...) can be
given in a dict ``name -> Metric``; metrics without an ``is_loss_metric`` attribute receive
``(prediction, label)``.

Example:
    >>> import torch
    >>> metrics = get_metrics({"acc", "loss"})
    >>> outputs = (torch.tensor(0.5), torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
    >>> update_metrics(metrics, outputs, eval_indexes=[0, 1, 2])
    >>> {name: metric_value_to_python(m.compute()) for name, m in sorted(metrics.items())}
    {'acc': 0.5, 'loss': 0.5}
"""

from __future__ import annotations

import logging
import numbers
import sys
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from torchmetrics import Metric
from torchmetrics.functional.classification import binary_auroc, multiclass_auroc
from torchmetrics.utilities import dim_zero_cat, dim_zero_sum

__all__ = [
    "Accuracy",
    "Precision",
    "Recall",
    "Fbeta",
    "F1",
    "MAE",
    "MSE",
    "Loss",
    "TopKCategoricalAccuracy",
    "Top1CategoricalAccuracy",
    "Top5CategoricalAccuracy",
    "AUC",
    "ConfusionMatrix",
    "Perplexity",
    "Dice",
    "names",
    "get_metric_fn",
    "get_metrics",
    "update_metrics",
    "metric_value_to_python",
]

log = logging.getLogger(__name__)

_EPS = sys.float_info.min  # MindSpore's eps for precision / recall / fbeta
_EVAL_TYPES = ("classification", "multilabel")
_M = TypeVar("_M", bound="_MetricBase")


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _to_tensor(data: Any, owner: str) -> torch.Tensor:
    """MindSpore's ``_convert_data``: a Tensor, numpy array, list or number -> a detached tensor."""
    if isinstance(data, torch.Tensor):
        return data.detach()
    if isinstance(data, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(data))
    if isinstance(data, (list, tuple)) or (
        isinstance(data, numbers.Number) and not isinstance(data, bool)
    ):
        return torch.as_tensor(data)
    raise TypeError(
        f"For '{owner}.update', the input data type must be torch.Tensor, numpy.ndarray or "
        f"list, but got {type(data).__name__}."
    )


def _no_samples(owner: str) -> RuntimeError:
    return RuntimeError(
        f"The '{owner}' can not be calculated, because the number of samples is 0, please check "
        "whether your inputs (predicted value, true value) are empty, or whether update() was "
        "called before compute()."
    )


def _is_distribution(y: torch.Tensor) -> bool:
    """True when ``y`` is one-hot or a probability distribution along dim 1."""
    if y.ndim < 2 or y.numel() == 0:
        return False
    y = y.double()
    return bool((y >= 0).all()) and bool(
        torch.allclose(y.sum(dim=1), torch.ones((), dtype=y.dtype), atol=1e-4)
    )


def _labels_to_index(y_pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A one-hot or probability label shaped like ``y_pred`` -> class indices (argmax on dim 1).

    MindSpore argmaxes one-hot labels only; a probability label is argmaxed too here. A label
    with the same ndim but another shape (``(N, 1)`` indices, say) is left alone, so the shape
    check that follows rejects it instead of silently argmaxing it to 0.
    """
    if y.ndim == y_pred.ndim and y.shape == y_pred.shape and _is_distribution(y):
        return y.argmax(dim=1)
    return y


def _check_classification_shape(owner: str, y_pred: torch.Tensor, y: torch.Tensor) -> None:
    if y_pred.ndim != y.ndim + 1:
        raise ValueError(
            f"For '{owner}.update', in the classification case the dimension of y_pred "
            f"(predicted value) must equal the dimension of y (true value) plus 1 (or y must be "
            f"one-hot shaped like y_pred), but got y_pred shape {tuple(y_pred.shape)} and "
            f"y shape {tuple(y.shape)}."
        )
    expected = (y_pred.shape[0], *y_pred.shape[2:])
    if tuple(y.shape) != expected:
        raise ValueError(
            f"For '{owner}.update', y (true value) shape must be y_pred (predicted value) shape "
            f"without dim 1, i.e. {expected}, but got y_pred shape {tuple(y_pred.shape)} and "
            f"y shape {tuple(y.shape)}."
        )


def _check_binary_values(owner: str, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if not bool(((t == 0) | (t == 1)).all()):
            raise ValueError(
                f"For '{owner}.update', in the multilabel case all elements of y_pred "
                "(predicted value) and y (true value) must be 0 or 1."
            )


def _check_eval_type(owner: str, eval_type: Any) -> str:
    if eval_type not in _EVAL_TYPES:
        raise TypeError(
            f"For '{owner}', the argument 'eval_type' must be one of {list(_EVAL_TYPES)}, "
            f"but got {eval_type!r}."
        )
    return eval_type


def _class_labels(owner: str, y: torch.Tensor, class_num: int) -> torch.Tensor:
    """Integer class indices in ``[0, class_num)``; floats holding integers are accepted."""
    if y.is_floating_point() and not bool((y == y.round()).all()):
        raise ValueError(
            f"For '{owner}.update', y (true value) must hold integer class indices, but got "
            "non-integer values."
        )
    y = y.long()
    if y.numel() and (int(y.max()) + 1 > class_num or int(y.min()) < 0):
        raise ValueError(
            f"For '{owner}.update', y (true value) must hold class indices in [0, {class_num}) "
            f"(the predicted value has {class_num} classes), but got values in "
            f"[{int(y.min())}, {int(y.max())}]."
        )
    return y


# --------------------------------------------------------------------------------------
# base
# --------------------------------------------------------------------------------------


class _MetricBase(Metric):
    """Shared behaviour: input count check, MindSpore's ``set_indexes``, ``is_loss_metric``."""

    is_loss_metric: ClassVar[bool] = False
    is_differentiable: ClassVar[bool] = False
    full_state_update: ClassVar[bool] = False
    _n_inputs: ClassVar[int] = 2

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._indexes: list[int] | None = None

    @property
    def indexes(self) -> list[int] | None:
        """The input positions :meth:`update` reads (MindSpore's ``indexes``); None: all."""
        return self._indexes

    def set_indexes(self: _M, indexes: list[int]) -> _M:
        """Make ``update(*inputs)`` use ``inputs[i] for i in indexes`` (MindSpore's decorator).

        Args:
            indexes: positions of the inputs to pass on, e.g. ``[1, 2]`` for
                ``(loss, logits, label)``.

        Returns:
            The metric itself.

        Example:
            >>> import torch
            >>> m = MAE().set_indexes([0, 2])
            >>> m.update(torch.tensor([1.0]), torch.tensor([9.0]), torch.tensor([3.0]))
            >>> float(m.compute())
            2.0
        """
        if not isinstance(indexes, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in indexes
        ):
            raise ValueError(
                "For 'set_indexes', the argument 'indexes' must be a list of int, "
                f"but got {indexes!r}."
            )
        self._indexes = list(indexes)
        return self

    def _inputs(self, inputs: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        owner = type(self).__name__
        if self._indexes:
            inputs = tuple(inputs[i] for i in self._indexes)
        if len(inputs) != self._n_inputs:
            what = (
                "1 input (loss)"
                if self._n_inputs == 1
                else ("2 inputs (predicted value, true value)")
            )
            raise ValueError(f"For '{owner}.update', it needs {what}, but got {len(inputs)}.")
        return tuple(_to_tensor(x, owner) for x in inputs)

    def _add(self, name: str, value: torch.Tensor) -> None:
        state = getattr(self, name)
        setattr(self, name, state + value.to(device=state.device, dtype=state.dtype))

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        """Before torchmetrics gathers the states, a rank that saw no sample is brought to the
        others' layout: its ``"cat"`` states get an empty tensor of their dtype and trailing
        shape (torchmetrics would make it 1-D float32), and its ``"sum"`` states that are
        still the scalar default become zeros of their shape (per-class counts grow at the
        first update). Without this, the gather does not match across ranks: a crash or a
        hang in the middle of an evaluation (an uneven stream's last validation)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            group = process_group or self.process_group
            mine: dict[str, Any] = {}
            for attr in self._reductions:
                value = getattr(self, attr)
                first = value[0] if isinstance(value, list) and value else value
                if torch.is_tensor(first):
                    mine[attr] = (first.dtype, tuple(first.shape))
            layouts: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(layouts, mine, group=group)
            for attr, fx in self._reductions.items():
                value = getattr(self, attr)
                known = [lay[attr] for lay in layouts if attr in lay]
                if not known:
                    continue
                if fx is dim_zero_cat and isinstance(value, list) and not value:
                    dtype, shape = known[0]
                    empty = torch.empty((0, *shape[1:]), dtype=dtype, device=self.device)
                    setattr(self, attr, [empty])
                elif fx is dim_zero_sum and torch.is_tensor(value) and value.ndim == 0:
                    dtype, shape = max(known, key=lambda k: len(k[1]))
                    if shape and not bool(value):  # an untouched default: zero is neutral
                        setattr(self, attr, torch.zeros(shape, dtype=dtype, device=self.device))
        kwargs = {} if dist_sync_fn is None else {"dist_sync_fn": dist_sync_fn}
        super()._sync_dist(process_group=process_group, **kwargs)


# --------------------------------------------------------------------------------------
# accuracy family
# --------------------------------------------------------------------------------------


class Accuracy(_MetricBase):
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
        if y_pred.ndim < 2:
            raise ValueError(
                f"For '{type(self).__name__}.update', y_pred (predicted value) must have shape "
                f"(N, C, ...), but got shape {tuple(y_pred.shape)}."
            )
        if self._class_num == 0:
            self._class_num = int(y_pred.shape[1])
        elif y_pred.shape[1] != self._class_num:
            raise ValueError(
                f"For '{type(self).__name__}.update', class number does not match: earlier "
                f"predicted values had {self._class_num} classes, but the current one has "
                f"{y_pred.shape[1]}."
            )

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


class TopKCategoricalAccuracy(_MetricBase):
    """MindSpore's ``TopKCategoricalAccuracy``: the label is among the ``k`` highest scores.

    ``y_pred`` has shape ``(N, C)``; ``y`` holds class indices ``(N,)`` or is one-hot. Ties go
    to the lower class index (a stable sort), as MindSpore documents.

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
        if not isinstance(k, int) or isinstance(k, bool):
            raise TypeError(
                f"For '{type(self).__name__}', the argument 'k' must be an int, "
                f"but got {type(k).__name__}."
            )
        if k < 1:
            raise ValueError(
                f"For '{type(self).__name__}', the argument 'k' must be at least 1, but got {k}."
            )
        self.k = k
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


# --------------------------------------------------------------------------------------
# precision / recall / fbeta
# --------------------------------------------------------------------------------------


class _PerClassBase(_MetricBase):
    """Per-class counts for single-label classification; the class count is fixed at the
    first update (or by ``num_classes``, which also keeps DDP sync shapes equal on a process
    that saw no batch)."""

    _count_states: ClassVar[tuple[str, ...]] = ()

    def __init__(self, num_classes: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if num_classes is not None and (
            not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1
        ):
            raise ValueError(
                f"For '{type(self).__name__}', the argument 'num_classes' must be None or an "
                f"int >= 1, but got {num_classes!r}."
            )
        self.num_classes = num_classes
        default = (
            torch.zeros(num_classes, dtype=torch.long)
            if num_classes
            else torch.tensor(0, dtype=torch.long)
        )
        for name in self._count_states:
            self.add_state(name, default.clone(), dist_reduce_fx="sum")

    @property
    def _class_num(self) -> int:
        state = getattr(self, self._count_states[0])
        return int(state.shape[0]) if state.ndim == 1 else 0

    def _classification_counts(
        self, y_pred: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(true_positives, predicted_positives, actual_positives)`` per class for one batch."""
        owner = type(self).__name__
        y = _labels_to_index(y_pred, y)
        if y_pred.ndim < 2:
            raise ValueError(
                f"For '{owner}.update', y_pred (predicted value) must have shape (N, C, ...), "
                f"but got shape {tuple(y_pred.shape)}."
            )
        _check_classification_shape(owner, y_pred, y)
        class_num = self._class_num
        if class_num and y_pred.shape[1] != class_num:
            raise ValueError(
                f"For '{owner}.update', class number does not match: earlier predicted values "
                f"had {class_num} classes, but the current one has {y_pred.shape[1]}."
            )
        c = int(y_pred.shape[1])
        y = _class_labels(owner, y, c).reshape(-1)
        pred = y_pred.argmax(dim=1).reshape(-1)
        tp = torch.bincount(y[pred == y], minlength=c)
        return tp, torch.bincount(pred, minlength=c), torch.bincount(y, minlength=c)


class Precision(_PerClassBase):
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
        TypeError: ``eval_type`` is not one of the two.

    Example:
        >>> import torch
        >>> m = Precision()
        >>> m.update(torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]), torch.tensor([1, 0, 1]))
        >>> m.compute().tolist()
        [0.5, 1.0]
    """

    higher_is_better: ClassVar[bool] = True
    _count_states = ("true_positives", "positives")

    def __init__(
        self, eval_type: str = "classification", num_classes: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        self.eval_type = _check_eval_type(type(self).__name__, eval_type)
        if self.eval_type == "multilabel":
            self.add_state("sample_true_positives", [], dist_reduce_fx="cat")
            self.add_state("sample_positives", [], dist_reduce_fx="cat")

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(y_pred, y)``."""
        y_pred, y = self._inputs(inputs)
        if self.eval_type == "multilabel":
            tp, pos = _multilabel_sample_counts(type(self).__name__, y_pred, y, use_pred=True)
            self.sample_true_positives.append(tp.to(self.device))
            self.sample_positives.append(pos.to(self.device))
            return
        tp, pred_pos, _ = self._classification_counts(y_pred, y)
        self._add("true_positives", tp)
        self._add("positives", pred_pos)

    def compute(self) -> torch.Tensor:
        """Per-class (or, for multilabel, per-sample) precision, float64.

        Raises:
            RuntimeError: no samples were seen.
        """
        if self.eval_type == "multilabel":
            return _multilabel_ratio(
                type(self).__name__, self.sample_true_positives, self.sample_positives
            )
        if int(self.positives.sum()) == 0:
            raise _no_samples(type(self).__name__)
        return self.true_positives.double() / (self.positives.double() + _EPS)


class Recall(_PerClassBase):
    """MindSpore's ``Recall``: per-class ``TP / (actual_positive + eps)``.

    ``compute()`` returns a float64 tensor with one value per class; a class absent from the
    labels gets 0. With ``eval_type='multilabel'`` the value is one recall per sample.

    Args:
        eval_type: ``'classification'`` (default) or ``'multilabel'``.
        num_classes: optional class count (default: fixed by the first update).
        **kwargs: torchmetrics ``Metric`` options.

    Raises:
        TypeError: ``eval_type`` is not one of the two.

    Example:
        >>> import torch
        >>> m = Recall()
        >>> m.update(torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]), torch.tensor([1, 0, 1]))
        >>> m.compute().tolist()
        [1.0, 0.5]
    """

    higher_is_better: ClassVar[bool] = True
    _count_states = ("true_positives", "actual_positives")

    def __init__(
        self, eval_type: str = "classification", num_classes: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        self.eval_type = _check_eval_type(type(self).__name__, eval_type)
        if self.eval_type == "multilabel":
            self.add_state("sample_true_positives", [], dist_reduce_fx="cat")
            self.add_state("sample_actual_positives", [], dist_reduce_fx="cat")

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(y_pred, y)``."""
        y_pred, y = self._inputs(inputs)
        if self.eval_type == "multilabel":
            tp, pos = _multilabel_sample_counts(type(self).__name__, y_pred, y, use_pred=False)
            self.sample_true_positives.append(tp.to(self.device))
            self.sample_actual_positives.append(pos.to(self.device))
            return
        tp, _, actual_pos = self._classification_counts(y_pred, y)
        self._add("true_positives", tp)
        self._add("actual_positives", actual_pos)

    def compute(self) -> torch.Tensor:
        """Per-class (or, for multilabel, per-sample) recall, float64.

        Raises:
            RuntimeError: no samples were seen.
        """
        if self.eval_type == "multilabel":
            return _multilabel_ratio(
                type(self).__name__, self.sample_true_positives, self.sample_actual_positives
            )
        if int(self.actual_positives.sum()) == 0:
            raise _no_samples(type(self).__name__)
        return self.true_positives.double() / (self.actual_positives.double() + _EPS)


def _multilabel_sample_counts(
    owner: str, y_pred: torch.Tensor, y: torch.Tensor, use_pred: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """MindSpore's multilabel precision/recall: per-sample true positives and positives."""
    if y_pred.shape != y.shape or y_pred.ndim < 2:
        raise ValueError(
            f"For '{owner}.update', in the multilabel case y_pred (predicted value) and y (true "
            f"value) must have the same shape (N, C, ...), but got {tuple(y_pred.shape)} and "
            f"{tuple(y.shape)}."
        )
    _check_binary_values(owner, y_pred, y)
    c = int(y_pred.shape[1])
    pred = y_pred.transpose(0, 1).reshape(c, -1).double()
    true = y.transpose(0, 1).reshape(c, -1).double()
    return (pred * true).sum(dim=0), (pred if use_pred else true).sum(dim=0)


def _multilabel_ratio(owner: str, tp: Any, pos: Any) -> torch.Tensor:
    if isinstance(tp, list) and not tp:
        raise _no_samples(owner)
    tp, pos = dim_zero_cat(tp), dim_zero_cat(pos)
    if tp.numel() == 0:
        raise _no_samples(owner)
    return tp.double() / (pos.double() + _EPS)


class Fbeta(_PerClassBase):
    """MindSpore's ``Fbeta``: per-class ``(1+β²)·TP / (β²·actual_pos + pred_pos + eps)``.

    ``compute()`` returns a float64 tensor with one value per class.

    Args:
        beta: the weight of recall (a number > 0).
        num_classes: optional class count (default: fixed by the first update).
        **kwargs: torchmetrics ``Metric`` options.

    Raises:
        TypeError: ``beta`` is not a number.
        ValueError: ``beta`` <= 0.

    Example:
        >>> import torch
        >>> m = Fbeta(1.0)
        >>> m.update(torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]), torch.tensor([1, 0, 1]))
        >>> [round(v, 4) for v in m.compute().tolist()]
        [0.6667, 0.6667]
    """

    higher_is_better: ClassVar[bool] = True
    _count_states = ("true_positives", "positives", "actual_positives")

    def __init__(self, beta: float, num_classes: int | None = None, **kwargs: Any) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        if not isinstance(beta, numbers.Real) or isinstance(beta, bool):
            raise TypeError(
                f"For '{type(self).__name__}', the argument 'beta' must be a number, "
                f"but got {type(beta).__name__}."
            )
        if not beta > 0:
            raise ValueError(
                f"For '{type(self).__name__}', the argument 'beta' must be greater than 0, "
                f"but got {beta}."
            )
        self.beta = float(beta)

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(y_pred, y)``."""
        y_pred, y = self._inputs(inputs)
        tp, pred_pos, actual_pos = self._classification_counts(y_pred, y)
        self._add("true_positives", tp)
        self._add("positives", pred_pos)
        self._add("actual_positives", actual_pos)

    def compute(self) -> torch.Tensor:
        """Per-class F-beta, float64.

        Raises:
            RuntimeError: no samples were seen.
        """
        if int(self.positives.sum()) == 0:
            raise _no_samples(type(self).__name__)
        b2 = self.beta**2
        return (
            (1.0 + b2)
            * self.true_positives.double()
            / (b2 * self.actual_positives.double() + self.positives.double() + _EPS)
        )


class F1(Fbeta):
    """``Fbeta(1.0)`` (MindSpore's ``'F1'``; ``'f1'`` is accepted too).

    Example:
        >>> import torch
        >>> m = F1()
        >>> m.update(torch.tensor([[0.9, 0.1], [0.2, 0.8]]), torch.tensor([0, 0]))
        >>> [round(v, 4) for v in m.compute().tolist()]
        [0.6667, 0.0]
    """

    def __init__(self, num_classes: int | None = None, **kwargs: Any) -> None:
        super().__init__(1.0, num_classes=num_classes, **kwargs)


# --------------------------------------------------------------------------------------
# regression errors and loss
# --------------------------------------------------------------------------------------


class _ErrorBase(_MetricBase):
    higher_is_better: ClassVar[bool] = False
    _power: ClassVar[int] = 1

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("error_sum", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("samples_num", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(y_pred, y)``; ``y`` is reshaped to ``y_pred``'s shape."""
        owner = type(self).__name__
        y_pred, y = self._inputs(inputs)
        if y.ndim == 0 or y.numel() != y_pred.numel():
            raise ValueError(
                f"For '{owner}.update', y (true value) must have a sample dim and as many "
                f"elements as y_pred (predicted value), but got y shape {tuple(y.shape)} and "
                f"y_pred shape {tuple(y_pred.shape)}."
            )
        err = (y.reshape(y_pred.shape).double() - y_pred.double()).abs()
        if self._power != 1:
            err = err.pow(self._power)
        self._add("error_sum", err.sum())
        self._add("samples_num", torch.tensor(y.shape[0]))

    def compute(self) -> torch.Tensor:
        """The error summed over all elements divided by the number of samples (float64).

        Raises:
            RuntimeError: no samples were seen.
        """
        if int(self.samples_num) == 0:
            raise _no_samples(type(self).__name__)
        return self.error_sum / self.samples_num.double()


class MAE(_ErrorBase):
    """MindSpore's ``MAE``: ``Σ|y - y_pred|`` over **all elements** / **number of samples**.

    For ``(N, D)`` outputs this is ``D`` times torchmetrics' element-wise mean.

    Args:
        **kwargs: torchmetrics ``Metric`` options.

    Example:
        >>> import torch
        >>> m = MAE()
        >>> m.update(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.5, 2.0], [3.0, 3.0]]))
        >>> float(m.compute())
        0.75
    """


class MSE(_ErrorBase):
    """MindSpore's ``MSE``: ``Σ(y - y_pred)²`` over **all elements** / **number of samples**.

    Args:
        **kwargs: torchmetrics ``Metric`` options.

    Example:
        >>> import torch
        >>> m = MSE()
        >>> m.update(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.5, 2.0], [3.0, 3.0]]))
        >>> float(m.compute())
        0.625
    """

    _power = 2


class Loss(_MetricBase):
    """MindSpore's ``Loss``: the unweighted mean of per-batch mean losses.

    ``update(loss)`` takes a 0-d or 1-d loss; the value is ``Σ_k mean(loss_k) / n_batches``,
    whatever the batch sizes. :func:`update_metrics` feeds it ``outputs[eval_indexes[0]]``
    (``is_loss_metric`` is True).

    Args:
        **kwargs: torchmetrics ``Metric`` options.

    Example:
        >>> import torch
        >>> m = Loss()
        >>> m.update(torch.tensor([1.0, 3.0]))
        >>> m.update(torch.tensor(4.0))
        >>> float(m.compute())
        3.0
    """

    is_loss_metric: ClassVar[bool] = True
    higher_is_better: ClassVar[bool] = False
    _n_inputs = 1

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("sum_loss", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total_num", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(loss)`` with a 0-d or 1-d loss."""
        (loss,) = self._inputs(inputs)
        if loss.ndim == 0:
            loss = loss.reshape(1)
        if loss.ndim != 1:
            raise ValueError(
                f"For '{type(self).__name__}.update', the dimension of the input 'loss' must be "
                f"0 or 1, but got {loss.ndim} (shape {tuple(loss.shape)})."
            )
        self._add("sum_loss", loss.double().mean())
        self._add("total_num", torch.tensor(1))

    def compute(self) -> torch.Tensor:
        """The mean of the per-batch mean losses (float64).

        Raises:
            RuntimeError: no batch was seen.
        """
        if int(self.total_num) == 0:
            raise _no_samples(type(self).__name__)
        return self.sum_loss / self.total_num.double()


# --------------------------------------------------------------------------------------
# AUC, confusion matrix, perplexity, dice
# --------------------------------------------------------------------------------------


class AUC(_MetricBase):
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


class ConfusionMatrix(_MetricBase):
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
        ValueError: ``normalize`` is not one of the four.

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
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
            raise TypeError(
                f"For '{type(self).__name__}', the argument 'num_classes' must be an int >= 1, "
                f"but got {num_classes!r}."
            )
        if normalize not in self._NORMALIZE:
            raise ValueError(
                f"For '{type(self).__name__}', the argument 'normalize' must be one of "
                f"{list(self._NORMALIZE)}, but got {normalize!r}."
            )
        if not isinstance(threshold, float):
            raise TypeError(
                f"For '{type(self).__name__}', the argument 'threshold' must be a float, "
                f"but got {type(threshold).__name__}."
            )
        self.num_classes = num_classes
        self.normalize = normalize
        self.threshold = threshold
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
        counts = torch.bincount(y * c + y_pred, minlength=c * c).reshape(c, c)
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


class Perplexity(_MetricBase):
    """MindSpore's ``Perplexity``: ``exp(-Σ log p(label) / count)`` over all labels.

    ``preds`` holds probabilities ``(..., C)``; ``labels`` one class index per row. Entries
    equal to ``ignore_label`` are left out of the sum and the count; probabilities are clipped
    at ``1e-10`` before the log, as in MindSpore.

    Args:
        ignore_label: a label value to skip, or None.
        **kwargs: torchmetrics ``Metric`` options.

    Raises:
        TypeError: ``ignore_label`` is neither None nor an int.

    Example:
        >>> import torch
        >>> m = Perplexity()
        >>> m.update(torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]), torch.tensor([1, 0, 1]))
        >>> round(float(m.compute()), 6)
        2.231443
    """

    higher_is_better: ClassVar[bool] = False

    def __init__(self, ignore_label: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if ignore_label is not None and (
            not isinstance(ignore_label, int) or isinstance(ignore_label, bool)
        ):
            raise TypeError(
                f"For '{type(self).__name__}', the argument 'ignore_label' must be None or an "
                f"int, but got {type(ignore_label).__name__}."
            )
        self.ignore_label = ignore_label
        self.add_state("sum_nll", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_inst", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(preds, labels)``."""
        preds, labels = self._inputs(inputs)
        if preds.ndim == 0 or labels.numel() * preds.shape[-1] != preds.numel():
            raise RuntimeError(
                f"For '{type(self).__name__}.update', preds and labels must match: one label per "
                f"row of preds, but got preds shape {tuple(preds.shape)} and labels shape "
                f"{tuple(labels.shape)}."
            )
        labels = labels.reshape(-1).long()
        preds = preds.reshape(-1, preds.shape[-1]).double()
        keep = (
            labels != self.ignore_label
            if self.ignore_label is not None
            else torch.ones_like(labels, dtype=torch.bool)
        )
        picked = preds[
            torch.arange(labels.numel(), device=labels.device), torch.where(keep, labels, 0)
        ]
        nll = -torch.log(picked.clamp_min(1e-10))[keep].sum()
        self._add("sum_nll", nll)
        self._add("num_inst", keep.sum())

    def compute(self) -> torch.Tensor:
        """The perplexity (float64 0-d tensor).

        Raises:
            RuntimeError: no samples were seen.
        """
        if int(self.num_inst) == 0:
            raise _no_samples(type(self).__name__)
        return torch.exp(self.sum_nll / self.num_inst.double())


class Dice(_MetricBase):
    """MindSpore's ``Dice``: ``Σ_batches dice(batch) / number of samples``.

    Each update computes one coefficient over the whole batch,
    ``2·⟨y_pred, y⟩ / (⟨y_pred, y_pred⟩ + ⟨y, y⟩ + smooth)``, and the value is the sum of
    those coefficients divided by the total number of **samples** (not batches) -- MindSpore's
    own arithmetic, kept so ported numbers match.

    Args:
        smooth: a positive term added to the denominator.
        **kwargs: torchmetrics ``Metric`` options.

    Raises:
        TypeError: ``smooth`` is not a number.
        ValueError: ``smooth`` <= 0.

    Example:
        >>> import torch
        >>> m = Dice()
        >>> m.update(torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]]),
        ...          torch.tensor([[0, 1], [1, 0], [0, 1]]))
        >>> round(float(m.compute()), 6)
        0.204678
    """

    higher_is_better: ClassVar[bool] = True

    def __init__(self, smooth: float = 1e-5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(smooth, numbers.Real) or isinstance(smooth, bool):
            raise TypeError(
                f"For '{type(self).__name__}', the argument 'smooth' must be a float, "
                f"but got {type(smooth).__name__}."
            )
        if not smooth > 0:
            raise ValueError(
                f"For '{type(self).__name__}', the argument 'smooth' must be greater than 0, "
                f"but got {smooth}."
            )
        self.smooth = float(smooth)
        self.add_state("dice_sum", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("samples_num", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(y_pred, y)`` of the same shape ``(N, ...)``."""
        y_pred, y = self._inputs(inputs)
        if y_pred.shape != y.shape or y.ndim == 0:
            raise ValueError(
                f"For '{type(self).__name__}.update', y_pred (predicted value) and y (true value) "
                f"must have the same shape (N, ...), but got {tuple(y_pred.shape)} and "
                f"{tuple(y.shape)}."
            )
        p, t = y_pred.reshape(-1).double(), y.reshape(-1).double()
        dice = 2 * torch.dot(p, t) / (torch.dot(p, p) + torch.dot(t, t) + self.smooth)
        self._add("dice_sum", dice)
        self._add("samples_num", torch.tensor(y.shape[0]))

    def compute(self) -> torch.Tensor:
        """``Σ dice(batch) / samples`` (float64 0-d tensor).

        Raises:
            RuntimeError: no samples were seen.
        """
        if int(self.samples_num) == 0:
            raise _no_samples("Dice coefficient")
        return self.dice_sum / self.samples_num.double()


# --------------------------------------------------------------------------------------
# the name table
# --------------------------------------------------------------------------------------

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
    if not isinstance(name, str):
        raise TypeError(
            f"For 'get_metric_fn', the argument 'name' must be a str, but got "
            f"{type(name).__name__}."
        )
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
            raise ValueError(
                "For 'update_metrics', the argument 'eval_indexes' must be None or a list of 3 "
                f"ints [loss, prediction, label], but got {eval_indexes!r}."
            )
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


def metric_value_to_python(value: Any) -> Any:
    """A metric value as MindSpore reports it: a 0-d tensor -> float, a tensor -> numpy array.

    Tuples, lists and dicts (as some torchmetrics metrics return) are converted item by item;
    numpy scalars become floats; anything else is returned unchanged.

    Args:
        value: what ``metric.compute()`` returned.

    Returns:
        A float, a numpy array, or a container of them.

    Example:
        >>> import torch
        >>> metric_value_to_python(torch.tensor(0.5))
        0.5
        >>> metric_value_to_python(torch.tensor([0.5, 1.0]))
        array([0.5, 1. ], dtype=float32)
    """
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.ndim == 0:
            return float(value.item())
        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.cpu().numpy()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return float(value)
    if isinstance(value, np.generic):
        return float(value) if np.issubdtype(value.dtype, np.number) else value.item()
    if isinstance(value, Mapping):
        return {k: metric_value_to_python(v) for k, v in value.items()}
    if isinstance(value, list):
        return [metric_value_to_python(v) for v in value]
    if isinstance(value, tuple):
        return tuple(metric_value_to_python(v) for v in value)
    return value
