"""The online-training loop: MindSpore Rec's ``online_train`` rules on Lightning's hooks.

Lightning's fit loop drives one long epoch over :class:`~lit_amp.rec.online.stream.OnlineStream`;
:class:`OnlineLoop` is the :class:`~lit_amp.callbacks.bridge.MindSporeCallbackBridge` with
``online_train``'s epoch accounting (in sink mode every batch is one epoch) and, around each
step, what MindSpore lacks: stop conditions (:mod:`.stopping`), validation
(:mod:`.validation`), cursor checkpoints (:mod:`.checkpoints`) and publishing
(:mod:`.publisher`).

=========================  ====================================================================
Lightning                  online_train
=========================  ====================================================================
on_train_start             restore the newest checkpoint (weights, optimizer, loss scale,
                           cursor, counters); install signal handlers; ``on_train_begin``
on_train_epoch_start       non-sink: ``cur_epoch_num`` += 1, ``on_train_epoch_begin``
on_train_batch_start       sink: ``cur_epoch_num`` += 1, ``on_train_epoch_begin``;
                           ``cur_step_num`` += 1, ``on_train_step_begin``
on_train_batch_end         ``on_train_step_end``; commit the batch's cursor; validation when
                           due (eval hooks on custom callbacks + TimeMonitor); sink:
                           ``on_train_epoch_end``; stop checks; checkpoint / publish when due
on_train_epoch_end         non-sink: ``on_train_epoch_end``
on_train_end               ``on_train_end``; final checkpoint and publish
=========================  ====================================================================
"""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning as L
import torch

from lit_amp.callbacks.bridge import MindSporeCallbackBridge
from lit_amp.rec.online import gc_freeze
from lit_amp.rec.online.checkpoints import CursorCheckpoints
from lit_amp.rec.online.guard import NonFiniteGuard
from lit_amp.rec.online.options import (
    CheckpointOptions,
    OnlineSummary,
    PublishOptions,
    StopOptions,
    ValidationOptions,
)
from lit_amp.rec.online.publisher import Publisher
from lit_amp.rec.online.ranks import Ranks
from lit_amp.rec.online.stopping import StopConditions
from lit_amp.rec.online.stream import OnlineStream, batch_size_of
from lit_amp.rec.online.validation import validate, validation_due
from lit_amp.rec.sources.base import StreamSource

__all__ = ["OnlineLoop"]

log = logging.getLogger(__name__)

#: stop reasons that are a clean end of a finite stream (an open accumulation window is applied)
_CLEAN_ENDS = ("source_exhausted", "idle_timeout")


