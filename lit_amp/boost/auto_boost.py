"""``AutoBoost``: MindSpore's boost levels as one Lightning callback (docs/semantics.md §3.1-3.3).

``AutoBoost(level, boost_config_dict)`` resolves the level table and the config
(:mod:`lit_amp.boost.config`) and builds the algorithm callbacks of
:mod:`lit_amp.boost.registry` that are on, in the registry's (MindSpore's) order, each by its
class's ``from_boost_config``. An algorithm that composes only with some others keeps only
those beside it: with ``dim_reduce`` on, only ``loss_scale_group`` stays (MindSpore returns
before applying anything else).

It is an ordinary callback: ``Trainer(callbacks=[AutoBoost("O1")])`` works with any
LightningModule. It acts on ``pl_module.network`` when that is a Module (``LitModel``), else on
the module itself. Network surgery happens in ``setup`` (before AMP conversion in
``configure_model`` and before DDP wrapping); hooks are attached at ``on_fit_start`` and removed
(trainable flags restored) at the end of fit. It overrides none of Lightning's gradient hooks,
so ``LitModel``'s fast path stays on. The algorithms' state is saved in Lightning checkpoints
and, by ``LitModel``, under ``"lit_amp_boost"``. Each instance is independent: there is no
process-wide singleton.

Boost is not applied with THOR (MindSpore's ``ModelThor`` builds its own train step): a
warning, nothing changes.

Example:
    >>> ab = AutoBoost("O1")
    >>> [a.name for a in ab.algorithms]
    ['less_bn', 'grad_freeze']
    >>> AutoBoost("O2", {"boost": {"mode": "manual", "less_bn": False}}).enabled
    ('grad_freeze', 'adasum')
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from torch import nn

from lit_amp._runtime import unwrap_optimizer
from lit_amp.boost.base import BoostAlgorithm, is_thor_optimizer
from lit_amp.boost.config import BoostConfig, parse_boost_config
from lit_amp.boost.registry import ALGORITHMS

__all__ = ["AutoBoost", "build_algorithms"]

log = logging.getLogger(__name__)


def build_algorithms(config: BoostConfig) -> list[BoostAlgorithm]:
    """The algorithm callbacks of a resolved config, in the registry's order.

    Raises:
        ValueError: an algorithm refuses its settings (``dim_reduce`` in mode ``enable_all``
            without a PCA source).
    """
    on = [a for a in ALGORITHMS if config.flags[a.name]]
    for algo in list(on):
        if algo in on:  # not dropped by an algorithm before it
            on = [other for other in on if algo.composes(other.name)]
    built = (a.load().from_boost_config(config) for a in on)
    return [b for b in built if b is not None]


class AutoBoost(L.Callback):
    """MindSpore's ``AutoBoost`` as a Lightning callback.

    Args:
        level: "O0" (nothing), "O1" (LessBN + GradientFreeze) or "O2" (O1 + AdaSum).
        boost_config_dict: MindSpore's schema (see :mod:`lit_amp.boost.config`): a dict, the
            path of a JSON file, ``""`` or None.

    Attributes:
        config: the resolved :class:`~lit_amp.boost.config.BoostConfig`.
        algorithms: the algorithm callbacks, in application order.

    Raises:
        TypeError / ValueError: invalid level or config (messages name the key and the
            allowed values).

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[AutoBoost("O1")], max_epochs=1)  # doctest: +SKIP
    """

    def __init__(self, level: str = "O1", boost_config_dict: Any = None) -> None:
        self.config = parse_boost_config(level, boost_config_dict)
        self.algorithms: list[BoostAlgorithm] = build_algorithms(self.config)
        self._disabled = False

    # ------------------------------------------------------------------ info
    @property
    def level(self) -> str:
        """The boost level."""
        return self.config.level

    @property
    def enabled(self) -> tuple[str, ...]:
        """The features switched on by the level and the config."""
        return self.config.enabled

    @property
    def requires_find_unused_parameters(self) -> bool:
        """Whether DDP needs ``find_unused_parameters=True`` (GradientFreeze)."""
        return any(a.requires_find_unused_parameters for a in self.algorithms)

    @property
    def state_key(self) -> str:
        return self._generate_state_key(level=self.config.level)

    def get_algorithm(self, name: str) -> BoostAlgorithm | None:
        """The algorithm callback called ``name`` ("less_bn", "grad_freeze", ...), or None."""
        return next((a for a in self.algorithms if a.name == name), None)

    # ------------------------------------------------------------------ pure torch
    def network_auto_process_train(
        self, network: nn.Module, optimizer: torch.optim.Optimizer | None = None
    ) -> tuple[nn.Module, torch.optim.Optimizer | None]:
        """Network surgery (LessBN) and optimizer fix-ups, in place; MindSpore's method name.

        Idempotent. Call it before AMP conversion (``LitModel`` does it in its constructor);
        the hooks are attached later by :meth:`attach` (the callback does it at fit start).
        """
        if optimizer is not None and is_thor_optimizer(optimizer):
            self._disable_for_thor()
        if self._disabled:
            return network, optimizer
        for algo in self.algorithms:
            algo.apply_to_network(network)
            if optimizer is not None:
                algo.sync_optimizer(unwrap_optimizer(optimizer))
        return network, optimizer

    def network_auto_process_eval(self, network: nn.Module) -> nn.Module:
        """The evaluation network gets the surgery it needs (LessBN's); MindSpore's name."""
        if not self._disabled:
            for algo in self.algorithms:
                algo.apply_to_eval_network(network)
        return network

    def attach(
        self, network: nn.Module, optimizers: Sequence[torch.optim.Optimizer], **context: Any
    ) -> None:
        """Install every algorithm's hooks (pure torch; the callback calls it at fit start)."""
        if self._disabled:
            return
        opts = [unwrap_optimizer(o) for o in optimizers]
        for algo in self.algorithms:
            algo.attach(network, opts, **context)

    def detach(self) -> None:
        """Remove every algorithm's hooks and restore the trainable flags."""
        for algo in self.algorithms:
            algo.detach()

    def _disable_for_thor(self) -> None:
        if not self._disabled and self.algorithms:
            log.warning(
                "AutoBoost: boost_level=%r is not applied with the THOR optimizer (as in "
                "MindSpore, whose ModelThor builds its own train step).",
                self.level,
            )
        self._disabled = True

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        opt = getattr(pl_module, "optimizer", None)
        if opt is not None and not callable(opt) and is_thor_optimizer(opt):
            self._disable_for_thor()
        if self._disabled:
            return
        sync_off = any(a.unsyncs_ddp(trainer.world_size) for a in self.algorithms)
        for algo in self.algorithms:
            algo.ddp_gradient_sync_off = sync_off
            algo.setup(trainer, pl_module, stage)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if any(is_thor_optimizer(o) for o in trainer.optimizers):
            self._disable_for_thor()
        if self._disabled:
            return
        for algo in self.algorithms:
            algo.on_fit_start(trainer, pl_module)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._disabled:
            for algo in self.algorithms:
                algo.on_train_epoch_start(trainer, pl_module)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._disabled:
            for algo in self.algorithms:
                algo.on_train_batch_start(trainer, pl_module, batch, batch_idx)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.detach()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.detach()

    def state_dict(self) -> dict[str, Any]:
        return {
            "level": self.config.level,
            "enabled": list(self.enabled),
            "algorithms": {a.name: a.state_dict() for a in self.algorithms},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("algorithms", {})
        for algo in self.algorithms:
            if algo.name in saved:
                algo.load_state_dict(saved[algo.name])

    def __repr__(self) -> str:
        return f"AutoBoost(level={self.level!r}, enabled={list(self.enabled)})"
