"""THOR's argument checks and per-step schedules (split out of :mod:`.optimizer`).

Cut out of the optimizer module so that ``THOR.__init__`` reads as "check, then build": every
function here validates one argument (or one group of related ones) with the shared
:mod:`lit_amp._validation` helpers, owner ``'thor'`` (the public name users call), and returns
the normalised value. :class:`Schedule` reads ``learning_rate`` and ``damping`` in any of the
forms MindSpore and lit_amp accept (a float, per-step values or a callable of the step);
:func:`placed_start` says where a per-step array sits when a checkpoint is loaded.

Example:
    >>> Schedule("damping", [0.3, 0.2]).at(1)
    0.2
    >>> check_trace_thresholds((0.1, 0.2))
    Traceback (most recent call last):
    ...
    ValueError: For 'thor', the argument 'trace_thresholds' must be a pair (omega1, omega2) with 0 <= omega2 <= omega1, but got (0.1, 0.2).
"""  # noqa: E501

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from lit_amp._validation import (
    check_bool,
    check_int,
    check_number,
    check_positive_number,
    type_error,
    value_error,
)

__all__ = [
    "OWNER",
    "Schedule",
    "check_group_defaults",
    "check_trace_thresholds",
    "check_factor_decay",
    "check_callable",
    "check_grad_scale",
    "check_skip_layers",
    "check_split_indices",
    "check_no_sparse_embedding",
    "check_split_dim",
    "schedule_state",
    "placed_start",
]

#: The public name in every message (MindSpore's ``nn.thor``).
OWNER = "thor"

_SCHEDULE_FORMS = "a float, a 1-D tensor (or array / list) of per-step values, or a callable of " \
                  "the step"


class Schedule:
    """A float, a per-step sequence, or a callable of the step, read as ``at(step)``.

    Args:
        name: the argument (``"learning_rate"`` or ``"damping"``), for messages.
        value: a float, a 0-d / 1-D tensor or numpy array, a non-empty list of numbers, or a
            callable ``step -> float``.

    Raises:
        TypeError: ``value`` is none of these forms (a bool is not a float).
        ValueError: an empty or multi-dimensional tensor, a negative or non-finite value.

    Example:
        >>> Schedule("learning_rate", 0.1).at(7), Schedule("learning_rate", lambda s: s).at(3)
        (0.1, 3.0)
    """

    __slots__ = ("name", "const", "values", "fn")

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.const: float | None = None
        self.values: list[float] | None = None
        self.fn: Callable[[int], Any] | None = None
        if isinstance(value, bool):
            raise type_error(OWNER, name, _SCHEDULE_FORMS, value)
        if isinstance(value, (int, float)):
            self.const = float(value)
        elif isinstance(value, Tensor) or _is_ndarray(value):
            self._read_tensor(torch.as_tensor(value).detach(), value)
        elif (
            isinstance(value, (list, tuple))
            and value
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        ):
            self.values = [float(v) for v in value]
        elif callable(value):
            self.fn = value
        else:
            raise type_error(OWNER, name, _SCHEDULE_FORMS, value)
        for v in [self.const] if self.const is not None else (self.values or []):
            if not math.isfinite(v) or v < 0:
                raise value_error(OWNER, name, "finite values >= 0", v)

    def _read_tensor(self, t: Tensor, value: Any) -> None:
        if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
            raise type_error(OWNER, self.name, _SCHEDULE_FORMS, value)
        if t.dim() == 0:
            self.const = float(t)
        elif t.dim() == 1 and t.numel() > 0:
            self.values = t.double().cpu().tolist()
        else:
            raise ValueError(
                f"For '{OWNER}', the argument '{self.name}' must be a float, a non-empty 1-D "
                f"tensor of per-step values or a callable of the step, but got a tensor of shape "
                f"{tuple(t.shape)}."
            )

    @property
    def first(self) -> float:
        """The value at step 0 for a float or a sequence (nan for a callable)."""
        if self.const is not None:
            return self.const
        if self.values is not None:
            return self.values[0]
        return float("nan")

    def at(self, step: int) -> float:
        """The value at ``step``.

        Raises:
            ValueError: per-step values that do not reach ``step``.
        """
        if self.const is not None:
            return self.const
        if self.values is not None:
            if step >= len(self.values):
                raise ValueError(
                    f"For '{OWNER}', the argument '{self.name}' holds {len(self.values)} per-step "
                    f"values but step {step} needs one: make the array cover every training "
                    f"step (steps per epoch x epochs), as MindSpore requires."
                )
            return self.values[step]
        assert self.fn is not None
        v = self.fn(step)
        return float(v.item() if isinstance(v, Tensor) else v)


