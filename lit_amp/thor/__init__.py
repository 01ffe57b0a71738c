"""``lit_amp.thor``: MindSpore's ``nn.thor``, callable, re-exporting THOR's two halves.

- :func:`thor` / :class:`THOR`, :class:`ParamInfo`, :func:`get_thor_lr`,
  :func:`get_thor_damping` — the optimizer, from :mod:`lit_amp.optim.thor` (pure PyTorch);
- :class:`ConvertModelUtils`, :class:`ThorModel` — the Model side, from
  :mod:`lit_amp.model.thor`, imported on first use (it imports Lightning).

``lit_amp.thor(net, lr, damping, momentum, ...)`` calls :func:`thor`, and dotted paths such as
Hydra's ``_target_: lit_amp.thor.thor`` resolve: the subpackage itself is the callable (see
:mod:`lit_amp._lazy` on why the name must not be bound to the function).

Example:
    >>> from torch import nn
    >>> from lit_amp import thor
    >>> opt = thor(nn.Linear(4, 2), 0.05, 0.03, momentum=0.9, frequency=10)
    >>> thor.get_thor_lr(0, 0.05, 2.0, total_epochs=2, steps_per_epoch=1).shape
    torch.Size([2])
"""

import sys
import types
from typing import Any

from lit_amp._lazy import lazy_exports
from lit_amp.optim.thor import THOR, ParamInfo, get_thor_damping, get_thor_lr, thor

__all__ = [
    "thor",
    "THOR",
    "ParamInfo",
    "ConvertModelUtils",
    "ThorModel",
    "get_thor_lr",
    "get_thor_damping",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {"ConvertModelUtils": "lit_amp.model.thor", "ThorModel": "lit_amp.model.thor"},
    globals(),
)


class _CallableThorModule(types.ModuleType):
    """``lit_amp.thor`` is this subpackage and, like MindSpore's ``nn.thor``, the optimizer
    factory: ``lit_amp.thor(net, lr, damping, momentum, ...)`` calls :func:`thor`."""

    def __call__(self, *args: Any, **kwargs: Any) -> THOR:
        return thor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableThorModule
