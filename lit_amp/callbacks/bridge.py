"""The bridge from Lightning's hooks to MindSpore callbacks, in MindSpore's order.

One :class:`MindSporeCallbackBridge` (a Lightning ``Callback``) per ``Model.train`` / ``fit`` /
``eval`` call owns the run's ``cb_params`` and ``RunContext`` and calls the MindSpore hooks
from Lightning's (the mapping: docs/migration.md, "Which Lightning hook runs which MindSpore
hook"). The MindSpore side of each hook is a public method (``begin_train``, ``begin_epoch``,
``begin_step``, ``end_step``, ``end_epoch``, ``end_train``, the eval pieces,
``leave_on_exception``), so that a loop with other epoch accounting — ``RecModel.online_train``'s,
where in sink mode every batch is one epoch — subclasses the bridge and overrides only the
Lightning hooks whose mapping differs.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Mapping
from typing import Any

import lightning as L

from lit_amp.callbacks.base import CallbackList, InternalCallbackParam, RunContext

__all__ = ["MindSporeCallbackBridge", "outputs_to_net_outputs", "should_eval"]

log = logging.getLogger(__name__)

_NEVER = 10**9  # a check_val_every_n_epoch that no epoch reaches

#: the ``cb_params`` keys an evaluation during training changes and puts back afterwards
_TRAIN_KEYS = ("mode", "cur_step_num", "batch_num", "dataset_sink_mode", "net_outputs")


def outputs_to_net_outputs(outputs: Any) -> Any:
    """Lightning's training-step output dict -> MindSpore ``net_outputs``.

    A plain loss becomes the loss tensor; under loss scaling ``(loss, overflow, loss_scale)``.

    Example:
        >>> outputs_to_net_outputs({"loss": 1.5})
        1.5
        >>> outputs_to_net_outputs({"loss": 1.5, "overflow": False, "loss_scale": 1024.0})
        (1.5, False, 1024.0)
    """
    if isinstance(outputs, dict):
        if "overflow" in outputs:
            return (outputs["loss"], outputs["overflow"], outputs["loss_scale"])
        return outputs.get("loss")
    return outputs


def should_eval(epoch: int, valid_frequency: int | list[int]) -> bool:
    """MindSpore's ``_should_eval``: ``epoch % f == 0`` for an int, ``epoch in f`` for a list.

    Example:
        >>> should_eval(4, 2), should_eval(3, [1, 3]), should_eval(3, 0)
        (True, True, False)
    """
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

    Example:
        >>> from lit_amp.callbacks import Callback
        >>> class Steps(Callback):
        ...     def on_train_step_end(self, run_context):
        ...         print("step", run_context.original_args().cur_step_num)
        >>> params = InternalCallbackParam(cur_step_num=0, cur_epoch_num=0)
        >>> bridge = MindSporeCallbackBridge(CallbackList([Steps()]), params)
        >>> bridge.begin_train()
        >>> bridge.begin_step(batch=None)
        >>> bridge.end_step({"loss": 0.5})
        step 1
        >>> bridge.end_train()
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
        self._resumed_batches = 0  # batches of the first epoch trained before (a resume)
        self._val_check_batch: Any = None  # Lightning's, while the resumed epoch changes it
        #: MindSpore's evaluation during fit has its own RunContext: a stop requested there
        #: ends that evaluation only, training goes on
        self.eval_run_context = RunContext(cb_params)

    @property
    def state_key(self) -> str:
        return f"{type(self).__name__}{id(self)}"

    # ---------------------------------------------------------------- the MindSpore side
    def call(self, hook: str, cbs: CallbackList | None = None) -> None:
        """Call MindSpore hook ``hook`` on ``cbs`` (default: all the run's callbacks)."""
        # an empty list (no eval callback during fit) is falsy but still the list to call
        run_context = self.eval_run_context if self._in_fit_eval else self.run_context
        (self.callbacks if cbs is None else cbs).call(hook, run_context)

    def begin_train(self) -> None:
        """Enter the callbacks (``__enter__``) and call ``on_train_begin``."""
        self.cb.mode = "train"
        self.callbacks.enter()
        self.call("on_train_begin")

    def begin_epoch(self, epoch: int) -> None:
        """Set ``cur_epoch_num`` to ``epoch`` and call ``on_train_epoch_begin``."""
        self.cb.cur_epoch_num = epoch
        self.call("on_train_epoch_begin")

    def begin_step(self, batch: Any, steps: int = 1) -> None:
        """Advance ``cur_step_num`` by ``steps``, set the batch and call ``on_train_step_begin``.

        Args:
            batch: the batch (``train_dataset_element``; a sink's last step batch).
            steps: the steps the batch stands for (``sink_size`` in ``Model.train``'s sink).
        """
        self.cb.cur_step_num += steps
        self.cb.train_dataset_element = batch
        self.call("on_train_step_begin")

    def end_step(self, outputs: Any) -> None:
        """Set ``net_outputs`` from Lightning's step outputs and call ``on_train_step_end``."""
        self.cb.net_outputs = outputs_to_net_outputs(outputs)
        self.call("on_train_step_end")

    def end_epoch(self) -> None:
        """Call ``on_train_epoch_end``; the epoch's ``metrics`` / ``eval_results`` go after it."""
        self.call("on_train_epoch_end")
        self.cb.pop("metrics", None)
        self.cb.pop("eval_results", None)

    def end_train(self) -> None:
        """Call ``on_train_end`` and leave the callbacks (``__exit__``), even if it raises."""
        try:
            self.call("on_train_end")
        finally:
            self.callbacks.exit()

    def begin_fit_eval(self, batch_num: int | None) -> None:
        """Start an evaluation during training: save the train keys, call ``on_eval_begin``.

        Only the eval callbacks of training (custom callbacks and ``TimeMonitor``) are called
        until :meth:`end_fit_eval`.

        Args:
            batch_num: the evaluation's batches (``cb_params.batch_num``), None if unknown.
        """
        self._in_fit_eval = True
        self.eval_run_context = RunContext(self.cb)
        self._saved = {k: self.cb.get(k) for k in _TRAIN_KEYS}
        self.cb.dataset_sink_mode = False
        self._begin_eval(batch_num)

    def begin_eval_epoch(self) -> None:
        """Call ``on_eval_epoch_begin`` (an evaluation is one epoch)."""
        self.call("on_eval_epoch_begin", self._eval_cbs())

    def eval_step_begin(self, batch: Any) -> None:
        """Advance the eval ``cur_step_num``, set the batch, call ``on_eval_step_begin``."""
        self.cb.cur_step_num += 1
        self.cb.eval_dataset_element = batch
        self.call("on_eval_step_begin", self._eval_cbs())

    def eval_step_end(self, outputs: Any) -> None:
        """Set the eval ``net_outputs`` and call ``on_eval_step_end``."""
        self.cb.net_outputs = outputs
        self.call("on_eval_step_end", self._eval_cbs())

    def end_eval(self, results: Mapping[str, Any]) -> None:
        """Call ``on_eval_epoch_end``, set ``metrics`` (in fit also ``eval_results``), then
        call ``on_eval_end`` -- MindSpore's order: the metrics are computed after the epoch end.

        Args:
            results: the evaluated module's ``last_eval_results`` (``"metrics"``,
                ``"eval_loss"``).
        """
        self.call("on_eval_epoch_end", self._eval_cbs())
        self.cb.metrics = dict(results.get("metrics", {}))
        if self._in_fit_eval:
            self._set_eval_results(results)
        self.call("on_eval_end", self._eval_cbs())

    def _set_eval_results(self, results: Mapping[str, Any]) -> None:
        metrics = dict(results.get("metrics", {}))
        eval_results = copy.deepcopy(metrics)
        if results.get("eval_loss") is not None:
            eval_results["eval_loss"] = results["eval_loss"]
        self.cb.metrics = metrics
        self.cb.eval_results = eval_results

    def end_fit_eval(self, results: Mapping[str, Any] | None) -> None:
        """Put the train keys back; with ``results``, expose ``metrics`` / ``eval_results``.

        ``results`` is None when the evaluation failed (the keys are restored either way).
        """
        for k, v in self._saved.items():
            self.cb[k] = v
        self.cb.mode = "train"
        self._in_fit_eval = False
        if results is not None:
            self._set_eval_results(results)

    def leave_on_exception(self) -> None:
        """Save ``ModelCheckpoint(exception_save=True)`` breakpoints; leave the callbacks."""
        for cb in self.callbacks:
            config = getattr(cb, "config", None) if type(cb).__name__ == "ModelCheckpoint" else None
            if config is not None and getattr(config, "exception_save", False):
                try:
                    cb.save_breakpoint(self.cb)
                except Exception:  # the original exception matters more
                    log.exception("ModelCheckpoint could not save the breakpoint checkpoint")
        self.callbacks.exit(sys.exc_info() if sys.exc_info()[0] else (None, None, None))

    # ---------------------------------------------------------------- helpers
    def _begin_eval(self, batch_num: int | None) -> None:
        self.cb.batch_num = batch_num
        self.cb.mode = "eval"
        self.cb.cur_step_num = 0
        self.cb.pop("metrics", None)
        self.call("on_eval_begin", self._eval_cbs())

    def _eval_cbs(self) -> CallbackList:
        return self.eval_callbacks if self._in_fit_eval else self.callbacks

    def _sync_stop(self, trainer: L.Trainer) -> None:
        if self.run_context.get_stop_requested():
            trainer.should_stop = True

    def _common(self, trainer: L.Trainer) -> None:
        self.cb.device_number = trainer.world_size
        self.cb.rank = trainer.global_rank

    # ---------------------------------------------------------------- Lightning: train
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._common(trainer)
        # a run resumed mid-epoch (BackupAndRestore) counts the batches of that epoch
        # already trained, so step-based names and cadences continue where it stopped
        self.cb.cur_step_num = self._resumed_batches = max(
            (int(getattr(c, "resume_step_num", 0) or 0) for c in self.callbacks), default=0
        )
        # MindSpore leaves cur_epoch_num unset until the first epoch begins, and a stop requested
        # in on_train_begin is seen only after the first step (one step runs)
        self.cb.pop("cur_epoch_num", None)
        self.begin_train()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = self.initial_epoch + trainer.current_epoch + 1
        if self.eval_during_fit:
            # MindSpore's valid_frequency (an int or a list of absolute epochs) decides per epoch
            trainer.check_val_every_n_epoch = (
                1 if should_eval(epoch, self.valid_frequency) else _NEVER
            )
            self._validate_at_the_resumed_epochs_end(trainer)
        self.begin_epoch(epoch)

    def _validate_at_the_resumed_epochs_end(self, trainer: L.Trainer) -> None:
        """An epoch resumed mid-way trains only its remaining batches: Lightning validates
        after the last of them (it counts ``val_check_batch`` batches from the epoch's start),
        and after the whole of the next epochs."""
        if self._val_check_batch is not None:
            trainer.val_check_batch, self._val_check_batch = self._val_check_batch, None
        if (trainer.current_epoch == 0 and self._resumed_batches
                and not self.cb.get("dataset_sink_mode")
                and isinstance(trainer.val_check_batch, int)
                and trainer.val_check_batch == trainer.num_training_batches):
            self._val_check_batch = trainer.val_check_batch
            trainer.val_check_batch = max(1, trainer.val_check_batch - self._resumed_batches)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.begin_step(batch[-1] if self.sink_size > 1 else batch, self.sink_size)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.end_step(outputs)
        if (self.eval_during_fit and self.run_context.get_stop_requested()
                and not self.cb.get("dataset_sink_mode")
                and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch):
            # a stop mid-epoch (a preemption) is not the epoch's end: its weights are not that
            # epoch's result, so it is not evaluated (Lightning would validate at any stop);
            # a run resumed from the position evaluates the epoch at its real end
            trainer.check_val_every_n_epoch = _NEVER
        self._sync_stop(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.end_epoch()
        self._sync_stop(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.end_train()

    # ---------------------------------------------------------------- Lightning: eval
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._common(trainer)
        nb = trainer.num_val_batches
        batch_num = int(sum(nb)) if isinstance(nb, list) else int(nb)
        if trainer.state.fn == "fit":
            self.begin_fit_eval(batch_num)
        else:
            self.callbacks.enter()
            self._begin_eval(batch_num)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.begin_eval_epoch()

    def on_validation_batch_start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.eval_step_begin(batch)

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.eval_step_end(outputs)
        ctx = self.eval_run_context if self._in_fit_eval else self.run_context
        if ctx.get_stop_requested():
            # MindSpore's _eval_process breaks out of its batch loop; Lightning's evaluation
            # loop ends on a StopIteration raised from the step (its dataloader_iter protocol)
            raise StopIteration

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the LightningModule's own on_validation_epoch_end (which computes the metrics) runs
        # after the callbacks' on_validation_epoch_end: read its results here, when ready
        res = getattr(pl_module, "last_eval_results", {}) or {}
        self.end_eval(res)
        if self._in_fit_eval:
            self.end_fit_eval(res)
        else:
            self.callbacks.exit()

    # ---------------------------------------------------------------- Lightning: failures
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self.leave_on_exception()
