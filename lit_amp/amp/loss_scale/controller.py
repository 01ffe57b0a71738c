"""``LossScaleController``: the one loss-scaling state machine every lit_amp train step uses.

Pure PyTorch (no Lightning). ``LitModel``'s training step, the ``AmpPrecision`` plugin and the
cell from ``build_train_network`` all drive a controller built from a
:class:`~lit_amp.amp.loss_scale.managers.LossScaleManager`, so loss scaling has one
implementation, which a raw PyTorch loop can use too. One step (docs/semantics.md §2.7)::

    controller.scale_loss(loss).backward()      # loss * scale; `loss` itself is untouched
    done = controller.apply(optimizers, step_all, before_step=clip)  # unscale, clip, check,
    if not done.skipped:                        # step unless skipped, update the scale
        lr_scheduler.step()

The gradient pass (fused unscale-and-check, the overflow flag all ranks agree on) is in
:mod:`~lit_amp.amp.loss_scale.unscale`; the rules and departures are in docs/semantics.md
§2.6-2.7 and docs/differences.md, "Loss scaling".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.optim import Optimizer

from lit_amp._runtime import unwrap_optimizer
from lit_amp._validation import check_positive_int, check_type, type_error
from lit_amp.amp.loss_scale.managers import (
    DynamicLossScaleUpdateCell,
    FixedLossScaleUpdateCell,
    LossScaleManager,
)
from lit_amp.amp.loss_scale.unscale import (
    FactorCache,
    any_overflow,
    declared_loss_scale,
    unscale_and_check_,
)

__all__ = ["LossScaleController", "AppliedStep"]

logger = logging.getLogger(__name__)

_STATE_VERSION = 1


class AppliedStep(NamedTuple):
    """What :meth:`LossScaleController.apply` did."""

    overflow: bool  #: a gradient was inf/NaN on some rank
    skipped: bool  #: the optimizer step was skipped
    output: Any  #: what the step callable returned (None when skipped)


class LossScaleController:
    """Loss scaling for one training run: scale, unscale, detect overflow, skip, update, save.

    Args:
        manager: a :class:`~lit_amp.amp.loss_scale.managers.LossScaleManager`, or None for no
            loss scaling (then :attr:`enabled` is False and every method is a cheap no-op:
            scale 1, nothing unscaled, no overflow check, nothing skipped).
        max_consecutive_overflows: after this many consecutive overflowing steps
            :meth:`update` raises RuntimeError (MindSpore's manager allows 1000). None disables
            the guard.
        diagnostics: optional overflow-diagnostics object with ``first_nonfinite() -> str |
            None`` (the first layer whose output was non-finite); named in the guard's error.

    Attributes:
        enabled: False when ``manager`` is None.
        drop_overflow_update: whether an overflowing step is skipped.
        last_overflow: whether the last step overflowed (on any rank).
        last_scale_used: the scale the last step was computed with.
        last_skipped: whether the last step was skipped.
        skipped_steps: number of skipped steps so far.
        consecutive_overflows: number of overflowing steps in a row, up to the last step.
        steps: number of steps (calls to :meth:`update`) so far.

    Raises:
        TypeError: ``manager`` is not a LossScaleManager or None, ``diagnostics`` has no
            ``first_nonfinite`` method, or ``max_consecutive_overflows`` is not an int.
        ValueError: ``max_consecutive_overflows`` < 1.

    Example:
        >>> from lit_amp.amp.loss_scale.managers import FixedLossScaleManager
        >>> ctl = LossScaleController(FixedLossScaleManager(128.0))
        >>> float(ctl.scale_loss(torch.tensor(0.5)))
        64.0
        >>> ctl.update(True); ctl.skipped_steps, ctl.scale
        (1, 128.0)
    """

    STATE_KEY = "lit_amp_loss_scale"

    def __init__(
        self,
        manager: LossScaleManager | None,
        *,
        max_consecutive_overflows: int | None = 1000,
        diagnostics: Any = None,
    ) -> None:
        owner = "LossScaleController"
        check_type(owner, "manager", manager, LossScaleManager,
                   "a LossScaleManager (FixedLossScaleManager, DynamicLossScaleManager, ...)",
                   allow_none=True)
        check_positive_int(owner, "max_consecutive_overflows", max_consecutive_overflows,
                           allow_none=True)
        if diagnostics is not None and not callable(getattr(diagnostics, "first_nonfinite", None)):
            raise type_error(owner, "diagnostics", "None or an object with a first_nonfinite() "
                             "method", diagnostics)
        self.manager = manager
        self.max_consecutive_overflows = max_consecutive_overflows
        self.diagnostics = diagnostics
        self.enabled: bool = manager is not None
        if manager is None:
            self.drop_overflow_update = False
            self._cell: torch.nn.Module | None = None
            init_scale = 1.0
        else:
            self.drop_overflow_update = bool(manager.get_drop_overflow_update())
            self._cell = manager.get_update_cell()
            if self._cell is not None and not callable(self._cell):
                raise TypeError(
                    f"LossScaleController: {type(manager).__name__}.get_update_cell() must return "
                    f"None or a callable update cell, but got {type(self._cell).__name__}."
                )
            init_scale = float(manager.get_loss_scale())
        self._own_cell = isinstance(
            self._cell, (DynamicLossScaleUpdateCell, FixedLossScaleUpdateCell)
        )
        self._scale_t = torch.tensor(init_scale, dtype=torch.float32)
        self._scale = float(self._scale_t)
        self.last_overflow: bool = False
        self.last_scale_used: float = self._scale
        self.last_skipped: bool = False
        self.skipped_steps: int = 0
        self.consecutive_overflows: int = 0
        self.steps: int = 0
        # per-step state, reset by update()
        self._found_inf: dict[int, list[Tensor]] = {}
        self._unscaled_params: set[int] = set()
        self._factors = FactorCache()

    # ------------------------------------------------------------------ scale
    @property
    def scale(self) -> float:
        """The loss scale the next backward uses (1.0 when disabled)."""
        return self._scale

    def scale_loss(self, loss: Tensor) -> Tensor:
        """``loss * scale`` (a new tensor; ``loss`` is untouched). Identity when disabled.

        The loss should be fp32 (as lit_amp's O-levels compute it): an fp16 loss times a large
        scale overflows.
        """
        if not self.enabled or self._scale == 1.0:
            return loss
        return loss * self._scale

    # --------------------------------------------------------------- unscale
    def unscale_(self, optimizer: Optimizer) -> None:
        """Divide ``optimizer``'s gradients by :attr:`scale` in place (and check them).

        At most once per optimizer per step (a second call is a no-op); a parameter shared by
        two optimizers is unscaled once. An optimizer that divides by a declared
        ``loss_scale`` ``X != 1`` itself gets ``grads *= X / scale`` (nothing when ``X ==
        scale``; docs/differences.md, "Loss scaling"). The non-finite check runs in the same
        fused pass; :meth:`found_overflow` reads its result. No-op when disabled.
        """
        if not self.enabled:
            return
        opt = unwrap_optimizer(optimizer)
        key = id(opt)
        if key in self._found_inf:
            return
        flags: list[Tensor] = []
        by_factor: dict[float, list[Tensor]] = {}
        for group in opt.param_groups:
            factor = declared_loss_scale(opt, group) / self._scale
            for p in group["params"]:
                if p.grad is None or id(p) in self._unscaled_params:
                    continue
                self._unscaled_params.add(id(p))
                by_factor.setdefault(factor, []).append(p.grad)
        for factor, grads in by_factor.items():
            flags.extend(unscale_and_check_(grads, factor, self._factors))
        self._found_inf[key] = flags

    # -------------------------------------------------------------- overflow
    def found_overflow(self, optimizers: Sequence[Optimizer] | Optimizer) -> bool:
        """Whether any gradient of ``optimizers`` is inf/NaN on any rank.

        Uses the checks made by :meth:`unscale_`; gradients of an optimizer not unscaled in
        this step are checked now (same fused kernel, factor 1). When ``torch.distributed`` is
        initialized the flag is all-reduced with MAX, so every rank gets the same answer (all
        ranks must call this). One host sync. Always False when disabled.
        """
        if not self.enabled:
            return False
        if isinstance(optimizers, Optimizer) or hasattr(optimizers, "param_groups"):
            optimizers = [optimizers]
        flags: list[Tensor] = []
        for optimizer in optimizers:
            opt = unwrap_optimizer(optimizer)
            recorded = self._found_inf.get(id(opt))
            if recorded is not None:
                flags.extend(recorded)
                continue
            grads = [
                p.grad
                for group in opt.param_groups
                for p in group["params"]
                if p.grad is not None and id(p) not in self._unscaled_params
            ]
            flags.extend(unscale_and_check_(grads, 1.0, self._factors))
        return any_overflow(flags)

    def should_skip(self, overflow: bool | Tensor) -> bool:
        """True when the step must be skipped: ``overflow`` and ``drop_overflow_update``."""
        return self.enabled and self.drop_overflow_update and bool(overflow)

    # ---------------------------------------------------------------- update
    def update(self, overflow: bool | Tensor) -> None:
        """Finish the step: update the scale, the counters and the guard. Once per step.

        The scale moves by the manager's update cell (docs/semantics.md §2.6 device-side rule with
        lit_amp's hysteresis and clamps; constant for a fixed manager). Increments
        :attr:`steps`, :attr:`skipped_steps` (when :meth:`should_skip`) and
        :attr:`consecutive_overflows`. No-op when disabled.

        Raises:
            RuntimeError: this is the ``max_consecutive_overflows``-th overflowing step in a
                row. The message names the current scale and, when ``diagnostics`` is set,
                the first layer that produced a non-finite value.
        """
        if not self.enabled:
            return
        overflow = bool(overflow)
        scale_used = self._scale
        cell = self._cell
        if cell is not None and not isinstance(cell, FixedLossScaleUpdateCell):
            # lit_amp's cells take a Python bool (CPU fast path); a foreign cell gets a tensor
            cell(self._scale_t, overflow if self._own_cell else torch.tensor(overflow))
            self._scale = self._scale_t.item()
        skipped = overflow and self.drop_overflow_update
        self.last_overflow = overflow
        self.last_scale_used = scale_used
        self.last_skipped = skipped
        self.steps += 1
        if skipped:
            self.skipped_steps += 1
        self.consecutive_overflows = self.consecutive_overflows + 1 if overflow else 0
        self._found_inf.clear()
        self._unscaled_params.clear()
        if overflow:
            logger.debug(
                "loss scaling: overflow at step %d with scale %s (%s); next scale %s",
                self.steps,
                scale_used,
                "skipped" if skipped else "applied",
                self._scale,
            )
        elif self._scale != scale_used:
            logger.debug(
                "loss scaling: scale %s -> %s at step %d", scale_used, self._scale, self.steps
            )
        limit = self.max_consecutive_overflows
        if limit is not None and self.consecutive_overflows >= limit:
            raise RuntimeError(self._guard_message())

    def _guard_message(self) -> str:
        msg = (
            f"Loss scaling: {self.consecutive_overflows} consecutive training steps produced "
            f"non-finite (inf/NaN) gradients (limit max_consecutive_overflows="
            f"{self.max_consecutive_overflows}); the current loss scale is {self._scale} "
            f"(the last step used {self.last_scale_used}). "
        )
        if self.diagnostics is not None:
            try:
                layer = self.diagnostics.first_nonfinite()
            except Exception as exc:  # never mask the guard itself
                layer = None
                msg += f"Overflow diagnostics failed ({exc!r}). "
            if layer:
                msg += f"The first layer that produced a non-finite value is '{layer}'. "
            else:
                msg += (
                    "Overflow diagnostics saw no non-finite layer output, so the overflow arises "
                    "in the backward pass or the loss. "
                )
        else:
            msg += "Enable overflow diagnostics to find the first layer producing inf/NaN. "
        msg += (
            "Look for inf/NaN in the data or the model (log of 0, division by 0, fp16 overflow "
            "in activations), lower the learning rate, or train in bf16/fp32."
        )
        return msg

    # --------------------------------------------------------------- outputs
    def step_outputs(self, loss: Tensor | float) -> tuple[Tensor, Tensor, Tensor]:
        """``(loss, overflow, scale_used)`` of the last step, as MindSpore's train step returns.

        ``loss`` (the unscaled loss) is detached; ``overflow`` is a 0-d bool tensor and
        ``scale_used`` a 0-d fp32 tensor, both on ``loss``'s device.
        """
        loss_t = loss.detach() if isinstance(loss, Tensor) else torch.as_tensor(loss)
        device = loss_t.device
        return (
            loss_t,
            torch.tensor(self.last_overflow, dtype=torch.bool, device=device),
            torch.tensor(self.last_scale_used, dtype=torch.float32, device=device),
        )

    def apply(
        self,
        optimizers: Sequence[Optimizer] | Optimizer,
        step: Callable[[], Any],
        *,
        before_step: Callable[[], Any] | None = None,
        update: bool = True,
    ) -> AppliedStep:
        """Finish a step whose scaled backward has run: the one driver of every scaled step.

        :meth:`unscale_` each optimizer, ``before_step()`` (clipping and hooks: they see the
        true gradients), :meth:`found_overflow`, ``step()`` unless :meth:`should_skip`, and
        :meth:`update`. ``LitModel``, the ``AmpPrecision`` plugin, :meth:`step` and the
        train-step cells all finish their steps here. Disabled: ``before_step()`` and
        ``step()`` only.

        Args:
            optimizers: the optimizer(s) whose gradients this step applies.
            step: no-argument callable that steps them all (e.g. ``optimizer.step``).
            before_step: optional no-argument callable run after unscaling, before the
                overflow check, on every step (skipped ones too, as Lightning's
                ``on_before_optimizer_step`` and clipping).
            update: False leaves :meth:`update` to the caller (Lightning's manual
                optimization updates once per training step, after all its optimizers).

        Returns:
            :class:`AppliedStep` ``(overflow, skipped, output)``; ``output`` is what ``step()``
            returned (None when skipped).

        Example:
            >>> from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager
            >>> net = torch.nn.Linear(2, 1)
            >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
            >>> ctl = LossScaleController(DynamicLossScaleManager(2.0**8))
            >>> ctl.scale_loss(net(torch.ones(1, 2)).sum() * float("nan")).backward()
            >>> ctl.apply(opt, opt.step)
            AppliedStep(overflow=True, skipped=True, output=None)
            >>> ctl.scale
            128.0
        """
        if isinstance(optimizers, Optimizer) or hasattr(optimizers, "param_groups"):
            optimizers = [optimizers]
        for optimizer in optimizers:
            self.unscale_(optimizer)
        if before_step is not None:
            before_step()
        overflow = self.found_overflow(optimizers)
        skipped = self.should_skip(overflow)
        output = None if skipped else step()
        if update:
            self.update(overflow)
        return AppliedStep(overflow, skipped, output)

    def step(
        self,
        optimizer: Optimizer,
        loss: Tensor,
        *,
        clip_fn: Callable[[], Any] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One loss-scaled step for a raw PyTorch loop and a single optimizer.

        Runs ``scale_loss(loss).backward()`` and :meth:`apply` (unscale, ``clip_fn()``, overflow
        check, ``optimizer.step()`` unless the step is skipped, update). It does not zero the
        gradients (call ``optimizer.zero_grad()`` before the forward, as usual). Step an LR
        scheduler only when :attr:`last_skipped` is False.

        Args:
            optimizer: the optimizer.
            loss: the unscaled loss of this step (with its graph).
            clip_fn: optional no-argument callable run after unscaling, e.g.
                ``lambda: torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)``.

        Returns:
            :meth:`step_outputs`: ``(loss, overflow, scale_used)``.

        Example:
            >>> from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager
            >>> net = torch.nn.Linear(2, 1)
            >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
            >>> ctl = LossScaleController(DynamicLossScaleManager())
            >>> loss = net(torch.ones(1, 2)).sum() * float("inf")
            >>> _, overflow, scale = ctl.step(opt, loss)
            >>> bool(overflow), float(scale), ctl.scale, ctl.last_skipped
            (True, 16777216.0, 8388608.0, True)
        """
        self.scale_loss(loss).backward()
        self.apply(optimizer, optimizer.step, before_step=clip_fn)
        return self.step_outputs(loss)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The resumable state, plain Python values (safe for ``torch.load(weights_only=True)``).

        Holds the scale, the update cell's counters (``cur_iter``, ``last_overflow_iter``,
        ``hysteresis_left``), :attr:`steps`, :attr:`skipped_steps`,
        :attr:`consecutive_overflows` and the last step's outputs. Store it under
        :attr:`STATE_KEY` in a checkpoint.
        """
        cell_state: dict[str, Any] = {}
        if self._cell is not None:
            for k, v in self._cell.state_dict().items():
                cell_state[k] = v.item() if v.numel() == 1 else v.tolist()
        return {
            "version": _STATE_VERSION,
            "enabled": self.enabled,
            "manager": type(self.manager).__name__ if self.manager is not None else None,
            "drop_overflow_update": self.drop_overflow_update,
            "scale": self._scale,
            "update_cell": cell_state,
            "steps": self.steps,
            "skipped_steps": self.skipped_steps,
            "consecutive_overflows": self.consecutive_overflows,
            "last_overflow": self.last_overflow,
            "last_scale_used": self.last_scale_used,
            "last_skipped": self.last_skipped,
        }

    def set_scale(self, value: float) -> None:
        """Set the current loss scale (MindSpore's ``set_sense_scale``); the update rule goes on
        from it.

        Example:
            >>> from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager
            >>> ctl = LossScaleController(DynamicLossScaleManager(2**10))
            >>> ctl.set_scale(4.0); ctl.scale
            4.0
        """
        self._scale_t.fill_(float(value))
        self._scale = float(self._scale_t)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`, so a resumed run continues the exact scale trajectory.

        Raises:
            TypeError: ``state`` is not a dict.
            ValueError: a required key is missing or the scale is not a positive number.
        """
        if not isinstance(state, dict):
            raise TypeError(
                "LossScaleController.load_state_dict: 'state' must be a dict from state_dict(), "
                f"but got {type(state).__name__}."
            )
        required = ("scale", "steps", "skipped_steps", "consecutive_overflows")
        missing = [k for k in required if k not in state]
        if missing:
            raise ValueError(
                f"LossScaleController.load_state_dict: missing keys {missing}; a state from "
                f"LossScaleController.state_dict() has {sorted(self.state_dict())}."
            )
        if not self.enabled:
            if state.get("enabled"):
                logger.warning(
                    "LossScaleController.load_state_dict: this controller has no loss-scale "
                    "manager; the saved loss-scale state (scale %s) is ignored.",
                    state["scale"],
                )
            return
        saved_manager = state.get("manager")
        if saved_manager is not None and saved_manager != type(self.manager).__name__:
            logger.warning(
                "LossScaleController.load_state_dict: the state was saved with %s, this run uses "
                "%s; restoring the scale and counters anyway.",
                saved_manager,
                type(self.manager).__name__,
            )
        scale = state["scale"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ValueError(
                "LossScaleController.load_state_dict: 'scale' must be a positive number, but got "
                f"{scale!r}."
            )
        if self._cell is None or isinstance(self._cell, FixedLossScaleUpdateCell):
            # a fixed manager's scale is configuration, not state: keep this run's value
            if float(scale) != self._scale:
                logger.warning(
                    "LossScaleController.load_state_dict: the checkpoint's fixed loss scale %s "
                    "differs from this run's %s; keeping %s.",
                    scale,
                    self._scale,
                    self._scale,
                )
        else:
            self._scale_t.fill_(float(scale))
            self._scale = float(self._scale_t)
        cell_state = state.get("update_cell") or {}
        if self._cell is not None and cell_state:
            own = self._cell.state_dict()
            new = {}
            for k, v in own.items():
                if k in cell_state:
                    new[k] = torch.as_tensor(cell_state[k], dtype=v.dtype).reshape(v.shape)
                else:
                    new[k] = v
            self._cell.load_state_dict(new)
        self.steps = int(state["steps"])
        self.skipped_steps = int(state["skipped_steps"])
        self.consecutive_overflows = int(state["consecutive_overflows"])
        self.last_overflow = bool(state.get("last_overflow", False))
        self.last_scale_used = float(state.get("last_scale_used", self._scale))
        self.last_skipped = bool(state.get("last_skipped", False))
        self._found_inf.clear()
        self._unscaled_params.clear()

    def __repr__(self) -> str:
        if not self.enabled:
            return "LossScaleController(manager=None)"
        return (
            f"LossScaleController(manager={self.manager!r}, scale={self._scale}, "
            f"steps={self.steps}, skipped_steps={self.skipped_steps})"
        )
