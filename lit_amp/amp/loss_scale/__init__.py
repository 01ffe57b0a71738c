"""Loss scaling in pure PyTorch: MindSpore's managers and scalers, driven by one engine.

Read :mod:`~lit_amp.amp.loss_scale.controller` first: :class:`LossScaleController` is the
engine every lit_amp train step uses (``Model``, ``LitModel``, ``build_train_network`` and the
``AmpPrecision`` Lightning plugin). It is configured by a MindSpore loss-scale manager and
follows its update cell:

* :mod:`~lit_amp.amp.loss_scale.controller` - :class:`LossScaleController`: scale the loss,
  unscale the gradients, check for overflow (all-reduced), skip the step, update the scale;
  its ``apply`` is the one driver of every scaled step.
* :mod:`~lit_amp.amp.loss_scale.unscale` - the controller's gradient pass: fused
  unscale-and-check, an optimizer's declared ``loss_scale``, the overflow flag all ranks share.
* :mod:`~lit_amp.amp.loss_scale.rule` - :func:`next_scale_state`: MindSpore's dynamic rule,
  one function for host numbers and device tensors, which every dynamic scale moves by.
* :mod:`~lit_amp.amp.loss_scale.managers` - ``FixedLossScaleManager``,
  ``DynamicLossScaleManager`` and their update cells (MindSpore's ``LossScaleManager`` family).
* :mod:`~lit_amp.amp.loss_scale.scalers` - ``StaticLossScaler``, ``DynamicLossScaler``,
  ``all_finite``: MindSpore's functional ``amp.*LossScaler`` API for hand-written loops.

Example:
    >>> from lit_amp.amp.loss_scale import DynamicLossScaleManager, LossScaleController
    >>> ctl = LossScaleController(DynamicLossScaleManager(init_loss_scale=2.0**8))
    >>> ctl.enabled, ctl.scale
    (True, 256.0)
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "LossScaleController": "lit_amp.amp.loss_scale.controller",
    "AppliedStep": "lit_amp.amp.loss_scale.controller",
    "DynamicScaleRule": "lit_amp.amp.loss_scale.rule",
    "next_scale_state": "lit_amp.amp.loss_scale.rule",
    "LossScaleManager": "lit_amp.amp.loss_scale.managers",
    "FixedLossScaleManager": "lit_amp.amp.loss_scale.managers",
    "DynamicLossScaleManager": "lit_amp.amp.loss_scale.managers",
    "FixedLossScaleUpdateCell": "lit_amp.amp.loss_scale.managers",
    "DynamicLossScaleUpdateCell": "lit_amp.amp.loss_scale.managers",
    "LossScaler": "lit_amp.amp.loss_scale.scalers",
    "StaticLossScaler": "lit_amp.amp.loss_scale.scalers",
    "DynamicLossScaler": "lit_amp.amp.loss_scale.scalers",
    "all_finite": "lit_amp.amp.loss_scale.scalers",
    "init_status": "lit_amp.amp.loss_scale.scalers",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
