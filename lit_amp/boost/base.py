"""The shared shape of every boost algorithm: a Lightning callback with declared side effects.

Each algorithm module (listed in :mod:`lit_amp.boost.registry`) has a pure-PyTorch functional
core (network surgery, optimizer step hooks) and a thin :class:`BoostAlgorithm` callback that
applies it to a Lightning run:

- :meth:`BoostAlgorithm.from_boost_config` builds it from a resolved
  :class:`~lit_amp.boost.config.BoostConfig` (what ``AutoBoost`` calls);
- :meth:`BoostAlgorithm.apply_to_network` (pure torch, idempotent) -- network surgery, run from
  the callback's ``setup`` hook, i.e. before ``configure_model`` (AMP) and before the strategy
  wraps the module (DDP); :meth:`~BoostAlgorithm.apply_to_eval_network` and
  :meth:`~BoostAlgorithm.sync_optimizer` bring an evaluation network and an optimizer in line;
- :meth:`BoostAlgorithm.attach` / :meth:`BoostAlgorithm.detach` (pure torch) -- optimizer and
  forward hooks, from ``on_fit_start`` to ``teardown``. Step hooks on the optimizer fire in any
  training loop (Lightning automatic or manual optimization, ``LitModel``'s fast path, a raw
  loop), and are skipped with the optimizer step (loss-scale overflow);
- :meth:`~BoostAlgorithm.state_dict` / :meth:`~BoostAlgorithm.load_state_dict`: what a
  checkpoint must carry for a resumed run to continue identically (``AutoBoost`` saves them
  under ``"lit_amp_boost"`` and in Lightning's callback states);
- side effects as properties, as in Composer: :attr:`requires_find_unused_parameters` (the
  Lightning DDP strategy is switched to ``find_unused_parameters=True`` before it wraps the
  model, with a log line) and :meth:`~BoostAlgorithm.unsyncs_ddp`.

The network is found with :func:`find_network`: ``pl_module.network`` when that attribute is a
Module (``LitModel``), else the LightningModule itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import lightning as L
import torch
from torch import nn

from lit_amp._runtime import unwrap_optimizer

if TYPE_CHECKING:
    from lit_amp.boost.config import BoostConfig

__all__ = ["BoostAlgorithm", "find_network", "is_thor_optimizer"]

log = logging.getLogger(__name__)


def find_network(pl_module: nn.Module) -> nn.Module:
    """The network boost acts on: ``pl_module.network`` if it is a Module, else ``pl_module``.

    Example:
        >>> find_network(nn.Linear(2, 2)).__class__.__name__
        'Linear'
    """
    net = getattr(pl_module, "network", None)
    return net if isinstance(net, nn.Module) else pl_module


def is_thor_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is THOR (boost is not applied with THOR, as in MindSpore)."""
    opt = unwrap_optimizer(optimizer)
    return bool(getattr(opt, "is_thor", False)) or type(opt).__name__.lower().startswith("thor")


def _ddp_needs_unused(trainer: L.Trainer, who: str) -> None:
    """Switch a (not yet wrapped) Lightning DDP strategy to ``find_unused_parameters=True``."""
    from lightning.pytorch.strategies import DDPStrategy

    strategy = trainer.strategy
    if not isinstance(strategy, DDPStrategy):
        return
    kwargs = getattr(strategy, "_ddp_kwargs", None)
    if kwargs is None or kwargs.get("find_unused_parameters") is True:
        return
    if isinstance(strategy.model, nn.parallel.DistributedDataParallel):
        log.warning(
            "%s needs DDP(find_unused_parameters=True) but the model is already wrapped; pass "
            "strategy='ddp_find_unused_parameters_true'.",
            who,
        )
        return
    if kwargs.get("find_unused_parameters") is False:
        log.warning(
            "%s freezes parameters on some steps: overriding find_unused_parameters=False "
            "with True.",
            who,
        )
    else:
        log.info("%s: setting DDP find_unused_parameters=True.", who)
    kwargs["find_unused_parameters"] = True


class BoostAlgorithm(L.Callback):
    """Base class of the boost algorithm callbacks.

    Subclasses set :attr:`name` (their entry in :mod:`lit_amp.boost.registry`) and override
    :meth:`apply_to_network`, :meth:`attach`, :meth:`detach`, :meth:`from_boost_config` when
    their settings are not exactly their config section, and, when they have resumable state,
    :meth:`state_dict` / :meth:`load_state_dict`.

    Example:
        >>> class Noop(BoostAlgorithm):
        ...     name = "noop"
        >>> Noop().requires_find_unused_parameters
        False
    """

    name: ClassVar[str] = "boost_algorithm"
    #: set by AutoBoost when AdaSum switches DDP's gradient synchronisation off: then no
    #: algorithm needs ``find_unused_parameters`` (DDP never reduces a gradient)
    ddp_gradient_sync_off: bool = False

    @classmethod
    def from_boost_config(cls, config: BoostConfig) -> BoostAlgorithm | None:
        """The instance ``config`` asks for (None: the config leaves it off).

        The default passes the algorithm's config section as keyword arguments.
        """
        return cls(**config.section(cls.name))

    @property
    def requires_find_unused_parameters(self) -> bool:
        """Whether DDP must run with ``find_unused_parameters=True`` (params skip backward)."""
        return False

    def unsyncs_ddp(self, world: int) -> bool:
        """Whether, over ``world`` ranks, it switches DDP's gradient synchronisation off (then
        no algorithm needs DDP's unused-parameter search)."""
        return False

    # ------------------------------------------------------------- pure torch
    def apply_to_network(self, network: nn.Module) -> nn.Module:
        """Network surgery (in place, idempotent); returns ``network``."""
        return network

    def apply_to_eval_network(self, network: nn.Module) -> nn.Module:
        """The surgery an evaluation network needs too (in place); returns ``network``."""
        return network

    def sync_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Bring ``optimizer`` in line with :meth:`apply_to_network` (idempotent)."""
        return optimizer

    def attach(
        self, network: nn.Module, optimizers: Sequence[torch.optim.Optimizer], **context: Any
    ) -> None:
        """Install hooks on ``network`` / ``optimizers`` (torch optimizers, not wrappers)."""

    def detach(self) -> None:
        """Remove what :meth:`attach` installed and restore the network's trainable flags."""

    # -------------------------------------------------------------- Lightning
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if (
            self.requires_find_unused_parameters
            and trainer.world_size > 1
            and not self.ddp_gradient_sync_off
        ):
            _ddp_needs_unused(trainer, type(self).__name__)
        self.apply_to_network(find_network(pl_module))

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        opts = [unwrap_optimizer(o) for o in trainer.optimizers]
        self.attach(find_network(pl_module), opts, trainer=trainer, pl_module=pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.detach()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.detach()
