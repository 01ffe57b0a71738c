"""Re-export of :mod:`lit_amp.amp.loss_scale.controller` (the import path of earlier releases)."""

from lit_amp.amp.loss_scale.controller import LossScaleController

__all__ = ["LossScaleController"]
