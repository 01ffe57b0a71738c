"""lit_amp: MindSpore's high-level training API as PyTorch Lightning components.

Public names are imported lazily (PEP 562), so ``import lit_amp`` stays cheap and the pure
PyTorch parts (``lit_amp.amp``) never import Lightning.

Example:
    >>> from lit_amp import Model, LitModel
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "Model": "lit_amp.model.model",
    "LitModel": "lit_amp.model.lit_model",
    "save_checkpoint": "lit_amp.serialization",
    "load_checkpoint": "lit_amp.serialization",
    "load_param_into_net": "lit_amp.serialization",
    "WithLossCell": "lit_amp.amp.cells",
    "WithEvalCell": "lit_amp.amp.cells",
    "TrainOneStepCell": "lit_amp.amp.cells",
    "auto_mixed_precision": "lit_amp.amp.convert",
    "custom_mixed_precision": "lit_amp.amp.convert",
    "get_white_list": "lit_amp.amp.lists",
    "get_black_list": "lit_amp.amp.lists",
    "build_train_network": "lit_amp.amp.build",
    "LossScaleManager": "lit_amp.amp.loss_scale.managers",
    "FixedLossScaleManager": "lit_amp.amp.loss_scale.managers",
    "DynamicLossScaleManager": "lit_amp.amp.loss_scale.managers",
    "StaticLossScaler": "lit_amp.amp.loss_scale.scalers",
    "DynamicLossScaler": "lit_amp.amp.loss_scale.scalers",
    "all_finite": "lit_amp.amp.loss_scale.scalers",
    "AmpPrecision": "lit_amp.plugins.precision.amp",
    "RecModel": "lit_amp.rec.rec_model",
    "AutoBoost": "lit_amp.boost.auto_boost",
    "thor": "lit_amp.thor",
    "ConvertModelUtils": "lit_amp.thor.convert",
    "AmpFSDPPrecision": "lit_amp.plugins.precision.fsdp",
    "OverflowDiagnostics": "lit_amp.amp.diagnostics",
    "remove_mixed_precision": "lit_amp.amp.convert",
    "resolve_amp_config": "lit_amp.amp.levels",
    "apply_amp_config": "lit_amp.amp.convert",
    "AmpConfig": "lit_amp.amp.levels",
    "StopOptions": "lit_amp.rec.online.options",
    "CheckpointOptions": "lit_amp.rec.online.options",
    "PublishOptions": "lit_amp.rec.online.options",
    "ValidationOptions": "lit_amp.rec.online.options",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
