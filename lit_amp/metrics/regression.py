"""MAE and MSE with MindSpore's normalisation: summed over all elements, divided by samples.

For ``(N, D)`` outputs MindSpore's value is ``D`` times torchmetrics' element-wise
``MeanAbsoluteError`` / ``MeanSquaredError``, so ported numbers keep this arithmetic.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from lit_amp.metrics.base import MindSporeMetric, _no_samples

__all__ = ["MAE", "MSE"]


class _ErrorBase(MindSporeMetric):
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
