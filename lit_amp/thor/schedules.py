"""THOR's per-step learning-rate and damping schedules (MindSpore's ResNet-50 THOR recipe).

Both return a 1-D float32 tensor with one value per step from ``global_step`` on, the form
:func:`~lit_amp.thor.thor` takes (model zoo ``src/lr_generator.py``, docs/semantics.md §4.4):

- ``lr(step) = lr_init · (1 − epoch/total_epochs)^decay``, with ``epoch = (step+1) /
  steps_per_epoch``; halved from ``decay_epochs`` on and halved again one epoch later.
- ``damping(step) = damping_init · decay_rate^(epoch/10)``.

Example:
    >>> lr = get_thor_lr(0, 0.05803, 4.0839, 53, 5004, decay_epochs=39)
    >>> damping = get_thor_damping(0, 0.03, 0.50036, 70, 5004)
    >>> lr.shape, damping.shape
    (torch.Size([265212]), torch.Size([350280]))
"""

from __future__ import annotations

import torch

from lit_amp._validation import check_int, check_number

__all__ = ["get_thor_lr", "get_thor_damping"]


def get_thor_lr(
    global_step: int,
    lr_init: float,
    decay: float,
    total_epochs: int,
    steps_per_epoch: int,
    decay_epochs: int = 100,
) -> torch.Tensor:
    """Polynomial-decay learning rate per step, as MindSpore's ``get_thor_lr``.

    Args:
        global_step: first step to return (resume); values before it are dropped.
        lr_init: initial learning rate.
        decay: the polynomial power.
        total_epochs: epochs over which the rate decays to 0 (MindSpore's recipes pass
            ``lr_end_epoch``, larger than the epochs actually trained).
        steps_per_epoch: optimizer steps per epoch.
        decay_epochs: epoch from which the rate is halved, and halved again one epoch later.

    Returns:
        float32 tensor of ``total_epochs * steps_per_epoch - global_step`` values.

    Raises:
        TypeError: a non-int count or a non-number rate.
        ValueError: ``total_epochs`` or ``steps_per_epoch`` < 1, ``global_step`` < 0, a NaN or
            infinite rate.

    Example:
        >>> get_thor_lr(0, 0.1, 1.0, 2, 2)
        tensor([0.0750, 0.0500, 0.0250, 0.0000])
    """
    owner = "get_thor_lr"
    global_step = check_int(owner, "global_step", global_step, minimum=0)
    total_epochs = check_int(owner, "total_epochs", total_epochs, minimum=1)
    steps_per_epoch = check_int(owner, "steps_per_epoch", steps_per_epoch, minimum=1)
    decay_epochs = check_int(owner, "decay_epochs", decay_epochs, minimum=0)
    lr_init = check_number(owner, "lr_init", lr_init)
    decay = check_number(owner, "decay", decay)
    total = total_epochs * steps_per_epoch
    epoch = (torch.arange(total, dtype=torch.float64) + 1) / steps_per_epoch
    base = (1.0 - epoch / total_epochs).clamp_min(0.0) ** decay
    lr = lr_init * base
    lr = torch.where(epoch >= decay_epochs, lr * 0.5, lr)
    lr = torch.where(epoch >= decay_epochs + 1, lr * 0.5, lr)
    return lr.float()[global_step:]


def get_thor_damping(
    global_step: int,
    damping_init: float,
    decay_rate: float,
    total_epochs: int,
    steps_per_epoch: int,
) -> torch.Tensor:
    """Exponentially decaying damping per step, as MindSpore's ``get_thor_damping``.

    Args:
        global_step: first step to return (resume).
        damping_init: initial damping λ.
        decay_rate: λ is multiplied by ``decay_rate`` every 10 epochs (continuously).
        total_epochs: epochs covered.
        steps_per_epoch: optimizer steps per epoch.

    Returns:
        float32 tensor of ``total_epochs * steps_per_epoch - global_step`` values.

    Raises:
        TypeError: a non-int count or a non-number rate.
        ValueError: ``total_epochs`` or ``steps_per_epoch`` < 1, ``global_step`` < 0, a NaN or
            infinite rate.

    Example:
        >>> get_thor_damping(0, 0.03, 0.5, 20, 1)[[9, 19]]
        tensor([0.0150, 0.0075])
    """
    owner = "get_thor_damping"
    global_step = check_int(owner, "global_step", global_step, minimum=0)
    total_epochs = check_int(owner, "total_epochs", total_epochs, minimum=1)
    steps_per_epoch = check_int(owner, "steps_per_epoch", steps_per_epoch, minimum=1)
    damping_init = check_number(owner, "damping_init", damping_init)
    decay_rate = check_number(owner, "decay_rate", decay_rate)
    total = total_epochs * steps_per_epoch
    epoch = (torch.arange(total, dtype=torch.float64) + 1) / steps_per_epoch
    damping = damping_init * decay_rate ** (epoch / 10.0)
    return damping.float()[global_step:]