def _is_ndarray(value: Any) -> bool:
    return type(value).__module__ == "numpy" and hasattr(value, "shape")


def check_group_defaults(
    lr: float, momentum: Any, weight_decay: Any, loss_scale: Any, use_nesterov: Any
) -> dict[str, Any]:
    """The param-group defaults (torch's key names) from THOR's first-order arguments.

    ``lr`` is the schedule's first value (nan for a callable becomes 0.0: the step sets it).

    Raises:
        TypeError: a non-number ``momentum`` / ``weight_decay`` / ``loss_scale``, a non-bool
            ``use_nesterov``.
        ValueError: ``momentum`` or ``weight_decay`` < 0, ``loss_scale`` <= 0, Nesterov without
            momentum.

    Example:
        >>> check_group_defaults(0.1, 0.9, 0, 1, False)["momentum"]
        0.9
    """
    momentum = check_number(OWNER, "momentum", momentum, minimum=0.0)
    weight_decay = check_number(OWNER, "weight_decay", weight_decay, minimum=0.0)
    loss_scale = check_positive_number(OWNER, "loss_scale", loss_scale)
    check_bool(OWNER, "use_nesterov", use_nesterov)
    if use_nesterov and momentum == 0:
        raise ValueError(
            f"For '{OWNER}', 'use_nesterov=True' needs 'momentum' > 0, but got momentum=0.0."
        )
    return {
        "lr": 0.0 if math.isnan(lr) else lr,
        "momentum": momentum,
        "weight_decay": weight_decay,
        "nesterov": use_nesterov,
        "loss_scale": loss_scale,
    }


def check_factor_decay(value: Any) -> float:
    """The running-average coefficient β, a number in [0, 1).

    Example:
        >>> check_factor_decay(0)
        0.0
    """
    allowed = "a finite number in [0, 1)"
    beta = check_number(OWNER, "factor_decay", value, minimum=0.0)
    if beta >= 1.0:
        raise value_error(OWNER, "factor_decay", allowed, value)
    return beta


def check_trace_thresholds(value: Any) -> tuple[float, float]:
    """The trace rule's (ω1, ω2), two finite numbers with 0 <= ω2 <= ω1.

    Example:
        >>> check_trace_thresholds([0.01, 0])
        (0.01, 0.0)
    """
    allowed = "a pair (omega1, omega2) with 0 <= omega2 <= omega1"
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or any(isinstance(w, bool) or not isinstance(w, (int, float)) for w in value)
    ):
        raise type_error(OWNER, "trace_thresholds", allowed, value)
    w1, w2 = float(value[0]), float(value[1])
    if not (0.0 <= w2 <= w1) or not math.isfinite(w1):
        raise value_error(OWNER, "trace_thresholds", allowed, value)
    return w1, w2


def check_callable(name: str, value: Any, allowed: str) -> Any:
    """``value`` if it is callable or None.

    Example:
        >>> check_callable("decay_filter", None, "a callable ParamInfo -> bool") is None
        True
    """
    if value is not None and not callable(value):
        raise type_error(OWNER, name, f"{allowed} or None", value)
    return value


def check_grad_scale(value: Any) -> Any:
    """``grad_scale``: None, a callable returning the scale, or a finite number > 0.

    Example:
        >>> check_grad_scale(128)
        128
    """
    if value is not None and not callable(value):
        check_positive_number(OWNER, "grad_scale", value)
    return value


