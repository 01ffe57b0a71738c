"""``build_train_network``: MindSpore's mixed-precision train-step builder (docs/semantics.md §2.4).

The returned module is a train step: calling it with a batch runs the forward, the loss, the
backward and the optimizer step, and returns the (detached, unscaled) loss - or
``(loss, overflow, scale)`` when the loss-scale manager has an update cell (dynamic scaling, or
``FixedLossScaleManager(drop_overflow_update=True)``), as MindSpore's
``TrainOneStepWithLossScaleCell`` does.

Example (MindSpore's documented example, translated; ``LeNet5`` from the MindSpore docs):
    >>> import torch
    >>> from torch import nn
    >>> class LeNet5(nn.Module):
    ...     def __init__(self, num_class=10, num_channel=1):
    ...         super().__init__()
    ...         self.conv1 = nn.Conv2d(num_channel, 6, 5)
    ...         self.conv2 = nn.Conv2d(6, 16, 5)
    ...         self.fc1, self.fc2 = nn.Linear(16 * 5 * 5, 120), nn.Linear(120, 84)
    ...         self.fc3 = nn.Linear(84, num_class)
    ...         self.relu, self.pool = nn.ReLU(), nn.MaxPool2d(2, 2)
    ...     def forward(self, x):
    ...         x = self.pool(self.relu(self.conv1(x)))
    ...         x = self.pool(self.relu(self.conv2(x))).flatten(1)
    ...         return self.fc3(self.relu(self.fc2(self.relu(self.fc1(x)))))
    >>> network = LeNet5()
    >>> net_loss = nn.CrossEntropyLoss(reduction="mean")   # SoftmaxCrossEntropyWithLogits
    >>> net_opt = torch.optim.SGD(network.parameters(), lr=0.01, momentum=0.9)  # nn.Momentum
    >>> amp_level = "O3"
    >>> net = build_train_network(network, net_opt, net_loss, amp_level)  # bf16 on CPU
    >>> loss = net(torch.randn(4, 1, 32, 32), torch.tensor([0, 1, 2, 3]))
    >>> loss.dtype
    torch.float32
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from torch import nn

from lit_amp._validation import check_number
from lit_amp.amp.cells import TrainOneStepCell, UpdateCellManager, WithLossCell
from lit_amp.amp.convert import apply_amp_config
from lit_amp.amp.levels import (
    UNSET,
    AmpConfig,
    resolve_amp_config,
    validate_amp_level,
)
from lit_amp.amp.names import BOOST_LEVELS

__all__ = [
    "build_train_network",
    "TrainOneStepWithLossScaleCell",
    "WithLossCellAmp",
    "BUILD_KWARGS",
]

log = logging.getLogger(__name__)

#: Accepted ``**kwargs`` of :func:`build_train_network` (MindSpore's three, plus ``dtype``).
BUILD_KWARGS: tuple[str, ...] = ("cast_model_type", "keep_batchnorm_fp32", "loss_scale_manager",
                                 "dtype")

_LOW = (torch.float16, torch.bfloat16)


def _to_fp32(x: Any) -> Any:
    if torch.is_tensor(x) and x.dtype in _LOW:
        return x.float()
    if isinstance(x, (tuple, list)):
        return type(x)(_to_fp32(v) for v in x) if not hasattr(x, "_fields") else type(x)(
            *(_to_fp32(v) for v in x)
        )
    return x


class WithLossCellAmp(WithLossCell):
    """``loss_fn(fp32(backbone(data)), fp32(label))``: the loss is computed in float32.

    MindSpore's ``_WithLossCellAmp`` (used for O2/O3); lit_amp uses it at every converted level.

    Example:
        >>> cell = WithLossCellAmp(nn.Linear(3, 2), nn.CrossEntropyLoss())
        >>> cell(torch.randn(4, 3), torch.tensor([0, 1, 0, 1])).dtype
        torch.float32
    """

    def forward(self, data: Any, label: Any) -> torch.Tensor:
        out = _to_fp32(self.backbone(data))
        return self.loss_fn(out, _to_fp32(label))


class TrainOneStepWithLossScaleCell(TrainOneStepCell):
    """One loss-scaled step (MindSpore's ``TrainOneStepWithLossScaleCell``, docs/semantics.md §2.7).

    ``loss * scale`` is back-propagated, the gradients are unscaled before the optimizer, an
    overflowing step (inf/NaN gradients) skips the optimizer step when the manager drops
    overflows, and the scale is updated by the manager's update cell. Calling the cell returns
    ``(loss, overflow, scale_used)`` (unscaled loss, 0-d bool, 0-d float32 - the scale this step
    used), or just the loss when ``return_outputs=False``.

    Args:
        network: the loss network (returns the loss).
        optimizer: a ``torch.optim.Optimizer``.
        scale_sense: a ``LossScaleManager``, a ``LossScaleController``, an update cell
            (``DynamicLossScaleUpdateCell`` / ``FixedLossScaleUpdateCell``, e.g.
            ``manager.get_update_cell()``: MindSpore's documented form), or a number / 0-d or
            1-element tensor (a fixed scale that skips overflowing steps).
        return_outputs: return ``(loss, overflow, scale)`` (True) or the loss only.

    Example:
        >>> from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager
        >>> net = nn.Linear(3, 1)
        >>> cell = TrainOneStepWithLossScaleCell(
        ...     WithLossCell(net, nn.MSELoss()), torch.optim.SGD(net.parameters(), lr=0.1),
        ...     DynamicLossScaleManager(init_loss_scale=2**10))
        >>> loss, overflow, scale = cell(torch.randn(4, 3), torch.randn(4, 1))
        >>> bool(overflow), float(scale)
        (False, 1024.0)
    """

    def __init__(
        self,
        network: nn.Module,
        optimizer: torch.optim.Optimizer,
        scale_sense: Any,
        *,
        return_outputs: bool = True,
    ) -> None:
        super().__init__(network, optimizer, sens=1.0)
        from lit_amp.amp.loss_scale.controller import LossScaleController
        from lit_amp.amp.loss_scale.managers import (
            DynamicLossScaleUpdateCell,
            FixedLossScaleManager,
            FixedLossScaleUpdateCell,
            LossScaleManager,
        )

        if isinstance(scale_sense, LossScaleController):
            controller = scale_sense
        elif isinstance(scale_sense, (DynamicLossScaleUpdateCell, FixedLossScaleUpdateCell)):
            # MindSpore's documented form: scale_sense=manager.get_update_cell()
            controller = LossScaleController(UpdateCellManager(scale_sense))
        elif isinstance(scale_sense, LossScaleManager):
            controller = LossScaleController(scale_sense)
        elif isinstance(scale_sense, (int, float)) and not isinstance(scale_sense, bool) or (
            torch.is_tensor(scale_sense) and scale_sense.numel() == 1
        ):
            if torch.is_tensor(scale_sense) and scale_sense.dim() > 1:
                raise ValueError(
                    "For 'TrainOneStepWithLossScaleCell', a tensor 'scale_sense' must have shape "
                    f"() or (1,), but got {tuple(scale_sense.shape)}."
                )
            controller = LossScaleController(FixedLossScaleManager(float(scale_sense), True))
        else:
            if torch.is_tensor(scale_sense):
                raise ValueError(
                    "For 'TrainOneStepWithLossScaleCell', a tensor 'scale_sense' must have shape "
                    f"() or (1,), but got {tuple(scale_sense.shape)}."
                )
            raise TypeError(
                "For 'TrainOneStepWithLossScaleCell', the argument 'scale_sense' must be a "
                "LossScaleManager, a LossScaleController, a number or a tensor, but got "
                f"{type(scale_sense).__name__}."
            )
        self.controller = controller
        self.return_outputs = return_outputs

    def forward(self, *inputs: Any) -> Any:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.network(*inputs)
        if torch.is_tensor(loss) and loss.dtype in _LOW:
            loss = loss.float()
        out = self.controller.step(self.optimizer, loss)
        return out if self.return_outputs else out[0]

    def set_sense_scale(self, sens: Any) -> None:
        """Set the loss scale the next step uses (MindSpore's ``set_sense_scale``).

        Args:
            sens: a positive finite number or a 1-element tensor.

        Raises:
            TypeError: ``sens`` is neither.
            ValueError: ``sens`` is not a finite number > 0.
        """
        if torch.is_tensor(sens):
            if sens.numel() != 1:
                raise ValueError("For 'set_sense_scale', the argument 'sens' must have one "
                                 f"element, but got shape {tuple(sens.shape)}.")
            sens = float(sens.reshape(()))
        value = check_number("set_sense_scale", "sens", sens, minimum=0.0, strict=True)
        self.controller.set_scale(value)

    def checkpoint_state(self) -> dict:
        """Network, optimizer and loss-scale state (under ``LossScaleController.STATE_KEY``)."""
        state = super().checkpoint_state()
        state[self.controller.STATE_KEY] = self.controller.state_dict()
        return state

    def load_checkpoint_state(self, state: dict) -> None:
        """Inverse of :meth:`checkpoint_state`."""
        super().load_checkpoint_state(state)
        if state.get(self.controller.STATE_KEY) is not None:
            self.controller.load_state_dict(state[self.controller.STATE_KEY])


def _check_args(network: Any, optimizer: Any, loss_fn: Any, level: Any, boost_level: Any,
                kwargs: dict) -> None:
    func = "build_train_network"
    if not isinstance(network, nn.Module):
        raise TypeError(
            f"For '{func}', the argument 'network' must be a torch.nn.Module, "
            f"but got {type(network).__name__}."
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"For '{func}', the argument 'optimizer' must be a torch.optim.Optimizer, "
            f"but got {type(optimizer).__name__}."
        )
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(
            f"For '{func}', the argument 'loss_fn' must be None, an nn.Module or a callable, "
            f"but got {type(loss_fn).__name__}."
        )
    validate_amp_level(level, "level", "build_train_network")
    if not isinstance(boost_level, str):
        raise TypeError(
            f"For '{func}', the argument 'boost_level' must be a str, "
            f"but got {type(boost_level).__name__}."
        )
    if boost_level not in BOOST_LEVELS:
        raise ValueError(
            f"For '{func}', the argument 'boost_level' must be one of {list(BOOST_LEVELS)}, "
            f"but got {boost_level!r}."
        )
    for key in kwargs:
        if key not in BUILD_KWARGS:
            raise ValueError(
                f"For '{func}', unsupported arg {key!r}; the supported kwargs are "
                f"{list(BUILD_KWARGS)}."
            )


def build_train_network(
    network: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Any = None,
    level: str = "O0",
    boost_level: str = "O0",
    **kwargs: Any,
) -> nn.Module:
    """Build a mixed-precision train step (MindSpore's ``amp.build_train_network``).

    The network is converted in place for ``level`` (see :mod:`lit_amp.amp.levels` for the
    level table), the loss is computed in float32 whenever the network is converted, and the
    step is wrapped with loss scaling when a loss-scale manager applies.

    Args:
        network: the backbone (``loss_fn`` given) or a network that returns the loss.
        optimizer: a ``torch.optim.Optimizer`` over ``network``'s parameters.
        loss_fn: ``loss_fn(output, label)``; None when ``network`` computes the loss.
        level: ``"O0"``, ``"O1"``, ``"O2"``, ``"O3"`` or ``"auto"``.
        boost_level: ``"O0"``, ``"O1"`` or ``"O2"`` (validated; boost algorithms are applied
            by ``Model``/``AutoBoost``, not here).
        **kwargs: ``cast_model_type`` (torch.float16 / torch.bfloat16 / torch.float32),
            ``keep_batchnorm_fp32`` (bool), ``loss_scale_manager`` (None or a
            ``LossScaleManager``) override the level; ``dtype`` (torch.float16 /
            torch.bfloat16; default float16 on CUDA, bfloat16 on CPU) - a lit_amp addition.

    Returns:
        A callable train-step module: ``step(*batch)`` returns the loss, or
        ``(loss, overflow, scale)`` with a manager that has an update cell. Its attribute
        ``amp_config`` holds the resolved :class:`~lit_amp.amp.levels.AmpConfig`.

    Raises:
        TypeError: wrong type of ``network``, ``optimizer``, ``loss_fn``, ``level``,
            ``boost_level``, ``keep_batchnorm_fp32`` or ``loss_scale_manager``.
        ValueError: unknown level / boost level, an unsupported kwarg, a bad
            ``cast_model_type`` or ``dtype``.

    Example:
        >>> net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> step = build_train_network(net, opt, nn.CrossEntropyLoss(), level="O2")
        >>> float(step(torch.randn(4, 8), torch.tensor([0, 1, 1, 0]))) > 0
        True
    """
    _check_args(network, optimizer, loss_fn, level, boost_level, kwargs)
    if boost_level != "O0":
        warnings.warn(
            f"build_train_network: boost_level={boost_level!r} is applied by Model / the "
            "AutoBoost callback; build_train_network builds the AMP step only.",
            UserWarning,
            stacklevel=2,
        )
    p = next(network.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    cfg = resolve_amp_config(
        level,
        device=device,
        dtype=kwargs.get("dtype"),
        keep_batchnorm_fp32=kwargs.get("keep_batchnorm_fp32"),
        cast_model_type=kwargs.get("cast_model_type"),
        loss_scale_manager=kwargs.get("loss_scale_manager", UNSET),
    )
    apply_amp_config(network, cfg)
    return _wrap(network, optimizer, loss_fn, cfg)


def _wrap(network: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Any,
          cfg: AmpConfig) -> nn.Module:
    net: nn.Module = network
    if loss_fn is not None:
        net = WithLossCellAmp(network, loss_fn) if cfg.loss_in_fp32 else WithLossCell(
            network, loss_fn
        )
    manager = cfg.loss_scale_manager
    if manager is None:
        step: nn.Module = TrainOneStepCell(net, optimizer)
    else:
        has_cell = manager.get_update_cell() is not None
        step = TrainOneStepWithLossScaleCell(net, optimizer, manager, return_outputs=has_cell)
    step.amp_config = cfg
    return step
