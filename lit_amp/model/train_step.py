"""``LitModel``'s train step, as MindSpore's ``TrainOneStepCell`` runs it, piece by piece.

One step is forward and loss (:meth:`~TrainStepMixin.loss_of`), backward
(:meth:`~TrainStepMixin.train_backward`), then, at the end of a gradient-accumulation window,
unscale, clip (:meth:`~TrainStepMixin.clip_gradients_`), overflow check and the optimizer update
(:meth:`~TrainStepMixin.train_optimizer_step`). The pieces are public so that a runner can
replay the step another way (the sink's CUDA graph, :mod:`lit_amp.model.graph_sink`) without
restating it: :meth:`~TrainStepMixin.capture_blockers` says which of the model's settings
forbid that, and :attr:`~TrainStepMixin.train_step_settings` what a captured step bakes in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import LightningModule

from lit_amp.amp.loss_scale.controller import LossScaleController
from lit_amp.model.data_checks import as_batch_tuple
from lit_amp.model.sharding import no_grad_sync

__all__ = ["TrainStepMixin"]

log = logging.getLogger(__name__)

#: the step driver of a LitModel without loss scaling (a disabled controller keeps no state)
_NO_LOSS_SCALE = LossScaleController(None)


class TrainStepMixin:
    """``LitModel``'s train step and its public seam (mixed into the LightningModule)."""

    def loss_of(self, batch: Any) -> torch.Tensor:
        """The training loss of one batch: the forward half of a MindSpore train step.

        ``network(data)`` then ``loss_fn(output, label)`` (in fp32 when the AMP level asks for
        it), or ``network(*batch)`` when there is no ``loss_fn``. No backward, no step: the
        boost algorithms (``DimReduce``) call it to re-evaluate the loss.

        Args:
            batch: a ``(data, label)`` pair (or the network's inputs without ``loss_fn``).

        Returns:
            The loss tensor (with its graph).

        Example:
            >>> from torch import nn
            >>> from lit_amp import LitModel
            >>> net = nn.Linear(4, 3)
            >>> lit = LitModel(net, nn.CrossEntropyLoss())
            >>> lit.loss_of((torch.randn(2, 4), torch.tensor([0, 2]))).shape
            torch.Size([])
        """
        inputs = as_batch_tuple(batch, expect_pair=self.loss_fn is not None)
        if self.loss_fn is None:
            loss = self.network(*inputs)
        else:
            out = self.network(inputs[0])
            label = inputs[1]
            if self.amp_config is not None and self.amp_config.loss_in_fp32:
                if torch.is_tensor(out) and out.is_floating_point():
                    out = out.float()
                if torch.is_tensor(label) and label.is_floating_point():
                    label = label.float()
            loss = self.loss_fn(out, label)
        return loss

    # ------------------------------------------------------------------ the seam
    @property
    def fast_path(self) -> bool:
        """Whether the step skips Lightning's per-call wrappers (set at train start).

        True on a single device with the default precision plugin and no gradient hook
        (:func:`~lit_amp.model._lightning.fast_path_ok`): :meth:`train_backward` is then
        ``loss.backward()`` and :meth:`train_optimizer_step` ``optimizer.step()`` between
        Lightning's step bookkeeping.
        """
        return self._fast

    def train_backward(self, loss: torch.Tensor, *, sync: bool = True) -> None:
        """The step's backward of ``loss`` (already scaled and divided by the window).

        ``sync=False``: a micro-step before the last of an accumulation window; under
        DDP/FSDP2 the gradients accumulate locally and the last backward reduces their sum
        once. Lightning's ``manual_backward`` off the :attr:`fast_path`.
        """
        with no_grad_sync(self._ddp, self.network, skip=not sync):
            if self._fast:
                loss.backward()
            else:
                self.manual_backward(loss)

    def clip_gradients_(self, optimizer: torch.optim.Optimizer) -> None:
        """Clip ``optimizer``'s gradients as ``Trainer(gradient_clip_val=, ...)`` asks.

        Through Lightning's ``configure_gradient_clipping`` hook; nothing without a clip value.
        """
        val = self._trainer_grad["clip_val"]
        if val:
            algorithm = self._trainer_grad["clip_algorithm"]
            self.configure_gradient_clipping(
                optimizer, gradient_clip_val=val,
                gradient_clip_algorithm=None if algorithm is None else str(algorithm.value),
            )

    def train_optimizer_step(self, update: Callable[[], Any] | None = None) -> None:
        """One optimizer update, counted by Lightning (``global_step`` advances).

        On the :attr:`fast_path`, what ``LightningOptimizer.step`` does on one device with
        the default precision plugin, without its per-call wrappers: Lightning's step
        bookkeeping around ``update`` (default: the optimizer's ``step``; a runner passes
        the replay of a captured step). Otherwise ``LightningOptimizer.step()``.

        Raises:
            RuntimeError: ``update`` is given off the fast path.
        """
        lopt = self._lopt if self._lopt is not None else self.optimizers()
        if self._fast:
            lopt._on_before_step()
            (lopt.optimizer.step if update is None else update)()
            lopt._on_after_step()
        elif update is None:
            lopt.step()
        else:
            raise RuntimeError("LitModel.train_optimizer_step(update) needs the fast path "
                               "(one device, Lightning's default precision, no gradient hook).")

    @property
    def train_step_settings(self) -> tuple:
        """What decides a train step besides the batch, the optimizer and the modules.

        ``(accumulation, clip value, clip algorithm, fast path, boost level, loss scaling)``;
        a step captured under other settings is stale.
        """
        grad = self._trainer_grad
        return (self._accumulation(), grad["clip_val"], grad["clip_algorithm"], self._fast,
                self.boost_level, self.loss_scale is not None and self.loss_scale.enabled)

    def capture_blockers(self, trainer: Any = None) -> list[str]:
        """Why this model's train step cannot be replayed from a capture (empty: nothing here).

        Looks at the model's own settings: AMP not applied, loss scaling, gradient
        accumulation (``trainer``'s too), step-interval LR schedulers, boost, an overridden
        :meth:`train_one_step` or clipping hook. The device, optimizer, modules and Trainer
        are the runner's to check (:func:`~lit_amp.model.graph_plan.plan_sink_graph`).

        Args:
            trainer: the Trainer of the run; None: the one the model is attached to, if any.

        Example:
            >>> from torch import nn
            >>> from lit_amp import LitModel
            >>> net = nn.Linear(4, 2)
            >>> LitModel(net, nn.MSELoss(), torch.optim.SGD(net.parameters(), 0.1),
            ...          amp_level="O2").capture_blockers()
            ["amp_level='O2' is not applied yet (apply_amp)"]
        """
        reasons = []
        if not self._amp_applied and (self.amp_level != "O0" or self.amp_kwargs):
            reasons.append(f"amp_level={self.amp_level!r} is not applied yet (apply_amp)")
        if self.loss_scale is not None and self.loss_scale.enabled:
            reasons.append("loss scaling is on (its overflow check reads the device every "
                           "step): pass loss_scale_manager=None, or use amp_level 'O1'/'O3' or "
                           "bfloat16")
        trainer = self._trainer if trainer is None else trainer
        n = max(self._accumulation(), int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
        if n > 1:
            reasons.append(f"gradient accumulation over {n} batches steps every {n}th batch: "
                           "accumulate_grad_batches / grad_accumulation_step must be 1")
        if any(config.interval == "step" for config, *_ in self.__dict__.get("_lr_plan", ())):
            reasons.append("a step-interval LR scheduler changes the learning rate between "
                           "steps (a captured step would keep the first one): use an 'epoch' "
                           "interval")
        if self.boost_level != "O0" or self.boost is not None:
            reasons.append(f"boost_level={self.boost_level!r} acts at every step: use 'O0'")
        kind = type(self)
        if kind.train_one_step is not TrainStepMixin.train_one_step:
            reasons.append(f"{kind.__name__} overrides train_one_step (the captured step "
                           "would not be yours)")
        if self._trainer_grad["clip_val"] and (
            kind.configure_gradient_clipping is not LightningModule.configure_gradient_clipping
        ):
            reasons.append(f"{kind.__name__} overrides configure_gradient_clipping")
        return reasons

    # ------------------------------------------------------------------ the step
    def _accumulation(self) -> int:
        """Batches per optimizer update (boost's or the Trainer's accumulation)."""
        return max(self.grad_accumulation_steps, self._trainer_grad["accumulate"])

    def train_one_step(self, batch: Any) -> dict[str, Any]:
        """One MindSpore train step; returns ``{"loss"[, "overflow", "loss_scale"]}``."""
        if self._optimizer is None:
            out = self._train_network(*as_batch_tuple(batch, expect_pair=self.loss_fn is not None))
            if torch.is_tensor(out):
                return {"loss": out.detach()}
            return {"loss": out[0].detach() if isinstance(out, (tuple, list)) else out}
        lopt = self._lopt if self._lopt is not None else self.optimizers()
        loss = self.loss_of(batch)
        raw = lopt.optimizer
        n = self._accumulation()
        # Lightning's accumulation also steps on an epoch's last batch (a partial window)
        force = self._trainer_grad["accumulate"] > 1 and self._epoch_last_batch
        first, last = self._accum_i == 0, self._accum_i == n - 1 or force
        self._accum_i = 0 if last else self._accum_i + 1
        if first:
            raw.zero_grad(set_to_none=True)
        scaled = loss / n if n > 1 else loss
        ctl = self.loss_scale
        if ctl is None or not ctl.enabled:
            self.train_backward(scaled, sync=last)
            if last:
                self._apply_step(raw)
            return {"loss": loss.detach()}
        self.train_backward(ctl.scale_loss(scaled), sync=last)
        if not last:
            return {
                "loss": loss.detach(),
                "overflow": torch.tensor(False),
                "loss_scale": torch.tensor(ctl.scale),
            }
        self._apply_step(raw)
        loss_, ovf, scale = ctl.step_outputs(loss.detach())
        return {"loss": loss_, "overflow": ovf, "loss_scale": scale}

    def _apply_step(self, raw: torch.optim.Optimizer) -> None:
        """Apply the accumulated gradients: :meth:`LossScaleController.apply` (unscale, clip,
        overflow check, optimizer step unless skipped, scale update); without loss scaling,
        clip and step."""
        ctl = self.loss_scale if self.loss_scale is not None else _NO_LOSS_SCALE
        # the clipping runs after unscaling: the threshold applies to the true gradients
        done = ctl.apply(raw, self.train_optimizer_step,
                         before_step=lambda: self.clip_gradients_(raw))
        if self.__dict__["_lr_plan"] and not done.skipped:
            # an overflow-skipped step does not advance the schedule (docs/differences.md)
            self._step_lr_schedulers("step", plateau=False)
            self._lr_plateau_due = any(c.interval == "step" and p
                                       for c, p, _, _ in self.__dict__["_lr_plan"])

    @property
    def open_window(self) -> int:
        """Batches of the current gradient-accumulation window not yet applied (0: none)."""
        return self._accum_i

    def apply_open_window(self) -> int:
        """Apply the open gradient-accumulation window now (a stream ended inside it).

        The window's ``m < n`` batches accumulated ``sum(g) / n``; under DDP their micro-steps
        skipped the gradient reduction, so the gradients are averaged over the ranks first;
        they are rescaled by ``n / m`` (the mean over the ``m`` batches, as a full window is
        the mean over its ``n``) and the optimizer steps as every update does (unscale,
        overflow skip, clipping, loss-scale update). Call it on every rank together.

        Returns:
            ``m``, the number of batches applied; 0 when there is no open window, no
            optimizer, or the gradients are sharded (FSDP2: not applied, a warning says so).
        """
        m, optimizer = self._accum_i, self._optimizer
        if m == 0 or optimizer is None:
            return 0
        lopt = self._lopt if self._lopt is not None else self.optimizers()
        raw = lopt.optimizer
        grads = [p.grad for group in raw.param_groups for p in group["params"]
                 if p.grad is not None]
        world = self.trainer.world_size if self._trainer is not None else 1
        if world > 1:
            if any(type(g) is not torch.Tensor for g in grads):  # sharded (FSDP2) gradients
                log.warning("LitModel: an open gradient-accumulation window of sharded "
                            "gradients is not applied (its batches are trained again after "
                            "a restart).")
                return 0
            for g in grads:  # the micro-steps kept local sums
                torch.distributed.all_reduce(g, op=torch.distributed.ReduceOp.SUM)
                g.div_(world)
        n = self._accumulation()
        for g in grads:
            g.mul_(n / m)
        self._apply_step(raw)
        raw.zero_grad(set_to_none=True)
        self._accum_i = 0
        return m