def check_skip_layers(value: Any) -> tuple[str, ...]:
    """``skip_layers``: an iterable of module names (not a single str), as a tuple.

    Example:
        >>> check_skip_layers(["0", "head"])
        ('0', 'head')
    """
    if isinstance(value, str) or not isinstance(value, Iterable) or \
            not all(isinstance(s, str) for s in value):
        raise type_error(OWNER, "skip_layers", "a sequence of module names", value)
    return tuple(value)


def check_split_indices(value: Any, n_layers: int) -> list[int]:
    """The all-reduce bucket split points; None means one bucket (``[n_layers - 1]``).

    Example:
        >>> check_split_indices(None, 3), check_split_indices((0, 2), 3)
        ([2], [0, 2])
    """
    if value is None:
        return [max(n_layers - 1, 0)]
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        raise type_error(OWNER, "split_indices", "a list of ints or None", value)
    idx = list(value)
    if idx and (idx != sorted(set(idx)) or idx[0] < 0):
        raise value_error(OWNER, "split_indices", "increasing, non-negative layer indices", idx)
    return idx


def check_no_sparse_embedding(net: nn.Module) -> None:
    """Refuse a trainable ``nn.Embedding(sparse=True)`` (THOR needs dense gradients).

    Example:
        >>> check_no_sparse_embedding(nn.Embedding(3, 2, sparse=True))
        Traceback (most recent call last):
        ...
        ValueError: For 'thor', sparse gradients are not supported: an nn.Embedding with sparse=True was found; use sparse=False.
    """  # noqa: E501
    for module in net.modules():
        if isinstance(module, nn.Embedding) and module.sparse and module.weight.requires_grad:
            raise ValueError(
                f"For '{OWNER}', sparse gradients are not supported: an nn.Embedding with "
                "sparse=True was found; use sparse=False."
            )


def check_split_dim(value: Any) -> int | None:
    """``split_dim``: an int >= 1 or None (whole-factor inverses).

    Example:
        >>> check_split_dim(None), check_split_dim(64)
        (None, 64)
    """
    return check_int(OWNER, "split_dim", value, minimum=1, allow_none=True)


def schedule_state(schedule: Schedule, start: int) -> dict[str, Any] | None:
    """A per-step array (float64, exact) and the step of its index 0; None for other forms."""
    if schedule.values is None:
        return None
    return {"values": torch.tensor(schedule.values, dtype=torch.float64), "start": start}


def placed_start(schedule: Schedule, saved: Any, steps: int) -> int:
    """The step at which index 0 of ``schedule``'s per-step array sits after a load of a state
    saved at ``steps`` with the array ``saved``
    (:meth:`~lit_amp.thor.optimizer.THOR.load_state_dict`'s rules)."""
    if schedule.values is None or not isinstance(saved, dict):
        return 0  # a float or a callable; a state written before the arrays were saved
    theirs, start = saved["values"].tolist(), int(saved.get("start", 0))
    mine = schedule.values
    if mine == theirs:
        return start
    cut = len(theirs) - len(mine)  # both run to the same last step: mine starts ``cut`` later
    aligned = theirs[cut:] == mine if cut >= 0 else mine[-cut:] == theirs
    if not aligned or start + cut < 0:
        warnings.warn(
            f"THOR.load_state_dict: the per-step '{schedule.name}' array this optimizer was "
            f"built with ({len(mine)} values) is neither the checkpoint's ({len(theirs)} values) "
            f"nor that array cut at a step; it is indexed by the restored step counter "
            f"({steps}) as an array covering the whole run from step 0.",
            UserWarning, stacklevel=3,
        )
        return 0
    if start + cut > steps:
        raise ValueError(
            f"THOR.load_state_dict: the per-step '{schedule.name}' array this optimizer was "
            f"built with is the checkpoint's array from step {start + cut} on, but the "
            f"checkpoint was saved at step {steps}: cut the array at the checkpoint's step "
            f"(get_thor_lr({steps}, ...)), or pass the whole array."
        )
    return start + cut
