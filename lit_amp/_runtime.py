"""Facts about the running torch process that every layer asks: is a process group up, what is
this rank and the world size, which torch optimizer sits behind a wrapper.

Example:
    >>> dist_ready(), rank(), world_size()
    (False, 0, 1)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["dist_ready", "rank", "unwrap_optimizer", "world_size"]


def dist_ready() -> bool:
    """Whether ``torch.distributed`` is built in and a default process group is initialized."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank in the default group (0 without one)."""
    return dist.get_rank() if dist_ready() else 0


def world_size() -> int:
    """The default group's size (1 without one)."""
    return dist.get_world_size() if dist_ready() else 1


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer behind a wrapper such as Lightning's ``LightningOptimizer``.

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> unwrap_optimizer(opt) is opt
        True
    """
    return getattr(optimizer, "_optimizer", optimizer)
