"""Re-export of :mod:`lit_amp.amp.loss_scale.managers` (the import path of earlier releases)."""

from lit_amp.amp.loss_scale.managers import (
    DynamicLossScaleManager,
    DynamicLossScaleUpdateCell,
    FixedLossScaleManager,
    FixedLossScaleUpdateCell,
    LossScaleManager,
)

__all__ = [
    "LossScaleManager",
    "FixedLossScaleManager",
    "DynamicLossScaleManager",
    "FixedLossScaleUpdateCell",
    "DynamicLossScaleUpdateCell",
]
