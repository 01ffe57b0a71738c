"""GroupLossScaleManager: a loss scale per layer group ("enhanced AMP", docs/semantics.md §3.3).

MindSpore's ``boost.GroupLossScaleManager(init_loss_scale, loss_scale_groups)`` on lit_amp's
loss-scaling machinery: the manager is a
:class:`~lit_amp.amp.loss_scale.managers.LossScaleManager` (so ``LitModel``, ``AmpPrecision``
and the :class:`~lit_amp.amp.loss_scale.controller.LossScaleController` accept it) and an
``nn.Module``, the marker the user places at layer boundaries (``x = manager(x, i, j)``).
Gradients are unscaled per group by tensor hooks as they are produced, so clipping and the
optimizer see true gradients. :class:`LossScaleGroup` is the boost flag ``loss_scale_group``.
Departures from MindSpore: docs/differences.md, "Boost".

Example:
    >>> m = GroupLossScaleManager(4.0, [])
    >>> net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    >>> m.loss_scale_groups = [list(net[0].parameters()), list(net[1].parameters())]
    >>> cell = m.get_update_cell()
    >>> x = m(torch.ones(1, 2, requires_grad=True), 0, 1)
    >>> y = m(net[1](m(net[0](x), 1, 2)), 2, 3)
    >>> y.sum().backward()                      # grads arrive scaled, hooks unscale them
    >>> _ = cell(torch.tensor(1.0), False); [round(v, 4) for v in m.loss_scales]
    [4.0028, 4.0028]
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from lit_amp.amp.loss_scale.managers import LossScaleManager
from lit_amp.amp.loss_scale.rule import TENSOR, DynamicScaleRule, next_scale_state
from lit_amp.boost.base import BoostAlgorithm

if TYPE_CHECKING:
    import lightning as L

    from lit_amp.boost.config import BoostConfig

__all__ = ["GroupLossScaleManager", "LossScaleGroup"]

log = logging.getLogger(__name__)

REDUCE_RATIO = 1.0 / math.sqrt(2.0)
GROWTH_RATIO = 2.0 ** (1.0 / 1000.0)
#: MindSpore's per-group rule as the one dynamic rule: every finite step grows by
#: ``GROWTH_RATIO`` (window 1), an overflow multiplies by ``REDUCE_RATIO``, no floor
GROUP_RULE = DynamicScaleRule(factor=GROWTH_RATIO, window=1, min_scale=None,
                              backoff=REDUCE_RATIO)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, ratio: Tensor) -> Tensor:
        ctx.save_for_backward(ratio)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (ratio,) = ctx.saved_tensors
        return grad * ratio.to(grad.dtype), None


class GroupLossScaleManager(nn.Module, LossScaleManager):
    """Per-layer-group dynamic loss scales (see the module docstring).

    Args:
        init_loss_scale: the initial scale of every group (a number >= 1), or a list with one
            value per group.
        loss_scale_groups: lists of parameters, one per group, in network order (settable
            later as the attribute ``loss_scale_groups``, as in MindSpore's example).

    Raises:
        TypeError: ``init_loss_scale`` not a number / list of numbers; ``loss_scale_groups``
            not a list of lists.
        ValueError: a scale < 1.
    """

    def __init__(self, init_loss_scale: float | list[float], loss_scale_groups: list) -> None:
        nn.Module.__init__(self)
        vals = init_loss_scale if isinstance(init_loss_scale, (list, tuple)) else [init_loss_scale]
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(
                    "GroupLossScaleManager: 'init_loss_scale' must be a number or a list of "
                    f"numbers, but got {init_loss_scale!r}."
                )
            if not v >= 1 or math.isinf(v):
                raise ValueError(
                    "GroupLossScaleManager: 'init_loss_scale' must be finite and >= 1, but got "
                    f"{init_loss_scale!r}."
                )
        self._loss_scale = init_loss_scale
        self.loss_scale_groups = loss_scale_groups
        self.loss_scale_number = 0
        self.register_buffer("dynamic_loss_scale", torch.ones(2), persistent=False)
        self._hooks: list[Any] = []
        self._hooked: list[int] = []

    # ------------------------------------------------------------------ groups
    @property
    def loss_scale_groups(self) -> list:
        """The parameter groups (lists of parameters)."""
        return self._groups

    @loss_scale_groups.setter
    def loss_scale_groups(self, groups: list) -> None:
        if not isinstance(groups, (list, tuple)) or not all(
            isinstance(g, (list, tuple)) for g in groups
        ):
            raise TypeError(
                "GroupLossScaleManager: 'loss_scale_groups' must be a list of lists of "
                f"parameters, but got {type(groups).__name__}."
            )
        self.__dict__["_groups"] = [list(g) for g in groups]

    @property
    def loss_scales(self) -> list[float]:
        """The current scale of each group."""
        return [float(v) for v in self.dynamic_loss_scale[1:-1]]

    def set_loss_scale_status(self, loss_scale_number: int, init_loss_scale: Any) -> None:
        """Create the scales ``[1, s_1..s_n, 1]`` (MindSpore's method of the same name)."""
        s = torch.ones(loss_scale_number + 2)
        if isinstance(init_loss_scale, (list, tuple)):
            for i, v in enumerate(init_loss_scale[:loss_scale_number]):
                s[i + 1] = float(v)
        else:
            s[1 : loss_scale_number + 1] = float(init_loss_scale)
        self.loss_scale_number = loss_scale_number
        self.dynamic_loss_scale = s.to(self.dynamic_loss_scale.device)

    def update_loss_scale_status(self, layer: int, update_ratio: float) -> float:
        """Multiply group ``layer``'s scale (0-based) by ``update_ratio``; returns it."""
        self.dynamic_loss_scale[layer + 1] *= update_ratio
        return float(self.dynamic_loss_scale[layer + 1])

    def _ensure_status(self) -> None:
        if self.loss_scale_number != len(self._groups) or self.dynamic_loss_scale.numel() != (
            len(self._groups) + 2
        ):
            self.set_loss_scale_status(len(self._groups), self._loss_scale)
        self._install_hooks()

    def _install_hooks(self) -> None:
        ids = [id(p) for g in self._groups for p in g]
        if ids == self._hooked:
            return
        self.remove_hooks()
        for k, group in enumerate(self._groups):
            for p in group:
                if isinstance(p, Tensor) and p.requires_grad:
                    self._hooks.append(p.register_hook(_Unscale(self, k + 1)))
        self._hooked = ids

    def remove_hooks(self) -> None:
        """Remove the per-parameter unscaling hooks."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._hooked = []

    # ------------------------------------------------------------------ marker
    def forward(self, x: Tensor, layer1: int, layer2: int) -> Tensor:
        """Identity forward; backward multiplies by ``s[layer1] / s[layer2]``."""
        self._ensure_status()
        s = self.dynamic_loss_scale
        n = s.numel()
        if not (0 <= layer1 < n and 0 <= layer2 < n):
            raise ValueError(
                f"GroupLossScaleManager: layers must be in [0, {n - 1}] for "
                f"{self.loss_scale_number} groups, but got ({layer1}, {layer2})."
            )
        if not torch.is_grad_enabled() or not x.requires_grad:
            return x
        return _ScaleGrad.apply(x, (s[layer1] / s[layer2]).detach().clone())

    # ------------------------------------------------------------------ LossScaleManager
    def get_loss_scale(self) -> float:
        """The scale of the loss itself: 1.0 (the group scales act inside the network)."""
        return 1.0

    def update_loss_scale(self, overflow: bool) -> None:
        """Host-side mirror: nothing (the update cell moves the group scales)."""

    def get_drop_overflow_update(self) -> bool:
        """True: the optimizer runs only if no group overflowed."""
        return True

    def get_update_cell(self) -> nn.Module:
        """The per-group update cell (installs the unscaling hooks)."""
        self._ensure_status()
        return _GroupUpdateCell(self)


class _Unscale:
    def __init__(self, manager: GroupLossScaleManager, index: int) -> None:
        self.manager = manager
        self.index = index

    def __call__(self, grad: Tensor) -> Tensor:
        s = self.manager.dynamic_loss_scale[self.index]
        return grad / s.to(grad.device, grad.dtype)


class _GroupUpdateCell(nn.Module):
    """``cell(loss_scale, overflow)``: per-group scale update; ``loss_scale`` stays 1."""

    def __init__(self, manager: GroupLossScaleManager) -> None:
        super().__init__()
        self.__dict__["manager"] = manager  # not a submodule (it may live in the network)

    def get_loss_scale(self) -> float:
        return 1.0

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"group_loss_scales": self.manager.dynamic_loss_scale.detach().clone()}

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        v = state_dict.get("group_loss_scales")
        if v is not None:
            self.manager.dynamic_loss_scale = torch.as_tensor(v, dtype=torch.float32).reshape(-1)
            self.manager.loss_scale_number = self.manager.dynamic_loss_scale.numel() - 2
        return None

    def forward(self, loss_scale: Tensor, overflow: Any) -> Tensor:
        m = self.manager
        ovf = bool(overflow)
        bad = [
            ovf and any(
                p.grad is not None and not bool(torch.isfinite(p.grad).all()) for p in group
            )
            for group in m.loss_scale_groups
        ]
        scales = m.dynamic_loss_scale[1 : len(bad) + 1]
        flags = torch.tensor(bad, dtype=torch.bool, device=scales.device)
        new, _, _ = next_scale_state(scales, 0, None, flags, GROUP_RULE, TENSOR)
        scales.copy_(new)
        return loss_scale


class LossScaleGroup(BoostAlgorithm):
    """The boost flag ``loss_scale_group``: the module must train with a
    :class:`GroupLossScaleManager`.

    MindSpore's flag switches its train step to per-group loss scaling; in lit_amp the manager
    does that itself (``LitModel(..., loss_scale_manager=GroupLossScaleManager(...))``), so
    this callback only checks at setup that the module has one.

    Raises:
        TypeError: at setup, the module's ``loss_scale_manager`` is not a
            :class:`GroupLossScaleManager` (MindSpore raises TypeError too). A module without
            ``amp_kwargs`` (not a ``LitModel``) gets a warning.

    Example:
        >>> LossScaleGroup().name
        'loss_scale_group'
    """

    name = "loss_scale_group"

    @classmethod
    def from_boost_config(cls, config: BoostConfig) -> LossScaleGroup:
        """No settings: ``LossScaleGroup()``."""
        return cls()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        kwargs = getattr(pl_module, "amp_kwargs", None)
        if kwargs is None:
            log.warning(
                "AutoBoost: 'loss_scale_group' is on but %s has no loss_scale_manager; use "
                "lit_amp.LitModel(..., loss_scale_manager=GroupLossScaleManager(...)).",
                type(pl_module).__name__,
            )
        elif not isinstance(kwargs.get("loss_scale_manager"), GroupLossScaleManager):
            raise TypeError(
                "boost 'loss_scale_group' needs loss_scale_manager to be a "
                f"GroupLossScaleManager, but got {type(kwargs.get('loss_scale_manager')).__name__}."
            )
        super().setup(trainer, pl_module, stage)
