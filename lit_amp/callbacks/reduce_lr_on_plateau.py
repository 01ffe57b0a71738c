"""MindSpore's ``ReduceLROnPlateau``: lower the learning rate when a monitored value stalls."""

from __future__ import annotations

import logging
from typing import Any

import torch

from lit_amp._validation import (
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_str,
    type_error,
)
from lit_amp.callbacks._utils import (
    MONITOR_MODES,
    ImprovementMixin,
    available_monitors,
    is_min_mode,
    is_rank_zero,
    monitor_value,
)
from lit_amp.callbacks.base import Callback, RunContext

__all__ = ["ReduceLROnPlateau"]

log = logging.getLogger(__name__)


def _get_lr(group: dict) -> float:
    lr = group["lr"]
    return float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)


def _set_lr(group: dict, value: float) -> None:
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(value)
    else:
        group["lr"] = value


class ReduceLROnPlateau(ImprovementMixin, Callback):
    """Multiply the learning rate by ``factor`` when the monitored value stops improving.

    Runs at each train epoch end, reading the monitor like :class:`EarlyStopping` ("loss" from
    ``net_outputs``, other names from ``cb_params.eval_results``, averaged over processes under
    ``torch.distributed``; a missing value logs a warning and skips the epoch). The update rule
    is MindSpore's::

        if cooldown_counter > 0: cooldown_counter -= 1; wait = 0
        if improved: best = value; wait = 0
        elif cooldown_counter <= 0:
            wait += 1
            if wait >= patience:
                for each param group: if lr > min_lr: lr = max(lr * factor, min_lr)
                cooldown_counter = cooldown; wait = 0

    It acts on ``cb_params.optimizer.param_groups[i]["lr"]`` of a torch optimizer, every group
    (MindSpore supports a single fixed lr only). An lr scheduler that rewrites ``lr`` every step
    overrides these changes.

    Args:
        monitor: the quantity to watch ("loss", "eval_loss" or a metric name).
        factor: the multiplier, in the open interval (0, 1).
        patience: epochs without improvement before the lr is reduced (non-negative int).
        verbose: print (on rank 0) each reduction.
        mode: 'auto', 'min' or 'max' ('auto' as in :class:`EarlyStopping`).
        min_delta: the smallest change that counts as an improvement (its absolute value).
        cooldown: epochs to wait after a reduction before counting again (non-negative int).
        min_lr: the lower bound of the learning rate (non-negative).

    Raises:
        TypeError: an argument has the wrong type (``factor`` an int: MindSpore wants a float).
        ValueError: ``factor`` not in (0, 1); a negative ``patience``, ``cooldown`` or
            ``min_lr``; ``mode`` not 'auto', 'min' or 'max'; at an epoch end, no optimizer
            in ``cb_params`` or a non-scalar monitored value.

    Example:
        >>> import torch
        >>> from lit_amp.callbacks.base import RunContext
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
        >>> cb = ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1, min_delta=0)
        >>> for loss in [1.0, 1.0, 1.0]:
        ...     cb.on_train_epoch_end(RunContext({"optimizer": opt,
        ...                                       "net_outputs": torch.tensor(loss)}))
        >>> opt.param_groups[0]["lr"]
        0.25
    """

    def __init__(
        self,
        monitor: str = "eval_loss",
        factor: float = 0.1,
        patience: int = 10,
        verbose: bool = False,
        mode: str = "auto",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0,
    ) -> None:
        super().__init__()
        owner = "ReduceLROnPlateau"
        self.monitor = check_str(owner, "monitor", monitor)
        if isinstance(factor, int) and not isinstance(factor, bool):
            # MindSpore 2.10 takes a float only (an int is outside (0, 1) anyway)
            raise type_error(owner, "factor", "a float in the open interval (0, 1)", factor)
        factor = check_number(owner, "factor", factor)
        if not 0.0 < factor < 1.0:
            raise ValueError(
                f"For '{owner}', the argument 'factor' must be in the open interval (0, 1), but "
                f"got {factor}."
            )
        self.factor = float(factor)
        self.patience = check_int(owner, "patience", patience, minimum=0)
        self.verbose = check_bool(owner, "verbose", verbose)
        self.mode = check_choice(owner, "mode", check_str(owner, "mode", mode), MONITOR_MODES)
        self.min_delta = abs(float(check_number(owner, "min_delta", min_delta)))
        self.cooldown = check_int(owner, "cooldown", cooldown, minimum=0)
        self.min_lr = check_number(owner, "min_lr", min_lr, minimum=0.0)
        self._min_mode = is_min_mode(self.mode, self.monitor)
        self.cooldown_counter = 0
        self.wait = 0
        self.best = self._initial_best()

    def on_train_begin(self, run_context: RunContext | None) -> None:
        """Reset the counters and the best value."""
        self.cooldown_counter = 0
        self.wait = 0
        self.best = self._initial_best()

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        """Apply the update rule; reduce every param group's lr when patience ran out.

        Raises:
            ValueError: ``cb_params.optimizer`` is missing, or the monitored value is not a
                scalar.
        """
        cb = run_context.original_args()
        optimizer: Any = cb.get("optimizer")
        if optimizer is None or not hasattr(optimizer, "param_groups"):
            raise ValueError(
                "For 'ReduceLROnPlateau', cb_params.optimizer must be a torch optimizer (with "
                f"param_groups), but got {type(optimizer).__name__}."
            )
        current = monitor_value("ReduceLROnPlateau", self.monitor, cb)
        if current is None:
            log.warning(
                "Learning rate reduction is conditioned on %r, which is not available. "
                "Available choices are: %s",
                self.monitor,
                available_monitors(cb),
            )
            return
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if self.is_improvement(current, self.best):
            self.best = current
            self.wait = 0
        elif self.cooldown_counter <= 0:
            self.wait += 1
            if self.wait >= self.patience:
                for group in optimizer.param_groups:
                    lr = _get_lr(group)
                    if lr > self.min_lr:
                        new_lr = max(lr * self.factor, self.min_lr)
                        _set_lr(group, new_lr)
                        if self.verbose and is_rank_zero(cb):
                            print(
                                f"Epoch {cb.get('cur_epoch_num', 0):05d}: ReduceLROnPlateau "
                                f"reducing learning rate to {new_lr}.",
                                flush=True,
                            )
                self.cooldown_counter = self.cooldown
                self.wait = 0
