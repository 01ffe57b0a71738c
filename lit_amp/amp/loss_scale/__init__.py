"""Loss scaling in pure PyTorch: MindSpore's managers and scalers, driven by one engine.

Read :mod:`~lit_amp.amp.loss_scale.controller` first: :class:`LossScaleController` is the
engine every lit_amp train step uses (``Model``, ``LitModel``, ``build_train_network`` and the
``AmpPrecision`` Lightning plugin). It is configured by a MindSpore loss-scale manager and
follows its update cell:

* :mod:`~lit_amp.amp.loss_scale.controller` - :class:`LossScaleController`: scale the loss,
  unscale the gradients, check for overflow (all-reduced), skip the step, update the scale.
* :mod:`~lit_amp.amp.loss_scale.managers` - ``FixedLossScaleManager``,
  ``DynamicLossScaleManager`` and their update cells (MindSpore's ``LossScaleManager`` family).
* :mod:`~lit_amp.amp.loss_scale.scalers` - ``StaticLossScaler``, ``DynamicLossScaler``,
  ``all_finite``: MindSpore's functional ``amp.*LossScaler`` API for hand-written loops.

Example:
    >>> ctl = LossScaleController(DynamicLossScaleManager(init_loss_scale=2.0**8))
    >>> ctl.enabled, ctl.scale
    (True, 256.0)
"""

from lit_amp.amp.loss_scale.controller import LossScaleController
from lit_amp.amp.loss_scale.managers import (
    DynamicLossScaleManager,
    DynamicLossScaleUpdateCell,
    FixedLossScaleManager,
    FixedLossScaleUpdateCell,
    LossScaleManager,
)
from lit_amp.amp.loss_scale.scalers import (
    DynamicLossScaler,
    LossScaler,
    StaticLossScaler,
    all_finite,
    init_status,
)

__all__ = [
    "LossScaleController",
    "LossScaleManager",
    "FixedLossScaleManager",
    "DynamicLossScaleManager",
    "FixedLossScaleUpdateCell",
    "DynamicLossScaleUpdateCell",
    "LossScaler",
    "StaticLossScaler",
    "DynamicLossScaler",
    "all_finite",
    "init_status",
]
