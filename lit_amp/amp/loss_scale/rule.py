"""MindSpore's dynamic loss-scale rule, written once for host numbers and device tensors.

Every dynamic loss scale in lit_amp moves by :func:`next_scale_state`: the update cell
(:class:`~lit_amp.amp.loss_scale.managers.DynamicLossScaleUpdateCell`, which the
:class:`~lit_amp.amp.loss_scale.controller.LossScaleController` drives), the manager's host-side
mirror (:meth:`~lit_amp.amp.loss_scale.managers.DynamicLossScaleManager.update_loss_scale`),
the functional :class:`~lit_amp.amp.loss_scale.scalers.DynamicLossScaler` and the per-group
scales of ``boost.GroupLossScaleManager``. They differ only in their constants
(:class:`DynamicScaleRule`) and in the numbers they compute with (an :class:`Arithmetic`):
:data:`HOST` (Python numbers, as MindSpore's Python manager), :data:`HOST_FP32` (Python numbers
rounded to float32 after each operation: the cell's CPU path, no tensor op) and :data:`TENSOR`
(torch ops on tensors of any shape: no branch on a value, so no host sync on a device).

Example:
    >>> rule = DynamicScaleRule(factor=2.0, window=2)
    >>> state = (1024.0, 0, 1)                   # (scale, counter, hysteresis_left)
    >>> for overflow in (False, False, True):
    ...     state = next_scale_state(*state, overflow, rule)
    ...     state[0]
    1024.0
    2048.0
    1024.0
"""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

__all__ = [
    "DynamicScaleRule",
    "Arithmetic",
    "HOST",
    "HOST_FP32",
    "TENSOR",
    "next_scale_state",
    "f32",
]


class DynamicScaleRule(NamedTuple):
    """The constants of the dynamic rule (validated by the classes that build one).

    Args:
        factor: the growth factor; on overflow the scale is divided by it (unless ``backoff``).
        window: finite steps in a row (since the last overflow or growth) before a growth.
        hysteresis: overflows tolerated (skipped, scale kept) before a shrink; refilled at each
            growth. 1 shrinks on every overflow (MindSpore).
        min_scale: floor applied when shrinking, or None for none (MindSpore: 1).
        max_scale: ceiling applied when growing, or None for none (MindSpore: none).
        backoff: multiply the scale by this on overflow instead of dividing it by ``factor``
            (MindSpore's host manager multiplies by its ``decrease_ratio = 1 / factor``; its
            device cell divides; in floating point the two can differ in the last bit).
    """

    factor: float
    window: int
    hysteresis: int = 1
    min_scale: float | None = 1.0
    max_scale: float | None = None
    backoff: float | None = None


class Arithmetic(NamedTuple):
    """The operations :func:`next_scale_state` is written in, for one kind of number.

    ``&``, ``|``, ``+``, ``-`` and comparisons are used as written (Python bools and ints and
    torch tensors all have them); everything that differs between the kinds is here.
    """

    where: Callable[[Any, Any, Any], Any]  #: ``a if cond else b``, elementwise
    not_: Callable[[Any], Any]  #: logical not
    mul: Callable[[Any, Any], Any]  #: product (rounded as the kind rounds)
    div: Callable[[Any, Any], Any]  #: quotient (rounded as the kind rounds)
    maximum: Callable[[Any, float], Any]  #: elementwise max with a constant
    minimum: Callable[[Any, float], Any]  #: elementwise min with a constant
    isfinite: Callable[[Any], Any]  #: not inf / NaN


