"""MindSpore-style callbacks: the protocol, the built-ins and the Lightning bridge.

In a plain Lightning ``Trainer`` wrap them with :func:`to_lightning`.

Names are imported lazily (PEP 562).

Example:
    >>> from lit_amp.callbacks import Callback, RunContext, LossMonitor
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "Callback": "lit_amp.callbacks.base",
    "RunContext": "lit_amp.callbacks.base",
    "InternalCallbackParam": "lit_amp.callbacks.base",
    "CallbackList": "lit_amp.callbacks.base",
    "MindSporeCallbackBridge": "lit_amp.callbacks.bridge",
    "LightningCallbacks": "lit_amp.callbacks.adapter",
    "to_lightning": "lit_amp.callbacks.adapter",
    "LossMonitor": "lit_amp.callbacks.loss_monitor",
    "TimeMonitor": "lit_amp.callbacks.time_monitor",
    "ModelCheckpoint": "lit_amp.callbacks.checkpoint",
    "CheckpointConfig": "lit_amp.callbacks.checkpoint_config",
    "EarlyStopping": "lit_amp.callbacks.early_stopping",
    "ReduceLROnPlateau": "lit_amp.callbacks.reduce_lr_on_plateau",
    "LearningRateScheduler": "lit_amp.callbacks.lr_scheduler",
    "LambdaCallback": "lit_amp.callbacks.lambda_callback",
    "History": "lit_amp.callbacks.history",
    "OnRequestExit": "lit_amp.callbacks.on_request_exit",
    "BackupAndRestore": "lit_amp.callbacks.backup_and_restore",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
