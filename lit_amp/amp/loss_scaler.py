"""Re-export of :mod:`lit_amp.amp.loss_scale.scalers` (the import path of earlier releases)."""

from lit_amp.amp.loss_scale.scalers import (
    DynamicLossScaler,
    LossScaler,
    StaticLossScaler,
    all_finite,
    init_status,
)

__all__ = ["LossScaler", "StaticLossScaler", "DynamicLossScaler", "all_finite", "init_status"]
