"""THOR, MindSpore's second-order optimizer, and ``ConvertModelUtils`` (pure PyTorch).

- :func:`thor` / :class:`THOR` — the optimizer (``torch.optim.Optimizer``).
- :func:`get_thor_lr`, :func:`get_thor_damping` — MindSpore's per-step schedules.
- :class:`ConvertModelUtils` — ``convert_to_thor_model`` (imports Lightning only when used).
- :mod:`lit_amp.thor.factors` — the layer statistics and block-diagonal inverses.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from lit_amp.thor import thor, get_thor_lr, get_thor_damping
    >>> net = nn.Sequential(nn.Linear(40, 100), nn.ReLU(), nn.Linear(100, 10))
    >>> lr = get_thor_lr(0, 0.05, 2.0, total_epochs=20, steps_per_epoch=40)
    >>> damping = get_thor_damping(0, 0.03, 0.5, total_epochs=20, steps_per_epoch=40)
    >>> opt = thor(net, lr, damping, momentum=0.9, frequency=10)
"""

import sys
import types

from lit_amp.thor.convert import ConvertModelUtils
from lit_amp.thor.optimizer import THOR, ParamInfo, thor
from lit_amp.thor.schedules import get_thor_damping, get_thor_lr


class _CallableThorModule(types.ModuleType):
    """``lit_amp.thor`` is this subpackage and, like MindSpore's ``nn.thor``, the optimizer
    factory: ``lit_amp.thor(net, lr, damping, momentum, ...)`` calls :func:`thor`."""

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        return thor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableThorModule

__all__ = [
    "thor",
    "THOR",
    "ParamInfo",
    "ConvertModelUtils",
    "get_thor_lr",
    "get_thor_damping",
]
