"""The bridge from Lightning's hooks to MindSpore callbacks, in MindSpore's order (spec §1.4).

One :class:`MindSporeCallbackBridge` (a Lightning ``Callback``) per ``Model.train`` / ``fit`` /
``eval`` call. It owns the run's ``cb_params`` and ``RunContext`` and translates:

=================================  =========================================================
Lightning                          MindSpore
=================================  =========================================================
on_train_start                     enter callbacks, ``on_train_begin``
on_train_epoch_start               ``cur_epoch_num`` (1-based, absolute), ``on_train_epoch_begin``
on_train_batch_start               ``cur_step_num`` += 1 (sink: sink_size), ``on_train_step_begin``
on_train_batch_end                 ``net_outputs``, ``on_train_step_end``, stop -> should_stop
on_validation_* (during fit)       ``on_eval_*`` on custom callbacks and TimeMonitor only
on_train_epoch_end                 ``metrics``/``eval_results`` set, ``on_train_epoch_end``, popped
on_train_end                       ``on_train_end``, leave callbacks
on_validation_* (Model.eval)       ``on_eval_*`` on all callbacks
on_exception                       ModelCheckpoint ``exception_save``; leave callbacks
=================================  =========================================================

In sink mode one Lightning batch is one sink, so step hooks fire once per sink with the last
step's outputs, and a stop request takes effect at the sink's end.
"""

from __future__ import annotations

import copy
import logging
import sys
from typing import Any

import lightning as L

from lit_amp.callbacks._callback import CallbackList, InternalCallbackParam, RunContext

__all__ = ["MindSporeCallbackBridge", "outputs_to_net_outputs", "should_eval"]

log = logging.getLogger(__name__)

_NEVER = 10**9  # a check_val_every_n_epoch that no epoch reaches


def outputs_to_net_outputs(outputs: Any) -> Any:
    """Lightning's training-step output dict -> MindSpore ``net_outputs``.

    A plain loss becomes the loss tensor; under loss scaling ``(loss, overflow, loss_scale)``.
    """
    if isinstance(outputs, dict):
        if "overflow" in outputs:
            return (outputs["loss"], outputs["overflow"], outputs["loss_scale"])
        return outputs.get("loss")
    return outputs


def should_eval(epoch: int, valid_frequency: int | list[int]) -> bool:
    """MindSpore's ``_should_eval``: ``epoch % f == 0`` for an int, ``epoch in f`` for a list."""
    if isinstance(valid_frequency, int):
        return valid_frequency > 0 and epoch % valid_frequency == 0
    return epoch in valid_frequency


