"""``ThorModel``: the :class:`~lit_amp.Model` that ``ConvertModelUtils`` returns for THOR.

This module imports Lightning (through :mod:`lit_amp.model`); :mod:`lit_amp.thor` itself stays
pure PyTorch and imports it only when a model is converted.

The alternation of one second-order step with ``frequency - 1`` first-order steps is driven by
the :class:`~lit_amp.thor.THOR` optimizer itself (it counts its steps and installs its
statistics hooks only for second-order steps), so it holds in sink mode (``sink_size`` steps
in one Lightning step) and non-sink mode alike. ``ThorModel`` adds MindSpore's ``ModelThor``
rules and the wiring to the Model's loss scaler.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from lit_amp.thor import thor
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> opt = thor(net, 0.05, 0.03, 0.9, frequency=2)
    >>> model = ThorModel(net, nn.CrossEntropyLoss(), opt)
    >>> model.frequency
    2
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lit_amp.model.model import Model
from lit_amp.thor.optimizer import THOR

__all__ = ["ThorModel"]

_EVAL_MSG = (
    "Evaluation in training is currently not supported in the second-order scenario of thor: "
    "'valid_dataset' must be None, but got a {name}. Call Model.eval after training instead."
)


def _find_thor(optimizer: Any, network: nn.Module) -> THOR | None:
    if isinstance(optimizer, THOR):
        return optimizer
    inner = getattr(network, "optimizer", None)  # a TrainOneStepCell
    return inner if isinstance(inner, THOR) else None


class ThorModel(Model):
    """MindSpore's ``ModelThor``: a :class:`~lit_amp.Model` training with a THOR optimizer.

    Takes :class:`~lit_amp.Model`'s arguments. Training alternates one second-order step
    (statistics hooks on, factors and inverses refreshed) with ``frequency - 1`` first-order
    steps (hooks off) in sink and non-sink mode. ``fit`` with a ``valid_dataset`` raises
    ValueError, as MindSpore's does. When the Model scales the loss (``loss_scale_manager``),
    the optimizer's ``grad_scale`` follows the scaler's current scale, so G stays correct under
    dynamic loss scaling too.

    Attributes:
        frequency: the optimizer's refresh interval (MindSpore's ``_frequency``).

    Raises:
        TypeError: no THOR optimizer was given (directly or inside a TrainOneStepCell).
    """

    def __init__(self, network: nn.Module, *args: Any, **kwargs: Any) -> None:
        super().__init__(network, *args, **kwargs)
        opt = _find_thor(self._optimizer, network)
        if opt is None:
            raise TypeError(
                "ThorModel: the argument 'optimizer' must be a lit_amp.thor THOR optimizer "
                f"(from lit_amp.thor.thor), but got {type(self._optimizer).__name__}."
            )
        self.thor_optimizer: THOR = opt
        self.frequency: int = opt.get_frequency()

    def _wire_loss_scale(self) -> None:
        lit = self._lit
        lit.apply_amp(self._device_hint())
        ctl = getattr(lit, "loss_scale", None)
        if ctl is not None and getattr(ctl, "enabled", False):
            self.thor_optimizer.grad_scale = lambda: ctl.scale

    def fit(
        self, epoch: int, train_dataset: Any, valid_dataset: Any = None, *args: Any, **kwargs: Any
    ) -> None:
        """As :meth:`lit_amp.Model.fit`, without evaluation during training.

        Raises:
            ValueError: ``valid_dataset`` is not None (MindSpore's ModelThor refuses it).
        """
        if valid_dataset is not None:
            raise ValueError(_EVAL_MSG.format(name=type(valid_dataset).__name__))
        super().fit(epoch, train_dataset, None, *args, **kwargs)

    def _run_train(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("valid_dataset") is not None:
            raise ValueError(_EVAL_MSG.format(name=type(kwargs["valid_dataset"]).__name__))
        self._wire_loss_scale()
        super()._run_train(*args, **kwargs)

    def __repr__(self) -> str:
        return super().__repr__().replace("Model(", "ThorModel(", 1)[:-1] + (
            f", frequency={self.frequency})"
        )
