"""Optimizers in pure PyTorch (no Lightning): MindSpore's THOR.

- :mod:`lit_amp.optim.thor` — THOR, the second-order optimizer, and its schedules
  (also reachable as the callable :mod:`lit_amp.thor`, MindSpore's ``nn.thor``).

Example:
    >>> from torch import nn
    >>> from lit_amp.optim import THOR
    >>> THOR(nn.Linear(4, 2), 0.1, 0.03, 0.9, frequency=1).get_frequency()
    1
"""

from lit_amp.optim.thor import THOR, ParamInfo, get_thor_damping, get_thor_lr, thor

__all__ = ["THOR", "ParamInfo", "thor", "get_thor_lr", "get_thor_damping"]
