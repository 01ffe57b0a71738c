"""MindSpore's wrapper cells in PyTorch: ``WithLossCell``, ``WithEvalCell``, ``TrainOneStepCell``.

Pure PyTorch (no Lightning). ``Model``/``LitModel`` build these exactly as MindSpore's
``Model._build_*_network`` does (docs/semantics.md §1.2); ``build_train_network`` returns a
``TrainOneStepCell`` (or its loss-scaled subclass). :class:`UpdateCellManager` lets a loss-scale
update cell stand where MindSpore's ``TrainOneStepWithLossScaleCell`` takes
``scale_sense=<update cell>``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lit_amp.amp.loss_scale.managers import (
    DynamicLossScaleUpdateCell,
    FixedLossScaleUpdateCell,
    LossScaleManager,
)
from lit_amp.serialization import PREFIX_KEY, checkpoint_views

__all__ = ["WithLossCell", "WithEvalCell", "TrainOneStepCell", "UpdateCellManager"]


class WithLossCell(nn.Module):
    """``loss_fn(backbone(data), label)``.

    Example:
        >>> cell = WithLossCell(nn.Linear(3, 2), nn.CrossEntropyLoss())
        >>> cell(torch.randn(4, 3), torch.tensor([0, 1, 0, 1])).shape
        torch.Size([])
    """

    def __init__(self, backbone: nn.Module, loss_fn: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.loss_fn = loss_fn

    def forward(self, data: Any, label: Any) -> torch.Tensor:
        out = self.backbone(data)
        return self.loss_fn(out, label)


class WithEvalCell(nn.Module):
    """Returns ``(loss, outputs, label)`` for metrics; ``add_cast_fp32`` casts outputs and label.

    Example:
        >>> cell = WithEvalCell(nn.Linear(3, 2), nn.CrossEntropyLoss())
        >>> loss, out, label = cell(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))
        >>> out.shape
        torch.Size([4, 2])
    """

    def __init__(self, network: nn.Module, loss_fn: nn.Module | None, add_cast_fp32: bool = False):
        super().__init__()
        self.network = network
        self.loss_fn = loss_fn
        self.add_cast_fp32 = add_cast_fp32

    def forward(self, data: Any, label: Any) -> tuple[Any, Any, Any]:
        out = self.network(data)
        if self.add_cast_fp32:
            if torch.is_tensor(label) and label.is_floating_point():
                label = label.float()
            if torch.is_tensor(out) and out.is_floating_point():
                out = out.float()
        loss = self.loss_fn(out, label) if self.loss_fn is not None else None
        return loss, out, label


class TrainOneStepCell(nn.Module):
    """One optimizer step: forward the loss network, backward, ``optimizer.step()``.

    Calling it returns the (detached) loss. ``sens`` multiplies the initial gradient (MindSpore's
    ``sens``; 1.0 by default).

    Example:
        >>> net = nn.Linear(3, 2)
        >>> step = TrainOneStepCell(WithLossCell(net, nn.CrossEntropyLoss()),
        ...                         torch.optim.SGD(net.parameters(), lr=0.1))
        >>> float(step(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))) > 0
        True
    """

    def __init__(self, network: nn.Module, optimizer: torch.optim.Optimizer, sens: float = 1.0):
        super().__init__()
        self.network = network
        self.optimizer = optimizer
        self.sens = float(sens)

    def forward(self, *inputs: Any) -> Any:
        loss = self.network(*inputs)
        self.optimizer.zero_grad(set_to_none=True)
        (loss * self.sens if self.sens != 1.0 else loss).backward()
        self.optimizer.step()
        return loss.detach()

    def checkpoint_state(self) -> dict:
        """Network and optimizer state in Lightning's shape, for
        :func:`lit_amp.serialization.save_checkpoint`."""
        return {"state_dict": self.network.state_dict(), PREFIX_KEY: "",
                "optimizer_states": [self.optimizer.state_dict()]}

    def load_checkpoint_state(self, state: dict) -> None:
        """Inverse of :meth:`checkpoint_state` (also takes :func:`load_checkpoint`'s views)."""
        if "network" not in state:
            state = checkpoint_views(state)
        self.network.load_state_dict(state["network"])
        if state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])


class UpdateCellManager(LossScaleManager):
    """A loss-scale update cell used as a manager: MindSpore's ``scale_sense=<update cell>``.

    MindSpore's ``TrainOneStepWithLossScaleCell(network, optimizer, scale_sense=cell)`` takes
    ``nn.DynamicLossScaleUpdateCell(...)`` or ``manager.get_update_cell()``: the scale starts at
    ``cell.get_loss_scale()``, an overflowing step is skipped, and the cell updates the scale
    after every step (the cell's own counters advance). Wrapped in this manager, the cell does
    the same under :class:`~lit_amp.amp.loss_scale.controller.LossScaleController`.

    Args:
        update_cell: a :class:`DynamicLossScaleUpdateCell` or :class:`FixedLossScaleUpdateCell`.

    Raises:
        TypeError: ``update_cell`` is not one of these cells.

    Example:
        >>> from lit_amp.amp.loss_scale.controller import LossScaleController
        >>> cell = DynamicLossScaleUpdateCell(1024.0, 2, 1)
        >>> ctl = LossScaleController(UpdateCellManager(cell))
        >>> ctl.scale
        1024.0
        >>> ctl.update(False)
        >>> ctl.scale
        2048.0
    """

    def __init__(self, update_cell: nn.Module) -> None:
        if not isinstance(update_cell, (DynamicLossScaleUpdateCell, FixedLossScaleUpdateCell)):
            raise TypeError(
                "For 'UpdateCellManager', the argument 'update_cell' must be a "
                "DynamicLossScaleUpdateCell or a FixedLossScaleUpdateCell, but got "
                f"{type(update_cell).__name__}."
            )
        self.update_cell = update_cell

    def get_loss_scale(self) -> float:
        """The cell's initial scale (``update_cell.get_loss_scale()``)."""
        return float(self.update_cell.get_loss_scale())

    def update_loss_scale(self, overflow: bool) -> None:
        """No-op: the update cell updates the scale (the controller calls it each step)."""

    def get_update_cell(self) -> nn.Module:
        """The wrapped cell itself (its counters advance as MindSpore's do)."""
        return self.update_cell

    def get_drop_overflow_update(self) -> bool:
        """True: with an update cell MindSpore skips every overflowing step."""
        return True

    def __repr__(self) -> str:
        return f"UpdateCellManager({self.update_cell!r})"
