"""The MindSpore metric base: ``set_indexes``, MindSpore's input conversion, DDP alignment.

Every metric of :mod:`lit_amp.metrics` derives from :class:`MindSporeMetric`, a
:class:`torchmetrics.Metric` that

- takes its inputs positionally, MindSpore-style (``update(*inputs)``), picks them with
  :meth:`~MindSporeMetric.set_indexes` and converts tensors, numpy arrays, lists and numbers
  to detached tensors (MindSpore's ``_convert_data``);
- carries ``is_loss_metric`` (read by :func:`lit_amp.metrics.update_metrics`);
- lines up a rank that saw no sample with the others before a DDP gather (see
  :meth:`~MindSporeMetric._sync_dist`).

The module-level helpers below (label conversion, shape and value checks, the "no samples"
error) are shared by the metric families of this package.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from lit_amp._runtime import dist_ready
from lit_amp._validation import type_error, value_error

__all__ = ["MindSporeMetric", "metric_value_to_python"]

_EVAL_TYPES = ("classification", "multilabel")
_M = TypeVar("_M", bound="MindSporeMetric")


# --------------------------------------------------------------------------------------
# MindSpore's input conversion and checks
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


def _check_min_ndim2(owner: str, y_pred: torch.Tensor) -> None:
    if y_pred.ndim < 2:
        raise ValueError(
            f"For '{owner}.update', y_pred (predicted value) must have shape (N, C, ...), "
            f"but got shape {tuple(y_pred.shape)}."
        )


def _check_class_num(owner: str, y_pred: torch.Tensor, class_num: int) -> None:
    """``y_pred`` has ``class_num`` classes on dim 1 (``class_num`` 0: not fixed yet)."""
    if class_num and y_pred.shape[1] != class_num:
        raise ValueError(
            f"For '{owner}.update', class number does not match: earlier predicted values "
            f"had {class_num} classes, but the current one has {y_pred.shape[1]}."
        )


def _check_binary_values(owner: str, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if not bool(((t == 0) | (t == 1)).all()):
            raise ValueError(
                f"For '{owner}.update', in the multilabel case all elements of y_pred "
                "(predicted value) and y (true value) must be 0 or 1."
            )


def _check_eval_type(owner: str, eval_type: Any) -> str:
    """MindSpore raises a TypeError (not a ValueError) for an unknown ``eval_type``."""
    if eval_type not in _EVAL_TYPES:
        allowed = "one of " + ", ".join(repr(t) for t in _EVAL_TYPES)
        raise type_error(owner, "eval_type", allowed, eval_type)
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


# --------------------------------------------------------------------------------------
# the base class
# --------------------------------------------------------------------------------------


class MindSporeMetric(Metric):
    """A :class:`torchmetrics.Metric` with MindSpore's calling convention.

    Subclasses set ``_n_inputs`` (2: ``(y_pred, y)``; 1: ``(loss,)``), call
    :meth:`_inputs` first in ``update`` and raise :func:`_no_samples` from ``compute`` when
    nothing was seen. States are fixed-size sums (``dist_reduce_fx="sum"``) where the shape is
    known at construction, and ``"cat"`` lists otherwise.

    Args:
        **kwargs: torchmetrics ``Metric`` options (``sync_on_compute``, ``process_group``, ...).

    Example:
        >>> from lit_amp.metrics import MAE
        >>> isinstance(MAE(), MindSporeMetric), MAE.is_loss_metric
        (True, False)
    """

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

        Raises:
            ValueError: ``indexes`` is not a list of int (MindSpore's exception type).

        Example:
            >>> import torch
            >>> from lit_amp.metrics import MAE
            >>> m = MAE().set_indexes([0, 2])
            >>> m.update(torch.tensor([1.0]), torch.tensor([9.0]), torch.tensor([3.0]))
            >>> float(m.compute())
            2.0
        """
        if not isinstance(indexes, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in indexes
        ):
            raise value_error("set_indexes", "indexes", "a list of int", indexes)
        self._indexes = list(indexes)
        return self

    def clear(self) -> None:
        """MindSpore's ``Metric.clear``: forget every sample seen (torchmetrics' ``reset``).

        Example:
            >>> import torch
            >>> from lit_amp.metrics import MAE
            >>> m = MAE()
            >>> m.update(torch.tensor([1.0]), torch.tensor([3.0]))
            >>> m.clear()
            >>> m.update(torch.tensor([1.0]), torch.tensor([2.0]))
            >>> m.eval()
            np.float64(1.0)
        """
        self.reset()

    def eval(self) -> Any:
        """MindSpore's ``Metric.eval``: the metric value over the samples seen since ``clear``.

        MindSpore 2.10 returns a ``numpy.float64`` for a scalar metric (a ``float`` subclass)
        and a numpy array for a per-class one; so does this method. It replaces torch's
        ``nn.Module.eval`` on metrics, which is safe: a parent's ``eval()`` / ``train(False)``
        reaches its children through ``train(mode)``, never through ``child.eval()``; switch a
        metric itself with ``metric.train(False)``.

        Returns:
            ``numpy.float64``, a numpy array, or a container of them.

        Raises:
            RuntimeError: no sample was seen since the last ``clear`` (MindSpore's type).

        Example:
            >>> import torch
            >>> from lit_amp.metrics import Accuracy
            >>> m = Accuracy()
            >>> m.clear()
            >>> m.update(torch.tensor([[0.2, 0.8], [0.9, 0.1]]), torch.tensor([1, 1]))
            >>> m.eval()
            np.float64(0.5)
        """
        value = metric_value_to_python(self.compute())
        return np.float64(value) if isinstance(value, float) else value

    def _inputs(self, inputs: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        """The inputs :meth:`update` got, picked by ``indexes`` and converted to tensors."""
        owner = type(self).__name__
        if self._indexes:
            inputs = tuple(inputs[i] for i in self._indexes)
        if len(inputs) != self._n_inputs:
            what = (
                "1 input (loss)"
                if self._n_inputs == 1
                else "2 inputs (predicted value, true value)"
            )
            raise ValueError(f"For '{owner}.update', it needs {what}, but got {len(inputs)}.")
        return tuple(_to_tensor(x, owner) for x in inputs)

    def _add(self, name: str, value: torch.Tensor) -> None:
        """Add ``value`` to the sum state ``name`` (on the state's device and dtype)."""
        state = getattr(self, name)
        setattr(self, name, state + value.to(device=state.device, dtype=state.dtype))

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        """Give an empty ``"cat"`` state the other ranks' dtype and trailing shape, then sync.

        Why this override of torchmetrics' private hook is still needed: a rank that saw no
        sample (an uneven stream's last validation, or every batch on rank 0) holds an empty
        list for each ``"cat"`` state, and torchmetrics (1.9) stands in a 1-D tensor of the
        default float dtype for it. The gather then fails or hangs as soon as the other ranks'
        states are not 1-D float32: AUC's float64 ``(N, C)`` scores, the long ``(k, 3, C)``
        per-class count rows of Precision/Recall/Fbeta. So the layouts are exchanged first and
        an empty rank gets ``torch.empty((0, *trailing), dtype)``. (Worth an upstream issue;
        the ``"sum"`` states need nothing: all of them have their final shape from the start.)
        """
        import torch.distributed as dist

        cat_states = [a for a, fx in self._reductions.items() if fx is dim_zero_cat]
        if cat_states and dist_ready():
            group = process_group or self.process_group
            mine = {
                a: (v[0].dtype, tuple(v[0].shape[1:]))
                for a in cat_states
                if isinstance(v := getattr(self, a), list) and v and torch.is_tensor(v[0])
            }
            layouts: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(layouts, mine, group=group)
            for attr in cat_states:
                known = [lay[attr] for lay in layouts if attr in lay]
                value = getattr(self, attr)
                if known and isinstance(value, list) and not value:
                    dtype, trailing = known[0]
                    empty = torch.empty((0, *trailing), dtype=dtype, device=self.device)
                    setattr(self, attr, [empty])
        kwargs = {} if dist_sync_fn is None else {"dist_sync_fn": dist_sync_fn}
        super()._sync_dist(process_group=process_group, **kwargs)