def _empty_like(batch: Any) -> Any:
    """``batch`` with every tensor cut to 0 rows (what callbacks see of a filler step)."""
    if torch.is_tensor(batch):
        return batch[:0] if batch.dim() else batch
    if isinstance(batch, dict):
        return {k: _empty_like(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_empty_like(v) for v in batch)
    return batch


class _Restore:
    """Puts ``obj.name`` back to ``value`` on :meth:`remove` (a hook handle's interface)."""

    def __init__(self, obj: Any, name: str, value: Any) -> None:
        self.obj, self.name, self.value = obj, name, value

    def remove(self) -> None:
        setattr(self.obj, self.name, self.value)


class OnlineLoop(MindSporeCallbackBridge):
    """Runs ``online_train``'s rules from Lightning's hooks (see the module docstring).

    Args:
        callbacks: the MindSpore callbacks.
        cb_params: the run's callback parameters.
        stream: what Lightning iterates.
        sink: dataset sink mode (each batch is one epoch for callbacks).
        network: the backbone (published weights are its ``state_dict``).
        stop: the stop options.
        checkpoint: the checkpoint options, or None (no checkpoints).
        publish: the publish options, or None (nothing published).
        validation: the validation options, or None (no validation).
    """

    def __init__(
        self,
        callbacks: Any,
        cb_params: Any,
        stream: OnlineStream,
        *,
        sink: bool,
        network: torch.nn.Module,
        stop: StopOptions,
        checkpoint: CheckpointOptions | None = None,
        publish: PublishOptions | None = None,
        validation: ValidationOptions | None = None,
    ) -> None:
        super().__init__(callbacks, cb_params)
        self.stream = stream
        self.sink = sink
        self.validation = validation
        self.summary = OnlineSummary()
        self.ranks = Ranks()
        self.stop = StopConditions(stop)
        self.checkpoints = (
            None
            if checkpoint is None
            else CursorCheckpoints(checkpoint, stream, self.ranks, cb_params, self.summary,
                                   sink=sink)
        )
        self.publisher = (
            None if publish is None else Publisher(publish, network, self.ranks, self.summary)
        )
        self.cursor: Any = None  # cursor of the last trained batch (this rank)
        self._t0 = 0.0
        self._frozen = False  # gc_freeze.freeze() froze the objects alive at the start
        self._start_step = 0
        self._start_records = 0
        self._idle_stop: str | None = None
        self._lit: Any = None
        self.guard: NonFiniteGuard | None = None
        self._unapplied_cursor: Any = None
        self._unapplied_records = 0
        self._fill_hook: Any = None
        self._filling = False  # this step trains a zero-weight filler (DDP, a dry rank)
        self._loss_weight: float | None = None  # DDP: this step's loss factor (_weigh_loss)

    def _step(self) -> int:
        return int(self.cb.cur_step_num)

    def _source(self) -> StreamSource | None:
        """The stream source whose idle hook and ``end_reason`` the loop uses, or None (a plain
        iterable, or a DataLoader whose workers hold the source)."""
        source = self.stream.source
        return source if isinstance(source, StreamSource) else None

    # ---------------------------------------------------------------- idle hook
    def _idle(self) -> bool:
        """Called by the source while it waits for data: stop checks, time-based cadences."""
        reason = self.stop.local_reason()
        if reason is not None:
            self._idle_stop = reason
            return True
        now = time.monotonic()
        step = self._step()
        pub = self.publisher
        if pub is not None:
            pub.poll()
        if pub is not None and step != pub.last_step and pub.time_due(now):
            pub.publish(step, self.cursor)
        ck = self.checkpoints
        # under DDP a checkpoint gathers cursors: only at step ends
        if self.ranks.world == 1 and ck is not None:
            if ck.poll():
                ck.raise_failure()
            if step != ck.last_step and ck.time_due(now):
                ck.save(self._lit, step, self.cursor)
        return False

    # ---------------------------------------------------------------- Lightning hooks
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        device = trainer.strategy.root_device
        if device.type != "cuda":
            device = torch.device("cpu")  # gloo reduces CPU tensors
        self.ranks.world, self.ranks.rank, self.ranks.device = (
            trainer.world_size, trainer.global_rank, device
        )
        self._lit = pl_module
        self.guard = NonFiniteGuard(list(trainer.optimizers))
        # the stream reports a huge len() only to turn off Lightning's prefetch (already set up
        # by now); progress bars should show an open-ended epoch
        trainer.fit_loop.max_batches = float("inf")
        self._common(trainer)
        self.cb.mode = "train"
        self.cb.cur_step_num = 0
        self.cb.cur_epoch_num = 0
        if self.checkpoints is not None:
            restored = self.checkpoints.restore(pl_module)
            if restored is not None:
                self.cursor = restored
        self._start_step = self._step()
        self._start_records = self.summary.total_records
        self._bind_stream()
        self._frozen = gc_freeze.freeze()  # no full collector pass over Lightning's objects
        self._t0 = time.monotonic()
        self.stop.start(self._t0)
        if self.checkpoints is not None:  # nothing new to save yet
            self.checkpoints.start(self._start_step, self._t0, trainer.optimizers, pl_module)
        if self.publisher is not None:
            self.publisher.start(self._start_step, self._t0, trainer.optimizers)
        self.begin_train()
        if self.stop.max_steps_reached(self._step()):
            self.summary.stop_reason = self._idle_stop = "max_steps"
            trainer.should_stop = True

    def _bind_stream(self) -> None:
        self.stream.stop_local = lambda: (
            self._idle_stop is not None or (self.stop.local_reason() is not None)
        )
        if self.ranks.world > 1:
            self.stream.agree = self.ranks.agree
            self.stream.gather = self.ranks.gather
            self._bind_loss_weight()
            self.stream.can_fill = True
        source = self._source()
        if source is not None:
            source.bind_idle(self._idle)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.sink:
            self.begin_epoch(int(self.cb.cur_epoch_num) + 1)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.sink:
            self.begin_epoch(int(self.cb.cur_epoch_num) + 1)
        self._filling = self.stream.filling
        world, real = self.ranks.world, self.stream.real_ranks
        if self._filling:
            self._loss_weight = 0.0
        elif 0 < real < world:
            self._loss_weight = world / real
        else:
            self._loss_weight = None
        self.begin_step(_empty_like(batch) if self._filling else batch)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._loss_weight = None
        self.end_step(outputs)
        # with gradient accumulation a batch counts as trained (cursor, records) only once the
        # update holding its gradients is applied: a crash before loses no record
        self._unapplied_cursor = self.stream.commit()
        self._unapplied_records += 0 if self._filling else batch_size_of(batch)
        self._filling = False
        if getattr(pl_module, "open_window", 0) == 0:  # the accumulation window is complete
            self.cursor = self._unapplied_cursor
            self.summary.total_records += self._unapplied_records
            self._unapplied_records = 0
        step = self._step()
        if validation_due(self.validation, step):
            validate(self, self.validation, self.stream, self.ranks, trainer, pl_module)
        if self.sink:
            self.end_epoch()
        reason = self.stop.step_reason(step, stop_requested=self.run_context.get_stop_requested())
        now = time.monotonic()
        ck, pub = self.checkpoints, self.publisher
        ckpt_time = ck is not None and ck.time_due(now)
        ckpt_failed = ck is not None and ck.poll()  # a background write failed (rank 0)
        # a background delta written: LATEST and the hook name it; a failed publish (held)
        pub_failed = pub is not None and pub.poll()
        stop_flag, ckpt_flag, failed, pfailed = self.ranks.reduce_max(
            [reason is not None, ckpt_time, ckpt_failed, pub_failed])
        if failed:
            ck.raise_failure()
        if pfailed:
            pub.raise_failure()
        if ck is not None and (ckpt_flag or ck.step_due(step)):
            ck.save(pl_module, step, self.cursor)
        if pub is not None and (pub.step_due(step) or pub.time_due(now)):
            pub.publish(step, self.cursor)
        if stop_flag:
            self.summary.stop_reason = reason or "peer_stopped"
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.sink:
            self.end_epoch()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        s = self.summary
        if s.stop_reason is None:
            s.stop_reason = self._final_stop_reason()
        applied = self._apply_open_window(pl_module, s.stop_reason in _CLEAN_ENDS)
        self.end_train()
        step = self._step()
        if self.checkpoints is not None:
            self.checkpoints.finish(pl_module, step, self.cursor, force=applied)
        if self.publisher is not None and (applied or step != self.publisher.last_step):
            self.publisher.publish(step, self.cursor)
        self._finish()
        if self.publisher is not None:
            self.publisher.settle()  # under DDP a failed last publish stops every rank
        self._warn_about_leftovers()
        log.info(
            "online_train stopped (%s) at step %d: %d steps, %d records in %.1f s.",
            s.stop_reason,
            step,
            s.steps,
            s.records,
            s.elapsed_s,
        )

    def _apply_open_window(self, pl_module: Any, clean: bool) -> bool:
        """At a clean end of the stream, apply an open gradient-accumulation window.

        The ranks decide together (their windows are the same size: they step together);
        ``LitModel.apply_open_window`` averages the gradients over the ranks, rescales them to
        the mean over the window's batches and steps; the batches then count as trained.

        Returns:
            Whether a window was applied (the weights changed after the last step).
        """
        m = int(getattr(pl_module, "open_window", 0) or 0)
        unclean, m_max = self.ranks.reduce_max([int(not clean), m])
        if m_max == 0 or unclean or not hasattr(pl_module, "apply_open_window"):
            return False
        if not pl_module.apply_open_window():
            return False
        log.info("online_train: the stream ended inside a gradient-accumulation window; its "
                 "%d batch(es) were applied.", m)
        self.cursor = self._unapplied_cursor
        self.summary.total_records += self._unapplied_records
        self._unapplied_records = 0
        return True

    def _warn_about_leftovers(self) -> None:
        """Say so when a run ends with records it did not train, or trained nothing."""
        s = self.summary
        if self.stream.agreed_stop:
            log.warning(
                "online_train: rank %d stopped with batches it did not train because another "
                "rank stopped (every rank must step together); they stay unconsumed in the "
                "checkpoint's cursor and a restart trains them.",
                self.ranks.rank,
            )
        if s.steps == 0 and s.resumed_from is not None:
            log.warning(
                "online_train: resumed from %s (step %d, %d records) and trained 0 steps (%s): "
                "the stream had nothing new for this rank.",
                s.resumed_from,
                s.total_steps,
                s.total_records,
                s.stop_reason,
            )

    def _final_stop_reason(self) -> str:
        if self._idle_stop is not None:
            return self._idle_stop
        if self.stream.agreed_stop:
            return "peer_stopped"
        if self.stream.exhausted:
            # what the source says about its end (a reset is not a clean end, an idle stop is
            # "idle_timeout"); a plain iterable's end is "source_exhausted"
            source = self._source()
            why = None if source is None else source.end_reason
            return "source_exhausted" if why in (None, "stopped") else why
        return self.stop.local_reason() or "peer_stopped"

    def _bind_loss_weight(self) -> None:
        """Weigh each DDP step's loss (see :meth:`_weigh_loss`) where the loss is computed.

        A loss module gets a forward hook; a plain loss function is wrapped for the run;
        without ``loss_fn`` the network returns the loss and gets the forward hook.
        """
        lit = self._lit
        loss_fn = getattr(lit, "loss_fn", None)
        if isinstance(loss_fn, torch.nn.Module) or loss_fn is None:
            module = loss_fn if loss_fn is not None else lit.network
            self._fill_hook = module.register_forward_hook(self._weigh_loss)
            return
        original = loss_fn

        def weighted(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            weighed = self._weigh_loss(None, args, out)
            return out if weighed is None else weighed

        lit.loss_fn = weighted
        self._fill_hook = _Restore(lit, "loss_fn", original)

    def _weigh_loss(self, module: Any, inputs: Any, output: Any) -> Any:
        """Under DDP, a filler step's loss times 0 and a real one's times ``world / k``.

        ``k`` is the number of ranks stepping on a real batch; DDP averages the gradients
        over all ``world`` ranks, so the update is the mean over the ``k`` real batches (not
        diluted by the fillers' zero gradients).
        """
        weight = self._loss_weight
        if weight is None or not torch.is_tensor(output):
            return None
        return output * weight

    def _finish(self, *, failing: bool = False) -> None:
        gc_freeze.unfreeze(self._frozen)
        self._frozen = False
        self.stop.finish()
        if self._fill_hook is not None:
            self._fill_hook.remove()
            self._fill_hook = None
        if self.guard is not None:
            self.summary.skipped_steps = self.guard.skipped
            self.guard.remove()
            self.guard = None
        source = self._source()
        if source is not None:
            source.bind_idle(None)
        self.stream.close()
        s = self.summary
        s.total_steps = self._step()
        s.steps = s.total_steps - self._start_step
        s.records = s.total_records - self._start_records
        s.elapsed_s = time.monotonic() - self._t0 if self._t0 else 0.0
        if self.publisher is not None:  # waits for a full snapshot being written
            self.publisher.finish(quiet=failing)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        try:
            self.leave_on_exception()
        finally:
            if self.checkpoints is not None:
                self.checkpoints.close(quiet=True)  # the write in flight completes
            self._finish(failing=True)
