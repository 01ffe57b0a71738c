"""MindSpore's ``LearningRateScheduler``: set the learning rate from a function of the step."""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable

import torch

from lit_amp.callbacks.base import Callback, RunContext

__all__ = ["LearningRateScheduler"]

log = logging.getLogger(__name__)


class LearningRateScheduler(Callback):
    """Change the learning rate at every train step end: ``new = fn(lr, cur_step_num)``.

    ``lr`` is the current learning rate of the optimizer's first param group. When ``new``
    differs from it (relative tolerance 1e-10), it is assigned to every param group of
    ``cb_params.optimizer`` (a torch optimizer). ``cur_step_num`` counts the steps of the
    current ``train`` / ``fit`` call, so a call resumed with ``initial_epoch=k`` starts the
    schedule again at step 1, as in MindSpore 2.10.

    Args:
        learning_rate_function: a callable ``(lr: float, cur_step_num: int) -> float``.

    Raises:
        TypeError: ``learning_rate_function`` is not callable; at a step end, it returned
            something other than a real number.
        ValueError: at a step end, ``cb_params.optimizer`` is not a torch optimizer.

    Example:
        >>> import torch
        >>> from lit_amp.callbacks.base import RunContext
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        >>> cb = LearningRateScheduler(lambda lr, step: lr * 0.1 if step % 2 == 0 else lr)
        >>> cb.on_train_step_end(RunContext({"optimizer": opt, "cur_step_num": 2}))
        >>> round(opt.param_groups[0]["lr"], 6)
        0.01
    """

    def __init__(self, learning_rate_function: Callable[[float, int], float]) -> None:
        super().__init__()
        if not callable(learning_rate_function):
            raise TypeError(
                "For 'LearningRateScheduler', the argument 'learning_rate_function' must be "
                "callable as fn(lr, cur_step_num) -> float, but got "
                f"{learning_rate_function!r} of type {type(learning_rate_function).__name__}."
            )
        self.learning_rate_function = learning_rate_function

    def on_train_step_end(self, run_context: RunContext) -> None:
        """Compute the new learning rate and assign it to every param group if it changed."""
        cb = run_context.original_args()
        optimizer = cb.get("optimizer")
        if optimizer is None or not getattr(optimizer, "param_groups", None):
            raise ValueError(
                "For 'LearningRateScheduler', cb_params.optimizer must be a torch optimizer "
                f"with param groups, but got {type(optimizer).__name__}."
            )
        groups = optimizer.param_groups
        cur = groups[0]["lr"]
        lr = float(cur.item()) if isinstance(cur, torch.Tensor) else float(cur)
        step = cb.get("cur_step_num", 0)
        new_lr = self.learning_rate_function(lr, step)
        if isinstance(new_lr, torch.Tensor) and new_lr.numel() == 1:
            new_lr = float(new_lr.item())
        if isinstance(new_lr, bool) or not isinstance(new_lr, numbers.Real):
            raise TypeError(
                "For 'LearningRateScheduler', 'learning_rate_function' must return a real "
                f"number, but returned {new_lr!r} of type {type(new_lr).__name__}."
            )
        new_lr = float(new_lr)
        if math.isclose(lr, new_lr, rel_tol=1e-10):
            return
        for group in groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(new_lr)
            else:
                group["lr"] = new_lr
        log.info("At step %s, learning_rate changed to %s.", step, new_lr)
