"""Loss-scale managers and update cells: MindSpore's ``LossScaleManager`` family in PyTorch.

Pure PyTorch (no Lightning); docs/semantics.md §2.6.

- :class:`FixedLossScaleManager` ``(loss_scale=128.0, drop_overflow_update=True)``: a constant
  scale. With ``drop_overflow_update=True`` an overflowing step is skipped; with ``False`` the
  step is always applied and :meth:`~FixedLossScaleManager.get_update_cell` returns None.
- :class:`DynamicLossScaleManager` ``(init_loss_scale=2**24, scale_factor=2,
  scale_window=2000)``: the scale grows ×factor after ``scale_window`` consecutive good steps and
  shrinks ÷factor (floor 1) on overflow. The keyword-only ``hysteresis``, ``min_loss_scale``
  and ``max_loss_scale`` are lit_amp additions; their defaults keep MindSpore's behaviour.

The *update cells* (:class:`DynamicLossScaleUpdateCell`, :class:`FixedLossScaleUpdateCell`) are
authoritative — MindSpore's device-side ``construct(loss_scale, overflow)`` that updates the
scale tensor in place. :meth:`DynamicLossScaleManager.update_loss_scale` is MindSpore's separate
host-side mirror (what ``Model`` calls after each non-sink step), kept as specified, including
its RuntimeError after more than 1000 consecutive overflows. Both move the scale by the one
rule of :mod:`~lit_amp.amp.loss_scale.rule`. The train steps of lit_amp drive the cells
through :class:`~lit_amp.amp.loss_scale.controller.LossScaleController`.

Example:
    >>> import torch
    >>> manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_window=2)
    >>> cell = manager.get_update_cell()
    >>> scale = torch.tensor(manager.get_loss_scale(), dtype=torch.float32)
    >>> for overflow in (False, False, True):
    ...     _ = cell(scale, overflow)
    >>> float(scale)    # grew at step 2, shrank at step 3
    1024.0
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor, nn

from lit_amp._validation import (
    check_number,
    check_positive_int,
    check_positive_number,
    value_error,
)
from lit_amp.amp.loss_scale.rule import (
    HOST,
    HOST_FP32,
    TENSOR,
    DynamicScaleRule,
    f32,
    next_scale_state,
)

__all__ = [
    "LossScaleManager",
    "FixedLossScaleManager",
    "DynamicLossScaleManager",
    "FixedLossScaleUpdateCell",
    "DynamicLossScaleUpdateCell",
]


def _check_scale(name: str, value: Any, cls: str) -> float:
    return check_number(cls, name, value, minimum=1.0)


def _check_factor(value: Any, cls: str) -> float:
    # a factor <= 1 would move the scale the wrong way (grow on overflow, shrink when stable)
    return check_number(cls, "scale_factor", value, minimum=1.0, strict=True)


def _check_bounds(
    min_loss_scale: Any, max_loss_scale: Any, cls: str, init: float | None = None
) -> tuple[float, float | None]:
    """Validate ``min_loss_scale`` (> 0, <= init) and ``max_loss_scale`` (None or >= init/min)."""
    lo = check_positive_number(cls, "min_loss_scale", min_loss_scale)
    if init is not None and lo > init:
        raise value_error(cls, "min_loss_scale", f"a number in (0, init_loss_scale={init}]",
                          min_loss_scale)
    if max_loss_scale is None:
        return lo, None
    hi = check_number(cls, "max_loss_scale", max_loss_scale, finite=False)
    if init is not None:
        bound, what = init, f"init_loss_scale={init}"
    else:
        bound, what = lo, f"min_loss_scale={lo}"
    if hi < bound or hi < lo:
        raise value_error(cls, "max_loss_scale", f"None or a number >= {what}", max_loss_scale)
    return lo, hi


class FixedLossScaleUpdateCell(nn.Module):
    """Update cell of a fixed scale: returns ``overflow`` and never changes the scale.

    Args:
        loss_scale_value: the scale, a number >= 1.

    Example:
        >>> import torch
        >>> cell = FixedLossScaleUpdateCell(128.0)
        >>> scale = torch.tensor(128.0)
        >>> bool(cell(scale, True)), float(scale), cell.get_loss_scale()
        (True, 128.0, 128.0)
    """

    def __init__(self, loss_scale_value: float) -> None:
        super().__init__()
        self.loss_scale_value = _check_scale(
            "loss_scale_value", loss_scale_value, "FixedLossScaleUpdateCell"
        )

    def get_loss_scale(self) -> float:
        """The fixed loss scale."""
        return self.loss_scale_value

    def forward(self, loss_scale: Tensor, overflow: Tensor | bool) -> Tensor:
        """Return ``overflow`` as a bool tensor; ``loss_scale`` is left unchanged."""
        return torch.as_tensor(overflow, device=loss_scale.device).to(torch.bool)


class DynamicLossScaleUpdateCell(nn.Module):
    """Device-side dynamic loss-scale update (MindSpore ``nn.DynamicLossScaleUpdateCell``).

    ``forward(loss_scale, overflow)`` writes the new scale into the float32 tensor
    ``loss_scale`` in place and returns ``overflow``. The rule is
    :func:`~lit_amp.amp.loss_scale.rule.next_scale_state` (docs/semantics.md §2.6) on MindSpore's
    counters: ``cur_iter`` starts at 1, ``last_overflow_iter`` at 0 and is set to ``cur_iter`` at
    each overflow and each growth, so the rule's counter is ``cur_iter - last_overflow_iter - 1``.

    With the defaults (``hysteresis=1, min_loss_scale=1.0, max_loss_scale=None``) this is
    MindSpore's rule exactly: the first growth happens at step ``window``, an overflow (also at
    a growth step) divides the scale by the factor with a floor of 1 and restarts the window.
    lit_amp also refuses a growth to a non-finite value (float32 overflow beyond 3.4e38,
    MindSpore would store inf). Hysteresis is DeepSpeed's "delayed shift": ``hysteresis``
    overflows are tolerated (skipped, but the scale kept) before the scale shrinks; the
    allowance is refilled at each growth. Everything is computed in float32.

    Args:
        loss_scale_value: initial scale (returned by :meth:`get_loss_scale`).
        scale_factor: growth/shrink factor (> 0).
        scale_window: consecutive good steps before a growth (positive int).
        hysteresis: overflows tolerated before shrinking (positive int; 1 = MindSpore).
        min_loss_scale: floor of the scale (> 0; 1.0 = MindSpore).
        max_loss_scale: ceiling of the scale, or None (MindSpore: no ceiling).

    Example:
        >>> import torch
        >>> cell = DynamicLossScaleUpdateCell(2.0**24, 2, 2000)
        >>> scale = torch.tensor(2.0**24)
        >>> _ = cell(scale, torch.tensor(True))
        >>> float(scale), int(cell.cur_iter), int(cell.last_overflow_iter)
        (8388608.0, 2, 1)
    """

    def __init__(
        self,
        loss_scale_value: float,
        scale_factor: float,
        scale_window: int,
        *,
        hysteresis: int = 1,
        min_loss_scale: float = 1.0,
        max_loss_scale: float | None = None,
    ) -> None:
        super().__init__()
        cls = "DynamicLossScaleUpdateCell"
        self.loss_scale_value = check_positive_number(cls, "loss_scale_value", loss_scale_value)
        self.scale_factor = _check_factor(scale_factor, cls)
        self.scale_window = check_positive_int(cls, "scale_window", scale_window)
        self.hysteresis = check_positive_int(cls, "hysteresis", hysteresis)
        self.min_loss_scale, self.max_loss_scale = _check_bounds(
            min_loss_scale, max_loss_scale, cls
        )
        # the constants as the float32 values the rule computes with
        self._rule = DynamicScaleRule(
            factor=f32(self.scale_factor),
            window=self.scale_window,
            hysteresis=self.hysteresis,
            min_scale=f32(self.min_loss_scale),
            max_scale=None if self.max_loss_scale is None else f32(self.max_loss_scale),
        )
        self.register_buffer("cur_iter", torch.tensor(1, dtype=torch.int64))
        self.register_buffer("last_overflow_iter", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("hysteresis_left", torch.tensor(self.hysteresis, dtype=torch.int64))

    def get_loss_scale(self) -> float:
        """The initial loss scale this cell was built with (MindSpore semantics)."""
        return self.loss_scale_value

    @torch.no_grad()
    def forward(self, loss_scale: Tensor, overflow: Tensor | bool) -> Tensor:
        """Update ``loss_scale`` in place from ``overflow``; return ``overflow`` (bool tensor).

        On CPU the rule runs on Python numbers rounded to float32 (no tensor op); elsewhere on
        tensors without a host sync. Both run :func:`~lit_amp.amp.loss_scale.rule.next_scale_state`
        and give the same float32 results.
        """
        on_cpu = loss_scale.device.type == "cpu" and self.cur_iter.device.type == "cpu"
        if on_cpu and (not isinstance(overflow, Tensor) or overflow.device.type == "cpu"):
            return self._forward_host(loss_scale, bool(overflow))
        return self._forward_tensor(loss_scale, overflow)

    def _forward_host(self, loss_scale: Tensor, ovf: bool) -> Tensor:
        ls, cur = loss_scale.item(), int(self.cur_iter)
        last, left = int(self.last_overflow_iter), int(self.hysteresis_left)
        new, counter, hyst = next_scale_state(
            ls, cur - last - 1, left, ovf, self._rule, HOST_FP32
        )
        # write only what changed (a fill costs more than the rule)
        if new != ls:
            loss_scale.fill_(new)
        if cur - counter != last:
            self.last_overflow_iter.fill_(cur - counter)
        if hyst != left:
            self.hysteresis_left.fill_(hyst)
        self.cur_iter.fill_(cur + 1)
        return torch.tensor(ovf)

    def _forward_tensor(self, loss_scale: Tensor, overflow: Tensor | bool) -> Tensor:
        ovf = torch.as_tensor(overflow, device=loss_scale.device).to(torch.bool).reshape(())
        cur = self.cur_iter
        new, counter, hyst = next_scale_state(
            loss_scale, cur - self.last_overflow_iter - 1, self.hysteresis_left, ovf,
            self._rule, TENSOR,
        )
        loss_scale.copy_(new)
        self.last_overflow_iter.copy_(cur - counter)
        self.hysteresis_left.copy_(hyst)
        cur.add_(1)
        return ovf

    def extra_repr(self) -> str:
        return (
            f"loss_scale_value={self.loss_scale_value}, scale_factor={self.scale_factor}, "
            f"scale_window={self.scale_window}, hysteresis={self.hysteresis}, "
            f"min_loss_scale={self.min_loss_scale}, max_loss_scale={self.max_loss_scale}"
        )


class LossScaleManager(ABC):
    """Abstract loss-scale manager (MindSpore ``LossScaleManager``).

    Subclasses implement :meth:`get_loss_scale` (the current scale), :meth:`update_loss_scale`
    (host-side update from an overflow flag) and :meth:`get_update_cell` (the update cell the
    train step drives, or None for "scale but never skip"). :meth:`get_drop_overflow_update`
    defaults to True.

    Example:
        >>> class Constant(LossScaleManager):
        ...     def get_loss_scale(self): return 4.0
        ...     def update_loss_scale(self, overflow): pass
        ...     def get_update_cell(self): return FixedLossScaleUpdateCell(4.0)
        >>> Constant().get_drop_overflow_update()
        True
    """

    @abstractmethod
    def get_loss_scale(self) -> float:
        """The current loss scale."""

    @abstractmethod
    def update_loss_scale(self, overflow: bool) -> None:
        """Update the scale from whether the last step overflowed (host side)."""

    @abstractmethod
    def get_update_cell(self) -> nn.Module | None:
        """A new update cell for the train step, or None (no overflow handling)."""

    def get_drop_overflow_update(self) -> bool:
        """Whether an overflowing step is skipped (True unless a subclass says otherwise)."""
        return True


class FixedLossScaleManager(LossScaleManager):
    """A constant loss scale (MindSpore ``FixedLossScaleManager``).

    Args:
        loss_scale: the scale, a finite number >= 1.
        drop_overflow_update: skip the optimizer step when the gradients overflow. With False
            the step is always applied. In MindSpore the optimizer must then be built with
            ``loss_scale=loss_scale`` to divide the gradients; lit_amp's train steps unscale the
            gradients themselves unless the optimizer declares such a ``loss_scale``
            (see :class:`~lit_amp.amp.loss_scale.controller.LossScaleController`).

    Raises:
        TypeError: ``loss_scale`` is not a number or ``drop_overflow_update`` not a bool.
        ValueError: ``loss_scale`` < 1 or not finite.

    Example:
        >>> m = FixedLossScaleManager(1024.0, drop_overflow_update=False)
        >>> m.get_loss_scale(), m.get_drop_overflow_update(), m.get_update_cell()
        (1024.0, False, None)
    """

    def __init__(self, loss_scale: float = 128.0, drop_overflow_update: bool = True) -> None:
        cls = "FixedLossScaleManager"
        _check_scale("loss_scale", loss_scale, cls)
        if not isinstance(drop_overflow_update, bool):
            raise TypeError(
                f"{cls}: the argument 'drop_overflow_update' must be a bool, but got "
                f"{drop_overflow_update!r} of type {type(drop_overflow_update).__name__}."
            )
        self._loss_scale = loss_scale
        self._drop_overflow_update = drop_overflow_update

    def get_loss_scale(self) -> float:
        """The fixed loss scale."""
        return self._loss_scale

    def get_drop_overflow_update(self) -> bool:
        """Whether an overflowing step is skipped."""
        return self._drop_overflow_update

    def update_loss_scale(self, overflow: bool) -> None:
        """Does nothing: the scale is fixed."""

    def get_update_cell(self) -> FixedLossScaleUpdateCell | None:
        """:class:`FixedLossScaleUpdateCell` when dropping overflowing steps, else None."""
        if not self._drop_overflow_update:
            return None
        return FixedLossScaleUpdateCell(self._loss_scale)

    def __repr__(self) -> str:
        return (
            f"FixedLossScaleManager(loss_scale={self._loss_scale}, "
            f"drop_overflow_update={self._drop_overflow_update})"
        )


class DynamicLossScaleManager(LossScaleManager):
    """A dynamically adjusted loss scale (MindSpore ``DynamicLossScaleManager``).

    Args:
        init_loss_scale: initial scale, a finite number >= 1 (default 2**24).
        scale_factor: growth/shrink factor, > 0 (default 2).
        scale_window: consecutive overflow-free steps before growing, a positive int
            (default 2000).
        hysteresis: lit_amp addition — overflows tolerated before the scale shrinks (the steps
            are still skipped), as DeepSpeed's ``hysteresis``; refilled at each growth. Default
            1 (shrink on every overflow, MindSpore).
        min_loss_scale: lit_amp addition — floor of the scale, in (0, init_loss_scale]. Default
            1.0 (MindSpore's floor).
        max_loss_scale: lit_amp addition — ceiling of the scale, None (default, no ceiling) or
            >= init_loss_scale.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: ``init_loss_scale`` < 1, ``scale_factor`` <= 0, ``scale_window`` or
            ``hysteresis`` <= 0, or bounds outside the ranges above.

    Example:
        >>> m = DynamicLossScaleManager(init_loss_scale=8.0, scale_factor=2, scale_window=1)
        >>> m.update_loss_scale(False); m.get_loss_scale()
        16.0
        >>> m.update_loss_scale(True); m.get_loss_scale()
        8.0
    """

    def __init__(
        self,
        init_loss_scale: float = 2**24,
        scale_factor: float = 2,
        scale_window: int = 2000,
        *,
        hysteresis: int = 1,
        min_loss_scale: float = 1.0,
        max_loss_scale: float | None = None,
    ) -> None:
        cls = "DynamicLossScaleManager"
        init = _check_scale("init_loss_scale", init_loss_scale, cls)
        _check_factor(scale_factor, cls)
        check_positive_int(cls, "scale_window", scale_window)
        check_positive_int(cls, "hysteresis", hysteresis)
        self.min_loss_scale, self.max_loss_scale = _check_bounds(
            min_loss_scale, max_loss_scale, cls, init=init
        )
        self.loss_scale: float = init_loss_scale
        self.scale_window = scale_window
        self.scale_factor = scale_factor
        self.hysteresis = hysteresis
        self.increase_ratio = scale_factor
        self.decrease_ratio = 1 / scale_factor
        self.cur_iter = 1
        self.last_overflow_iter = 0
        self.bad_step_max = 1000
        self.bad_step = 0
        self._hysteresis_left = hysteresis

    def get_loss_scale(self) -> float:
        """The current host-side loss scale (evolved by :meth:`update_loss_scale`)."""
        return self.loss_scale

    def get_drop_overflow_update(self) -> bool:
        """Always True: an overflowing step is skipped."""
        return True

    def update_loss_scale(self, overflow: bool) -> None:
        """MindSpore's host-side mirror update (what ``Model`` calls after a non-sink step).

        The rule of :func:`~lit_amp.amp.loss_scale.rule.next_scale_state` on Python numbers,
        with MindSpore's host arithmetic (an overflow multiplies by ``decrease_ratio = 1 /
        factor``) and its counters::

            if overflow:  last_overflow_iter = cur_iter; bad_step += 1
            else:         bad_step = 0           # growth when (cur_iter - last) % window == 0
            if bad_step > 1000: raise RuntimeError
            cur_iter += 1

        It runs independently of the update cell; the cell is authoritative for training.

        Raises:
            RuntimeError: more than 1000 consecutive overflowing steps.
        """
        overflow = bool(overflow)
        rule = DynamicScaleRule(
            factor=self.increase_ratio, window=self.scale_window, hysteresis=self.hysteresis,
            min_scale=self.min_loss_scale, max_scale=self.max_loss_scale,
            backoff=self.decrease_ratio,
        )
        # MindSpore's counters give the rule's: finite steps since the last overflow or growth
        counter = (self.cur_iter - self.last_overflow_iter - 1) % self.scale_window
        self.loss_scale, _, self._hysteresis_left = next_scale_state(
            self.loss_scale, counter, self._hysteresis_left, overflow, rule, HOST
        )
        if overflow:
            self.last_overflow_iter = self.cur_iter
            self.bad_step += 1
        else:
            self.bad_step = 0
        if self.bad_step > self.bad_step_max:
            raise RuntimeError(
                f"Dynamic loss scale: {self.bad_step} consecutive overflowing steps, which exceeds "
                f"the maximum of {self.bad_step_max}; the current loss scale is "
                f"{self.loss_scale}."
            )
        self.cur_iter += 1

    def get_update_cell(self) -> DynamicLossScaleUpdateCell:
        """A new :class:`DynamicLossScaleUpdateCell` starting from the current scale."""
        return DynamicLossScaleUpdateCell(
            self.loss_scale,
            self.scale_factor,
            self.scale_window,
            hysteresis=self.hysteresis,
            min_loss_scale=self.min_loss_scale,
            max_loss_scale=self.max_loss_scale,
        )

    def __repr__(self) -> str:
        extra = ""
        if self.hysteresis != 1:
            extra += f", hysteresis={self.hysteresis}"
        if self.min_loss_scale != 1.0:
            extra += f", min_loss_scale={self.min_loss_scale}"
        if self.max_loss_scale is not None:
            extra += f", max_loss_scale={self.max_loss_scale}"
        return (
            f"DynamicLossScaleManager(init_loss_scale={self.loss_scale}, "
            f"scale_factor={self.scale_factor}, scale_window={self.scale_window}{extra})"
        )
