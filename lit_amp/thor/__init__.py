"""THOR, MindSpore's second-order optimizer; the package is callable, as MindSpore's ``nn.thor``.

``lit_amp.thor(net, lr, damping, momentum, ...)`` calls :func:`~lit_amp.thor.optimizer.thor`.
The optimizer (:mod:`.optimizer`, :mod:`.factors`, :mod:`.schedules`) is pure PyTorch;
``ConvertModelUtils`` / ``ThorModel`` (:mod:`.convert`) build a Model, so they import
Lightning, on first use. Names are imported lazily (PEP 562).

Example:
    >>> from torch import nn
    >>> from lit_amp import thor
    >>> opt = thor(nn.Linear(4, 2), 0.05, 0.03, momentum=0.9, frequency=10)
    >>> thor.get_thor_lr(0, 0.05, 2.0, total_epochs=2, steps_per_epoch=1).shape
    torch.Size([2])
"""

from __future__ import annotations

import sys
import types
from typing import Any

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "thor": "lit_amp.thor.optimizer",
    "THOR": "lit_amp.thor.optimizer",
    "ParamInfo": "lit_amp.thor.optimizer",
    "DEFAULT_FACTOR_DECAY": "lit_amp.thor.optimizer",
    "DEFAULT_TRACE_THRESHOLDS": "lit_amp.thor.optimizer",
    "RECOMMENDED_RECIPE": "lit_amp.thor.optimizer",
    "get_thor_lr": "lit_amp.thor.schedules",
    "get_thor_damping": "lit_amp.thor.schedules",
    "ConvertModelUtils": "lit_amp.thor.convert",
    "ThorModel": "lit_amp.thor.convert",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


class _CallableModule(types.ModuleType):
    # Python looks ``__call__`` up on the type, never on the module, so a callable package
    # (MindSpore's ``nn.thor``, also a dotted path for Hydra) needs a ModuleType subclass
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.thor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
