"""GradientAccumulation: one optimizer update every ``grad_accumulation_step`` batches.

MindSpore (MS ``boost/grad_accumulation.py``, docs/semantics.md §3.3) accumulates ``g / step`` over
``step`` micro-batches and then runs the optimizer once; it is enabled only when
``grad_accumulation_step > 1``. The returned loss stays the per-micro-batch loss.

In lit_amp the training step does the accumulating; this callback only sets the window:

- a module with a ``grad_accumulation_steps`` attribute (``LitModel``, manual optimization):
  the attribute is set; LitModel divides each micro-batch loss by it, zeroes the gradients at
  the start of a window and steps at its end;
- a module with automatic optimization: ``trainer.accumulate_grad_batches`` is set at the start
  of every training epoch (as Lightning's ``GradientAccumulationScheduler`` does);
- any other module: a warning, nothing changes.

Example:
    >>> [accumulation_boundary(i, 3) for i in range(4)]
    [False, False, True, False]
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import lightning as L

from lit_amp.boost.base import BoostAlgorithm

if TYPE_CHECKING:
    from lit_amp.boost.config import BoostConfig

__all__ = ["GradientAccumulation", "accumulation_boundary"]

log = logging.getLogger(__name__)


def accumulation_boundary(micro_step: int, grad_accumulation_step: int) -> bool:
    """Whether micro-batch ``micro_step`` (0-based) ends a window (the optimizer steps)."""
    return (micro_step + 1) % grad_accumulation_step == 0


class GradientAccumulation(BoostAlgorithm):
    """Gradient accumulation as a Lightning callback.

    Args:
        grad_accumulation_step: micro-batches per optimizer update (>= 1; 1 disables).

    Raises:
        TypeError: not an int. ValueError: < 1.

    Example:
        >>> from lit_amp import LitModel
        >>> import torch
        >>> net = torch.nn.Linear(4, 2)
        >>> lit = LitModel(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1))
        >>> GradientAccumulation(4).setup(None, lit, "fit")  # doctest: +SKIP
    """

    name = "grad_accumulation"

    def __init__(self, grad_accumulation_step: int = 1) -> None:
        v = grad_accumulation_step
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(
                f"GradientAccumulation: 'grad_accumulation_step' must be an int, but got {v!r}."
            )
        if v < 1:
            raise ValueError(
                f"GradientAccumulation: 'grad_accumulation_step' must be >= 1, but got {v!r}."
            )
        self.grad_accumulation_step = v
        self._mode = "none"

    @classmethod
    def from_boost_config(cls, config: BoostConfig) -> GradientAccumulation | None:
        """Built only for ``grad_accumulation_step > 1`` (MindSpore's condition)."""
        step = config.section(cls.name)["grad_accumulation_step"]
        return cls(step) if step > 1 else None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        n = self.grad_accumulation_step
        if hasattr(pl_module, "grad_accumulation_steps"):
            pl_module.grad_accumulation_steps = n
            self._mode = "attribute"
        elif getattr(pl_module, "automatic_optimization", False):
            self._mode = "trainer"
        elif n > 1:
            log.warning(
                "GradientAccumulation: %s uses manual optimization and has no "
                "'grad_accumulation_steps' attribute; gradient accumulation is not applied.",
                type(pl_module).__name__,
            )

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._mode == "trainer":
            trainer.accumulate_grad_batches = self.grad_accumulation_step

    def state_dict(self) -> dict[str, Any]:
        return {"grad_accumulation_step": self.grad_accumulation_step}