class MindSporeCallbackBridge(L.Callback):
    """Calls MindSpore callbacks from Lightning's hooks (see the module docstring).

    Args:
        callbacks: the MindSpore callbacks of the run.
        cb_params: the run's callback parameters (filled further as the run goes).
        sink_size: steps per Lightning batch (1 outside sink mode).
        initial_epoch: epochs already done (``cur_epoch_num`` continues from it).
        valid_frequency: for ``fit``: evaluate after epochs where :func:`should_eval` holds.
        eval_during_fit: whether a validation dataset is attached (``fit`` only).
    """

    def __init__(
        self,
        callbacks: CallbackList,
        cb_params: InternalCallbackParam,
        *,
        sink_size: int = 1,
        initial_epoch: int = 0,
        valid_frequency: int | list[int] = 1,
        eval_during_fit: bool = False,
    ) -> None:
        self.callbacks = callbacks
        self.eval_callbacks = callbacks.subset_for_eval_during_fit()
        self.cb = cb_params
        self.run_context = RunContext(cb_params)
        self.sink_size = sink_size
        self.initial_epoch = initial_epoch
        self.valid_frequency = valid_frequency
        self.eval_during_fit = eval_during_fit
        self._saved: dict[str, Any] = {}
        self._in_fit_eval = False

    @property
    def state_key(self) -> str:
        return f"MindSporeCallbackBridge{id(self)}"

    # ---------------------------------------------------------------- helpers
    def _call(self, hook: str, cbs: CallbackList | None = None) -> None:
        (cbs or self.callbacks).call(hook, self.run_context)

    def _sync_stop(self, trainer: L.Trainer) -> None:
        if self.run_context.get_stop_requested():
            trainer.should_stop = True

    def _common(self, trainer: L.Trainer) -> None:
        self.cb.device_number = trainer.world_size
        self.cb.rank = trainer.global_rank

    # ---------------------------------------------------------------- train
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._common(trainer)
        self.cb.mode = "train"
        self.cb.cur_step_num = 0
        self.cb.cur_epoch_num = self.initial_epoch
        self.callbacks.enter()
        self._call("on_train_begin")
        self._sync_stop(trainer)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = self.initial_epoch + trainer.current_epoch + 1
        self.cb.cur_epoch_num = epoch
        if self.eval_during_fit:
            # MindSpore's valid_frequency (an int or a list of absolute epochs) decides per epoch
            trainer.check_val_every_n_epoch = (
                1 if should_eval(epoch, self.valid_frequency) else _NEVER
            )
        self._call("on_train_epoch_begin")

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.cb.cur_step_num += self.sink_size
        self.cb.train_dataset_element = batch[-1] if self.sink_size > 1 else batch
        self._call("on_train_step_begin")

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.cb.net_outputs = outputs_to_net_outputs(outputs)
        self._call("on_train_step_end")
        self._sync_stop(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._call("on_train_epoch_end")
        self.cb.pop("metrics", None)
        self.cb.pop("eval_results", None)
        self._sync_stop(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        try:
            self._call("on_train_end")
        finally:
            self.callbacks.exit()

    # ---------------------------------------------------------------- eval
    def _eval_cbs(self) -> CallbackList:
        return self.eval_callbacks if self._in_fit_eval else self.callbacks

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._common(trainer)
        self._in_fit_eval = trainer.state.fn == "fit"
        if self._in_fit_eval:
            self._saved = {
                k: self.cb.get(k)
                for k in ("mode", "cur_step_num", "batch_num", "dataset_sink_mode", "net_outputs")
            }
            self.cb.dataset_sink_mode = False
        else:
            self.callbacks.enter()
        nb = trainer.num_val_batches
        self.cb.batch_num = int(sum(nb)) if isinstance(nb, list) else int(nb)
        self.cb.mode = "eval"
        self.cb.cur_step_num = 0
        self.cb.pop("metrics", None)
        self._call("on_eval_begin", self._eval_cbs())

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._call("on_eval_epoch_begin", self._eval_cbs())

    def on_validation_batch_start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.cb.cur_step_num += 1
        self.cb.eval_dataset_element = batch
        self._call("on_eval_step_begin", self._eval_cbs())

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.cb.net_outputs = outputs
        self._call("on_eval_step_end", self._eval_cbs())

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the LightningModule's own on_validation_epoch_end (which computes the metrics) runs
        # after the callbacks' — compute here from its results when they are ready
        pass

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        res = getattr(pl_module, "last_eval_results", {}) or {}
        metrics = dict(res.get("metrics", {}))
        self.cb.metrics = metrics
        self._call("on_eval_epoch_end", self._eval_cbs())
        self._call("on_eval_end", self._eval_cbs())
        if self._in_fit_eval:
            eval_results = copy.deepcopy(metrics)
            if res.get("eval_loss") is not None:
                eval_results["eval_loss"] = res["eval_loss"]
            for k, v in self._saved.items():
                self.cb[k] = v
            self.cb.metrics = metrics
            self.cb.eval_results = eval_results
            self.cb.mode = "train"
            self._in_fit_eval = False
        else:
            self.callbacks.exit()

    # ---------------------------------------------------------------- failures
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        for cb in self.callbacks:
            config = getattr(cb, "config", None) if type(cb).__name__ == "ModelCheckpoint" else None
            if config is not None and getattr(config, "exception_save", False):
                try:
                    cb.save_breakpoint(self.cb)
                except Exception:  # the original exception matters more
                    log.exception("ModelCheckpoint could not save the breakpoint checkpoint")
        self.callbacks.exit(sys.exc_info() if sys.exc_info()[0] else (None, None, None))
