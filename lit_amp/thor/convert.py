"""THOR's Model side: ``ThorModel`` and ``ConvertModelUtils`` (MindSpore's ``ModelThor``).

:class:`ConvertModelUtils` ``.convert_to_thor_model`` switches a Model to THOR training: it
returns a :class:`ThorModel` when the optimizer is a :class:`~lit_amp.thor.optimizer.THOR`, the
Model unchanged otherwise. Both are facades (they build a :class:`~lit_amp.Model`), so this is
the one module of :mod:`lit_amp.thor` that imports Lightning; the optimizer stays pure PyTorch.

The alternation of one second-order step with ``frequency - 1`` first-order steps is driven by
the THOR optimizer itself (it counts its steps and installs its statistics hooks only for
second-order steps), so it holds in sink mode (``sink_size`` steps in one Lightning step) and
non-sink mode alike. ``ThorModel`` adds MindSpore's ``ModelThor`` rules and the wiring to the
Model's loss scaler.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from lit_amp import Model
    >>> from lit_amp.thor import thor
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> loss = nn.CrossEntropyLoss()
    >>> opt = thor(net, 0.05, 0.03, 0.9, frequency=2)
    >>> model = Model(net, loss, opt, metrics={"acc"})
    >>> model = ConvertModelUtils.convert_to_thor_model(model, net, loss, opt, metrics={"acc"})
    >>> type(model).__name__, model.frequency
    ('ThorModel', 2)
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lit_amp.amp.cells import TrainOneStepCell
from lit_amp.model.model import Model
from lit_amp.thor.optimizer import THOR

__all__ = ["ThorModel", "ConvertModelUtils"]

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
                "For 'ThorModel', the argument 'optimizer' must be a THOR optimizer (from "
                f"lit_amp.thor.thor), but got {type(self._optimizer).__name__}."
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


class ConvertModelUtils:
    """Convert a Model to THOR training (MindSpore's ``mindspore.train.ConvertModelUtils``).

    Example:
        >>> ConvertModelUtils.convert_to_thor_model(None, nn.Linear(2, 2)) is None
        True
    """

    @staticmethod
    def convert_to_thor_model(
        model: Any,
        network: nn.Module,
        loss_fn: nn.Module | None = None,
        optimizer: Any = None,
        metrics: set | dict | None = None,
        amp_level: str = "O0",
        loss_scale_manager: Any = None,
        keep_batchnorm_fp32: bool = False,
    ) -> Any:
        """Return a THOR Model when ``optimizer`` is THOR, else ``model`` unchanged.

        The new :class:`ThorModel` is built, as MindSpore's
        ``ModelThor``, from these arguments (not from ``model``): ``network``, ``loss_fn``,
        ``optimizer``, ``metrics``, ``amp_level``, ``loss_scale_manager`` (None: no loss
        scaling) and ``keep_batchnorm_fp32``; a :class:`~lit_amp.amp.cells.TrainOneStepCell`
        ``network`` is used as it is. lit_amp's ``trainer={...}`` options are carried over from
        ``model``. Its training alternates one second-order step with ``frequency - 1``
        first-order steps in sink and non-sink mode; ``fit`` refuses a validation set.

        Args:
            model: the Model to convert (returned as is for a non-THOR optimizer).
            network: the training network.
            loss_fn: the loss module.
            optimizer: the optimizer; THOR triggers the conversion.
            metrics: metric names or dict for evaluation.
            amp_level: "O0", "O1", "O2", "O3" or "auto".
            loss_scale_manager: a LossScaleManager or None.
            keep_batchnorm_fp32: keep BatchNorm in float32 (overrides the level).

        Returns:
            A ``ThorModel``, or ``model``.

        Raises:
            TypeError, ValueError: as :class:`~lit_amp.Model` for bad arguments.
        """
        thor_opt = optimizer
        if not isinstance(thor_opt, THOR):
            inner = getattr(network, "optimizer", None)
            if not (optimizer is None and isinstance(inner, THOR) and _is_train_cell(network)):
                return model
        trainer = getattr(model, "_trainer_kwargs", None) or None
        if _is_train_cell(network):
            return ThorModel(network, trainer=trainer)
        return ThorModel(
            network,
            loss_fn=loss_fn,
            optimizer=optimizer,
            metrics=metrics,
            amp_level=amp_level,
            trainer=trainer,
            loss_scale_manager=loss_scale_manager,
            keep_batchnorm_fp32=keep_batchnorm_fp32,
        )


def _is_train_cell(network: Any) -> bool:
    return isinstance(network, TrainOneStepCell)
