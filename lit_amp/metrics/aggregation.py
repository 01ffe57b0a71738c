"""Loss, Perplexity and Dice: MindSpore's running aggregates.

- :class:`Loss` is ``torchmetrics.MeanMetric`` fed one value per batch (the batch mean), so
  the value is MindSpore's **unweighted** mean of per-batch mean losses;
- :class:`Perplexity` and :class:`Dice` keep MindSpore's arithmetic (a clipped log-likelihood;
  a per-batch coefficient summed and divided by the number of samples).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torchmetrics.aggregation import MeanMetric

from lit_amp._validation import check_int, check_number
from lit_amp.metrics.base import MindSporeMetric, _no_samples

__all__ = ["Loss", "Perplexity", "Dice"]


class Loss(MindSporeMetric, MeanMetric):
    """MindSpore's ``Loss``: the unweighted mean of per-batch mean losses.

    ``update(loss)`` takes a 0-d or 1-d loss; the value is ``Σ_k mean(loss_k) / n_batches``,
    whatever the batch sizes. :func:`~lit_amp.metrics.update_metrics` feeds it
    ``outputs[eval_indexes[0]]`` (``is_loss_metric`` is True). The states are
    :class:`torchmetrics.MeanMetric`'s, in float64; a NaN loss propagates (as in MindSpore)
    instead of being dropped.

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
        super().__init__(nan_strategy="disable", **kwargs)
        self.set_dtype(torch.float64)

    def update(self, *inputs: Any) -> None:
        """Accumulate one batch: ``update(loss)`` with a 0-d or 1-d loss."""
        (loss,) = self._inputs(inputs)
        if loss.ndim > 1:
            raise ValueError(
                f"For '{type(self).__name__}.update', the dimension of the input 'loss' must be "
                f"0 or 1, but got {loss.ndim} (shape {tuple(loss.shape)})."
            )
        MeanMetric.update(self, loss.to(self.device, torch.float64).mean())

    def compute(self) -> torch.Tensor:
        """The mean of the per-batch mean losses (float64).

        Raises:
            RuntimeError: no batch was seen.
        """
        if float(self.weight) == 0:
            raise _no_samples(type(self).__name__)
        return MeanMetric.compute(self)


class Perplexity(MindSporeMetric):
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
        self.ignore_label = check_int(
            type(self).__name__, "ignore_label", ignore_label, allow_none=True
        )
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


class Dice(MindSporeMetric):
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
        self.smooth = check_number(type(self).__name__, "smooth", smooth, minimum=0.0, strict=True)
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