_FLOAT32 = struct.Struct("f")


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32 value (inf beyond the float32 range).

    Example:
        >>> f32(0.1), f32(1e39)
        (0.10000000149011612, inf)
    """
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _where(cond: Any, a: Any, b: Any) -> Any:
    return a if cond else b


#: Python numbers as they are (MindSpore's host-side manager). ``x - x == 0`` is the finite
#: test that also takes an int of any size.
HOST = Arithmetic(
    where=_where, not_=operator.not_, mul=operator.mul, div=operator.truediv,
    maximum=max, minimum=min, isfinite=lambda x: x - x == 0,
)

#: Python floats rounded to float32 after every product and quotient: with float32 values
#: for the scale and the constants, bit for bit what :data:`TENSOR` computes on float32
#: tensors, without a tensor op (the cell's CPU path).
HOST_FP32 = Arithmetic(
    where=_where, not_=operator.not_, mul=lambda a, b: f32(a * b), div=lambda a, b: f32(a / b),
    maximum=max, minimum=min, isfinite=math.isfinite,
)

#: torch tensors (any shape, elementwise; Python numbers allowed beside them): no branch on a
#: value, so the rule runs on a device without a host sync.
TENSOR = Arithmetic(
    where=torch.where, not_=torch.logical_not, mul=operator.mul, div=operator.truediv,
    maximum=lambda x, lo: torch.clamp(x, min=lo), minimum=lambda x, hi: torch.clamp(x, max=hi),
    isfinite=torch.isfinite,
)


def next_scale_state(
    scale: Any,
    counter: Any,
    hysteresis_left: Any,
    overflow: Any,
    rule: DynamicScaleRule,
    arith: Arithmetic = HOST,
) -> tuple[Any, Any, Any]:
    """One step of the dynamic rule: the state after a step that did or did not ``overflow``.

    ``counter`` is the number of finite steps since the last overflow or growth (MindSpore's
    ``DynamicLossScaler.counter``; ``cur_iter - last_overflow_iter - 1`` of its update cell)::

        shrink = overflow and hysteresis_left <= 1
        if overflow and not shrink: hysteresis_left -= 1
        kept   = max(scale / factor, min_scale) if shrink else scale   # or scale * backoff
        due    = counter + 1 >= window
        if due and not overflow:                       # a growth (never to inf, <= max_scale)
            scale = min(kept * factor, max_scale) if finite else kept
            hysteresis_left = hysteresis
        else:
            scale = kept
        counter = 0 if overflow or due else counter + 1

    Args:
        scale, counter, hysteresis_left: the state before the step, as numbers of ``arith``'s
            kind (for :data:`TENSOR`: tensors, or Python numbers that stay constant);
            ``hysteresis_left=None`` for a state without hysteresis (as ``hysteresis=1``).
        overflow: whether the step's gradients were not finite (a bool, or a bool tensor of
            the scale's shape for :data:`TENSOR`).
        rule: the constants.
        arith: the kind of numbers (:data:`HOST`, :data:`HOST_FP32` or :data:`TENSOR`).

    Returns:
        ``(scale, counter, hysteresis_left)`` after the step.
    """
    if hysteresis_left is None:  # a state without hysteresis (the scaler, the boost groups)
        shrink = overflow
    else:
        shrink = overflow & (hysteresis_left <= 1)
        # overflow ^ shrink: an overflow the hysteresis tolerates
        hysteresis_left = arith.where(overflow ^ shrink, hysteresis_left - 1, hysteresis_left)
    if rule.backoff is None:
        shrunk = arith.div(scale, rule.factor)
    else:
        shrunk = arith.mul(scale, rule.backoff)
    if rule.min_scale is not None:
        shrunk = arith.maximum(shrunk, rule.min_scale)
    kept = arith.where(shrink, shrunk, scale)
    due = counter >= rule.window - 1
    grow = due & arith.not_(overflow)
    grown = arith.mul(kept, rule.factor)
    if rule.max_scale is not None:
        grown = arith.minimum(grown, rule.max_scale)
    scale = arith.where(grow & arith.isfinite(grown), grown, kept)
    if hysteresis_left is not None:
        hysteresis_left = arith.where(grow, rule.hysteresis, hysteresis_left)
    counter = arith.where(overflow | due, 0, counter + 1)
    return scale, counter, hysteresis_left
