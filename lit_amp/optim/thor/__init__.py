"""THOR, MindSpore's second-order optimizer, as a ``torch.optim.Optimizer`` (pure PyTorch).

- :mod:`~lit_amp.optim.thor.optimizer` — :func:`thor` / :class:`THOR` and :class:`ParamInfo`;
- :mod:`~lit_amp.optim.thor.schedules` — :func:`get_thor_lr`, :func:`get_thor_damping`,
  MindSpore's per-step schedules;
- :mod:`~lit_amp.optim.thor.factors` — the layer statistics and block-diagonal inverses.

The Model side (``ThorModel``, ``ConvertModelUtils``) is :mod:`lit_amp.model.thor`; the
callable :mod:`lit_amp.thor` re-exports both halves under MindSpore's names.

Example:
    >>> from torch import nn
    >>> from lit_amp.optim.thor import thor, get_thor_lr, get_thor_damping
    >>> net = nn.Sequential(nn.Linear(40, 100), nn.ReLU(), nn.Linear(100, 10))
    >>> lr = get_thor_lr(0, 0.05, 2.0, total_epochs=20, steps_per_epoch=40)
    >>> damping = get_thor_damping(0, 0.03, 0.5, total_epochs=20, steps_per_epoch=40)
    >>> thor(net, lr, damping, momentum=0.9, frequency=10).get_frequency()
    10

    The recommended recipe (K-FAC's damping split and bias column; a constant damping):

    >>> from lit_amp.optim.thor import RECOMMENDED_RECIPE
    >>> opt = thor(net, lr, 0.03, 0.9, weight_decay=0.02, **RECOMMENDED_RECIPE)
    >>> opt.pi_damping, opt.layers[0].bias is not None, opt.get_frequency()
    (True, True, 10)
"""

from lit_amp.optim.thor.optimizer import (
    DEFAULT_FACTOR_DECAY,
    DEFAULT_TRACE_THRESHOLDS,
    RECOMMENDED_RECIPE,
    THOR,
    ParamInfo,
    thor,
)
from lit_amp.optim.thor.schedules import get_thor_damping, get_thor_lr

__all__ = [
    "thor",
    "THOR",
    "ParamInfo",
    "get_thor_lr",
    "get_thor_damping",
    "DEFAULT_FACTOR_DECAY",
    "DEFAULT_TRACE_THRESHOLDS",
    "RECOMMENDED_RECIPE",
]
