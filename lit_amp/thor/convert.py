"""``ConvertModelUtils.convert_to_thor_model``: MindSpore's switch of a Model to THOR training.

Pure PyTorch at import time: the Lightning-based :class:`~lit_amp.thor.model_thor.ThorModel` is
imported only when a model is actually converted.

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
    >>> type(model).__name__
    'ThorModel'
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lit_amp.thor.optimizer import THOR

__all__ = ["ConvertModelUtils"]


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

        The new :class:`~lit_amp.thor.model_thor.ThorModel` is built, as MindSpore's
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
        from lit_amp.thor.model_thor import ThorModel

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
    from lit_amp.amp.cells import TrainOneStepCell

    return isinstance(network, TrainOneStepCell)
