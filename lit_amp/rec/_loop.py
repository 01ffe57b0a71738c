"""The online-training loop: a Lightning callback that runs MindSpore's ``online_train`` rules.

Private. Lightning's fit loop drives one long epoch over :class:`OnlineStream`;
:class:`OnlineLoop` turns its hooks into MindSpore's callback calls and adds what MindSpore
lacks: stop conditions, validation on a held-out window, checkpoints with the stream cursor,
and a separate publish cadence.

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

import copy
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from lit_amp.callbacks._callback import CallbackList, InternalCallbackParam, RunContext
from lit_amp.callbacks.bridge import outputs_to_net_outputs
from lit_amp.checkpoint_io import save_checkpoint
from lit_amp.rec._stream import OnlineStream, batch_size_of
from lit_amp.rec.publish import (
    latest_checkpoint,
    plain_state,
    prune_checkpoints,
    publish_weights,
)

__all__ = ["OnlineOptions", "OnlineSummary", "OnlineLoop"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class OnlineOptions:
    """The validated online-training options (see ``RecModel.online_train``)."""

    max_steps: int | None = None
    max_time: float | None = None
    stop_event: Any = None
    stop_file: str | None = None
    stop_signals: tuple[int, ...] = ()
    valid_dataset: Any = None
    valid_every_n_steps: int | None = None
    valid_window: int = 1
    ckpt_dir: str | None = None
    ckpt_every_n_steps: int | None = None
    ckpt_every_n_seconds: float | None = None
    keep_checkpoint_max: int = 5
    resume: bool = True
    publish_dir: str | None = None
    publish_every_n_steps: int | None = None
    publish_every_n_seconds: float | None = None
    keep_published_max: int = 3
    publish_hook: Callable[[dict], None] | None = None


@dataclasses.dataclass
class OnlineSummary:
    """What an ``online_train`` call did (MindSpore's returns None; lit_amp returns this).

    Attributes:
        steps: steps trained by this call.
        records: records trained by this call.
        total_steps: ``cur_step_num`` at the end (counting restored steps).
        total_records: records trained, counting those of restored checkpoints.
        stop_reason: ``"max_steps"``, ``"max_time"``, ``"stop_event"``, ``"stop_file"``,
            ``"signal:SIGTERM"`` (or another signal), ``"request_stop"``, ``"source_exhausted"``
            or ``"peer_stopped"`` (another DDP rank ran out of data or stopped).
        resumed_from: the checkpoint restored, or None.
        last_checkpoint: the newest checkpoint written by this call, or None.
        last_published: the newest published weights written by this call, or None.
        elapsed_s: wall time of the training loop.

    Example:
        >>> OnlineSummary(steps=3, records=30, stop_reason="max_steps").records
        30
    """

    steps: int = 0
    records: int = 0
    total_steps: int = 0
    total_records: int = 0
    stop_reason: str | None = None
    resumed_from: str | None = None
    last_checkpoint: str | None = None
    last_published: str | None = None
    elapsed_s: float = 0.0


class _OnlineState:
    """What a checkpoint holds: the LitModel state plus the ``"online"`` section."""

    def __init__(self, lit: Any, online: dict) -> None:
        self._lit = lit
        self._online = online

    def checkpoint_state(self) -> dict:
        return {**self._lit.checkpoint_state(), "online": self._online}


class OnlineLoop(L.Callback):
    """Runs ``online_train``'s rules from Lightning's hooks (see the module docstring).

    Args:
        callbacks: the MindSpore callbacks.
        cb_params: the run's callback parameters.
        stream: what Lightning iterates.
        opts: the online options.
        sink: dataset sink mode (each batch is one epoch for callbacks).
        network: the backbone (published weights are its ``state_dict``).
    """

    def __init__(
        self,
        callbacks: CallbackList,
        cb_params: InternalCallbackParam,
        stream: OnlineStream,
        opts: OnlineOptions,
        *,
        sink: bool,
        network: torch.nn.Module,
    ) -> None:
        self.callbacks = callbacks
        self.eval_callbacks = callbacks.subset_for_eval_during_fit()
        self.cb = cb_params
        self.run_context = RunContext(cb_params)
        self.stream = stream
        self.opts = opts
        self.sink = sink
        self.network = network
        self.summary = OnlineSummary()
        self._world = 1
        self._rank = 0
        self._device = torch.device("cpu")
        self._t0 = 0.0
        self._deadline: float | None = None
        self._signal: int | None = None
        self._prev_handlers: dict[int, Any] = {}
        self._cursor: Any = None  # cursor of the last trained batch (this rank)
        self._saved_cursor: Any = None  # this rank's cursor in the newest checkpoint
        self._last_ckpt_step = -1
        self._last_ckpt_time = 0.0
        self._last_pub_step = -1
        self._last_pub_time = 0.0
        self._idle_stop: str | None = None
        self._lit: Any = None

    @property
    def state_key(self) -> str:
        return f"OnlineLoop{id(self)}"

    # ---------------------------------------------------------------- helpers
    def _call(self, hook: str, cbs: CallbackList | None = None) -> None:
        (cbs or self.callbacks).call(hook, self.run_context)

    def _step(self) -> int:
        return int(self.cb.cur_step_num)

    def _local_stop_reason(self) -> str | None:
        """Stop conditions that any moment can check (not the per-step ones)."""
        if self._signal is not None:
            try:
                return f"signal:{signal.Signals(self._signal).name}"
            except ValueError:
                return f"signal:{self._signal}"
        if self._deadline is not None and time.monotonic() >= self._deadline:
            return "max_time"
        ev = self.opts.stop_event
        if ev is not None and ev.is_set():
            return "stop_event"
        if self.opts.stop_file is not None and os.path.exists(self.opts.stop_file):
            return "stop_file"
        return None

    def _step_stop_reason(self) -> str | None:
        if self.run_context.get_stop_requested():
            return "request_stop"
        if self.opts.max_steps is not None and self._step() >= self.opts.max_steps:
            return "max_steps"
        return self._local_stop_reason()

    def _reduce_max(self, values: list[int]) -> list[int]:
        if self._world == 1:
            return values
        t = torch.tensor(values, dtype=torch.int32, device=self._device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return [int(v) for v in t.tolist()]

    def _agree(self, has_batch: bool) -> bool:
        """All ranks have a batch (one all-reduce MIN per step under DDP)."""
        t = torch.tensor([1 if has_batch else 0], dtype=torch.int32, device=self._device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        return bool(t.item())

    # ---------------------------------------------------------------- signals
    def _on_signal(self, signum: int, frame: Any) -> None:
        log.info("online_train: received signal %s; stopping after the current step.", signum)
        self._signal = signum

    def _install_signals(self) -> None:
        if not self.opts.stop_signals:
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                "online_train runs outside the main thread: signal handlers for %s cannot be "
                "installed; use stop_event or stop_file to stop it.",
                list(self.opts.stop_signals),
            )
            return
        for sig in self.opts.stop_signals:
            self._prev_handlers[sig] = signal.signal(sig, self._on_signal)

    def _uninstall_signals(self) -> None:
        for sig, prev in self._prev_handlers.items():
            signal.signal(sig, signal.SIG_DFL if prev is None else prev)
        self._prev_handlers = {}

    # ---------------------------------------------------------------- idle hook
    def _idle(self) -> bool:
        """Called by the source while it waits for data: stop checks, time-based cadences."""
        reason = self._local_stop_reason()
        if reason is not None:
            self._idle_stop = reason
            return True
        now = time.monotonic()
        step = self._step()
        o = self.opts
        if (
            o.publish_every_n_seconds is not None
            and step != self._last_pub_step
            and now - self._last_pub_time >= o.publish_every_n_seconds
        ):
            self._publish()
        if (
            self._world == 1  # under DDP a checkpoint gathers cursors: only at step ends
            and o.ckpt_every_n_seconds is not None
            and step != self._last_ckpt_step
            and now - self._last_ckpt_time >= o.ckpt_every_n_seconds
        ):
            self._save_checkpoint()
        return False

    # ---------------------------------------------------------------- checkpoint / publish
    def _gather_cursors(self) -> list[Any]:
        if self._world == 1:
            return [self._cursor]
        out: list[Any] = [None] * self._world
        torch.distributed.all_gather_object(out, self._cursor)
        return out

    def _save_checkpoint(self) -> None:
        o = self.opts
        assert o.ckpt_dir is not None
        step = self._step()
        cursors = self._gather_cursors()
        # rank 0 finished writing the previous checkpoint before it joined this gather, so
        # what that checkpoint covers is durable on every rank now
        self._release(self._saved_cursor)
        self._saved_cursor = self._cursor
        self._last_ckpt_step = step
        self._last_ckpt_time = time.monotonic()
        if self._rank != 0:
            return
        online = {
            "step": step,
            "epoch": int(self.cb.cur_epoch_num),
            "records": self.summary.total_records,
            "cursors": plain_state(cursors),  # loadable with torch.load(weights_only=True)
            "world_size": self._world,
            "sink": self.sink,
            "time": time.time(),
        }
        path = os.path.join(o.ckpt_dir, f"online-{step:012d}.ckpt")
        save_checkpoint(_OnlineState(self._lit, online), path, {"step_num": step})
        prune_checkpoints(o.ckpt_dir, o.keep_checkpoint_max)
        self.summary.last_checkpoint = path
        self.cb.latest_ckpt_file = path
        self.cb.last_save_ckpt_step = step
        log.debug("online_train: checkpoint %s", path)

    def _release(self, cursor: Any) -> None:
        """Tell the source that a durable checkpoint holds ``cursor`` (it may clean up)."""
        source = self.stream.source
        fn = getattr(source, "checkpointed", None)
        if cursor is None or fn is None:
            return
        try:
            fn(cursor)
        except Exception:  # clean-up must never stop training
            log.warning("online_train: %s.checkpointed failed", type(source).__name__,
                        exc_info=True)

    def _publish(self) -> None:
        o = self.opts
        assert o.publish_dir is not None
        step = self._step()
        self._last_pub_step = step
        self._last_pub_time = time.monotonic()
        if self._rank != 0:
            return
        path = publish_weights(
            self.network,
            o.publish_dir,
            step,
            records=self.summary.total_records,
            keep=o.keep_published_max,
        )
        self.summary.last_published = path
        log.debug("online_train: published %s", path)
        if o.publish_hook is not None:
            o.publish_hook(
                {
                    "path": path,
                    "step": step,
                    "records": self.summary.total_records,
                    "published_at": time.time(),
                    "cursor": self._cursor,
                }
            )

    def _restore(self, lit: Any) -> None:
        o = self.opts
        if not (o.resume and o.ckpt_dir):
            return
        found = latest_checkpoint(o.ckpt_dir)
        if found is None:
            return
        path, state = found
        lit.load_checkpoint_state(state)
        online = state["online"]
        cursors = list(online.get("cursors") or [])
        source = self.stream.source
        if source is not None and any(c is not None for c in cursors):
            if len(cursors) == self._world:
                mine = cursors[self._rank]
            else:
                merge = getattr(type(source), "merge_state_dicts", None)
                if merge is None:
                    raise RuntimeError(
                        f"online_train: the checkpoint {path} was written by "
                        f"{len(cursors)} process(es) but this run has {self._world}, and "
                        f"{type(source).__name__} cannot merge cursors (no merge_state_dicts); "
                        "resume with the same number of processes."
                    )
                mine = merge([c for c in cursors if c is not None])
            if mine is not None:
                source.load_state_dict(mine)
                self._cursor = self._saved_cursor = mine
        self.cb.cur_step_num = int(online.get("step", 0))
        self.cb.cur_epoch_num = int(online.get("epoch", 0))
        self.summary.total_records = int(online.get("records", 0))
        self.summary.resumed_from = path
        log.info(
            "online_train: resumed from %s (step %d, %d records trained).",
            path,
            self._step(),
            self.summary.total_records,
        )

    # ---------------------------------------------------------------- validation
    def _validate(self, trainer: L.Trainer, lit: Any) -> None:
        o = self.opts
        if o.valid_dataset is None:
            batches: Any = self.stream.holdout(o.valid_window)
            # under DDP every rank evaluates if any has a batch (a rank whose shard ran dry
            # evaluates none): metrics and loss are reduced across ranks, so a rank that
            # skipped would leave the others waiting for it
            (anyone,) = self._reduce_max([1 if batches else 0])
            if not anyone:
                return
        else:
            batches = o.valid_dataset
        cb = self.cb
        saved = {
            k: cb.get(k)
            for k in ("mode", "cur_step_num", "batch_num", "dataset_sink_mode", "net_outputs")
        }
        cbs = self.eval_callbacks
        try:
            cb.mode = "eval"
            cb.cur_step_num = 0
            cb.dataset_sink_mode = False
            try:
                cb.batch_num = len(batches)
            except TypeError:
                cb.batch_num = None
            cb.pop("metrics", None)
            self._call("on_eval_begin", cbs)
            self._call("on_eval_epoch_begin", cbs)
            was_training = lit.training
            lit.eval()
            lit._reset_eval()
            try:
                with torch.no_grad():
                    for batch in batches:
                        batch = trainer.strategy.batch_to_device(batch)
                        cb.cur_step_num += 1
                        cb.eval_dataset_element = batch
                        self._call("on_eval_step_begin", cbs)
                        cb.net_outputs = lit.eval_step(batch)
                        self._call("on_eval_step_end", cbs)
                    lit._finish_eval()
            finally:
                lit.train(was_training)
            res = lit.last_eval_results
            metrics = dict(res.get("metrics", {}))
            cb.metrics = metrics
            self._call("on_eval_epoch_end", cbs)
            self._call("on_eval_end", cbs)
        finally:
            for k, v in saved.items():
                cb[k] = v
        eval_results = copy.deepcopy(metrics)
        if res.get("eval_loss") is not None:
            eval_results["eval_loss"] = res["eval_loss"]
        cb.metrics = metrics
        cb.eval_results = eval_results

    # ---------------------------------------------------------------- Lightning hooks
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._world = trainer.world_size
        self._rank = trainer.global_rank
        self._device = trainer.strategy.root_device
        if self._device.type != "cuda":
            self._device = torch.device("cpu")  # gloo reduces CPU tensors
        self._lit = pl_module
        # the stream reports a huge len() only to turn off Lightning's prefetch (already set up
        # by now); progress bars should show an open-ended epoch
        trainer.fit_loop.max_batches = float("inf")
        cb = self.cb
        cb.device_number = self._world
        cb.rank = self._rank
        cb.mode = "train"
        cb.cur_step_num = 0
        cb.cur_epoch_num = 0
        self._restore(pl_module)
        self._start_step = self._step()
        self._last_ckpt_step = self._last_pub_step = self._start_step  # nothing new yet
        self._start_records = self.summary.total_records
        self.stream.stop_local = lambda: (
            self._idle_stop is not None or (self._local_stop_reason() is not None)
        )
        if self._world > 1:
            self.stream.agree = self._agree
        source = self.stream.source
        if source is not None and hasattr(source, "bind_idle"):
            source.bind_idle(self._idle)
        elif hasattr(self.stream.dataset, "bind_idle"):
            self.stream.dataset.bind_idle(self._idle)
        self._install_signals()
        self._t0 = time.monotonic()
        if self.opts.max_time is not None:
            self._deadline = self._t0 + self.opts.max_time
        self._last_ckpt_time = self._last_pub_time = self._t0
        self.callbacks.enter()
        self._call("on_train_begin")
        if self.opts.max_steps is not None and self._step() >= self.opts.max_steps:
            self.summary.stop_reason = "max_steps"
            self._idle_stop = "max_steps"
            trainer.should_stop = True

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.sink:
            self.cb.cur_epoch_num += 1
            self._call("on_train_epoch_begin")

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        cb = self.cb
        if self.sink:
            cb.cur_epoch_num += 1
            self._call("on_train_epoch_begin")
        cb.cur_step_num += 1
        cb.train_dataset_element = batch
        self._call("on_train_step_begin")

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        cb = self.cb
        o = self.opts
        cb.net_outputs = outputs_to_net_outputs(outputs)
        self._call("on_train_step_end")
        self._cursor = self.stream.commit()
        n = batch_size_of(batch)
        self.summary.total_records += n
        step = self._step()
        if o.valid_every_n_steps is not None and step % o.valid_every_n_steps == 0:
            self._validate(trainer, pl_module)
        if self.sink:
            self._call("on_train_epoch_end")
            cb.pop("metrics", None)
            cb.pop("eval_results", None)
        reason = self._step_stop_reason()
        now = time.monotonic()
        ckpt_time = (
            o.ckpt_every_n_seconds is not None
            and now - self._last_ckpt_time >= o.ckpt_every_n_seconds
        )
        stop_flag, ckpt_flag = self._reduce_max([reason is not None, ckpt_time])
        if o.ckpt_dir is not None and (
            ckpt_flag or (o.ckpt_every_n_steps is not None and step % o.ckpt_every_n_steps == 0)
        ):
            self._save_checkpoint()
        if o.publish_dir is not None and (
            (o.publish_every_n_steps is not None and step % o.publish_every_n_steps == 0)
            or (
                o.publish_every_n_seconds is not None
                and now - self._last_pub_time >= o.publish_every_n_seconds
            )
        ):
            self._publish()
        if stop_flag:
            self.summary.stop_reason = reason or "peer_stopped"
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.sink:
            self._call("on_train_epoch_end")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        s = self.summary
        if s.stop_reason is None:
            if self._idle_stop is not None:
                s.stop_reason = self._idle_stop
            elif self.stream.agreed_stop:
                s.stop_reason = "peer_stopped"
            elif self.stream.exhausted:
                s.stop_reason = "source_exhausted"
            else:
                s.stop_reason = self._local_stop_reason() or "peer_stopped"
        try:
            self._call("on_train_end")
        finally:
            self.callbacks.exit()
        if self.opts.ckpt_dir is not None:
            if self._step() != self._last_ckpt_step:
                self._save_checkpoint()
            if self._world > 1:
                torch.distributed.barrier()  # rank 0 has written the final checkpoint
            self._release(self._saved_cursor)
        if self.opts.publish_dir is not None and self._step() != self._last_pub_step:
            self._publish()
        self._finish()
        log.info(
            "online_train stopped (%s) at step %d: %d steps, %d records in %.1f s.",
            s.stop_reason,
            self._step(),
            s.steps,
            s.records,
            s.elapsed_s,
        )

    def _finish(self) -> None:
        self._uninstall_signals()
        source = self.stream.source
        for obj in (source, self.stream.dataset):
            if obj is not None and hasattr(obj, "bind_idle"):
                obj.bind_idle(None)
        self.stream.close()
        s = self.summary
        s.total_steps = self._step()
        s.steps = s.total_steps - getattr(self, "_start_step", 0)
        s.records = s.total_records - getattr(self, "_start_records", 0)
        s.elapsed_s = time.monotonic() - self._t0 if self._t0 else 0.0

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        try:
            for cb in self.callbacks:
                config = (
                    getattr(cb, "config", None) if type(cb).__name__ == "ModelCheckpoint" else None
                )
                if config is not None and getattr(config, "exception_save", False):
                    try:
                        cb.save_breakpoint(self.cb)
                    except Exception:  # the original exception matters more
                        log.exception("ModelCheckpoint could not save the breakpoint checkpoint")
            self.callbacks.exit(sys.exc_info() if sys.exc_info()[0] else (None, None, None))
        finally:
            self._finish()
