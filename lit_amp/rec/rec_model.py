"""``RecModel``: MindSpore Rec's ``online_train`` on a Lightning ``Trainer``, made a service.

``RecModel(network, loss_fn, optimizer, ...)`` is a :class:`lit_amp.Model`; its
``online_train(train_dataset, callbacks=None, dataset_sink_mode=True, sink_size=1)`` trains
continuously from an unbounded stream with MindSpore Rec's argument rules and callback
semantics (spec §5), and adds what MindSpore Rec lacks: stop conditions, validation on a
held-out window, checkpoints that hold the stream cursor (at-least-once delivery across a
crash), and a publish cadence for serving weights. See :meth:`RecModel.online_train`.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from lit_amp.callbacks._callback import InternalCallbackParam
from lit_amp.model.model import Model, _quiet_lightning, _split_callbacks
from lit_amp.rec._loop import OnlineLoop, OnlineOptions, OnlineSummary
from lit_amp.rec._stream import OnlineStream, cursor_source

__all__ = ["RecModel", "OnlineSummary"]

log = logging.getLogger(__name__)

_OWNER = "RecModel.online_train"
_UNCATCHABLE = {getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n)}


def _positive_int(name: str, value: Any, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(
            f"For '{_OWNER}', the argument '{name}' must be an int"
            f"{' or None' if allow_none else ''}, but got {value!r} ({type(value).__name__})."
        )
    if value <= 0:
        raise ValueError(f"For '{_OWNER}', the argument '{name}' must be > 0, but got {value}.")
    return value


def _seconds(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"For '{_OWNER}', the argument '{name}' must be a number of seconds, a "
            f"datetime.timedelta or None, but got {value!r} ({type(value).__name__})."
        )
    if value <= 0:
        raise ValueError(
            f"For '{_OWNER}', the argument '{name}' must be > 0 seconds, but got {value}."
        )
    return float(value)


def _path(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"For '{_OWNER}', the argument '{name}' must be a str path or None, but got "
            f"{value!r} ({type(value).__name__})."
        )
    return os.path.abspath(os.fspath(value))


class RecModel(Model):
    """MindSpore Rec's ``RecModel``: a :class:`~lit_amp.Model` with online training.

    The constructor is ``Model``'s (MindSpore Rec's, plus lit_amp's ``trainer`` and Model's
    ``**kwargs``, which MindSpore Rec's lacks, so ``loss_scale_manager`` can be set).

    Args:
        network: the backbone ``torch.nn.Module`` (e.g. :class:`~lit_amp.rec.WideDeep`).
        loss_fn: the loss module, or None (the network computes its loss).
        optimizer: a ``torch.optim.Optimizer`` over the network's parameters, or None.
        metrics: metric names or a dict name -> torchmetrics ``Metric`` (for validation).
        eval_network, eval_indexes: a custom eval network and its ``[loss, pred, label]``.
        amp_level: "O0" | "O1" | "O2" | "O3" | "auto".
        boost_level: "O0" | "O1" | "O2".
        trainer: Lightning ``Trainer`` arguments (accelerator, devices, strategy, logger...).
        **kwargs: ``loss_scale_manager``, ``keep_batchnorm_fp32``, ``boost_config_dict``.

    Example:
        >>> from lit_amp.rec import WideDeep
        >>> from lit_amp.rec.sources import SyntheticClickSource
        >>> net = WideDeep(vocab_size=100, embed_dim=4, hidden=(16,))
        >>> model = RecModel(net, nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters()))
        >>> summary = model.online_train(SyntheticClickSource(batch_size=64), max_steps=5)
        >>> summary.steps, summary.records, summary.stop_reason
        (5, 320, 'max_steps')
    """

    def __init__(
        self,
        network: nn.Module,
        loss_fn: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        metrics: set | dict | None = None,
        eval_network: nn.Module | None = None,
        eval_indexes: list[int] | None = None,
        amp_level: str = "O0",
        boost_level: str = "O0",
        *,
        trainer: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            network,
            loss_fn,
            optimizer,
            metrics,
            eval_network,
            eval_indexes,
            amp_level,
            boost_level,
            trainer=trainer,
            **kwargs,
        )
        self.last_online_summary: OnlineSummary | None = None

    def _sink_supported(self) -> bool:
        """Whether the device can run dataset sink mode (MindSpore: not on CPU)."""
        return self._device_hint().type != "cpu"

    def online_train(
        self,
        train_dataset: Iterable,
        callbacks: Any = None,
        dataset_sink_mode: bool = True,
        sink_size: int = 1,
        *,
        max_steps: int | None = None,
        max_time: float | datetime.timedelta | None = None,
        stop_event: Any = None,
        stop_file: str | os.PathLike | None = None,
        stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
        valid_dataset: Iterable | None = None,
        valid_every_n_steps: int | None = None,
        valid_window: int = 1,
        ckpt_dir: str | os.PathLike | None = None,
        ckpt_every_n_steps: int | None = None,
        ckpt_every_n_seconds: float | None = None,
        keep_checkpoint_max: int = 5,
        resume: bool = True,
        publish_dir: str | os.PathLike | None = None,
        publish_every_n_steps: int | None = None,
        publish_every_n_seconds: float | None = None,
        keep_published_max: int = 3,
        publish_hook: Callable[[dict], None] | None = None,
    ) -> OnlineSummary:
        """Train continuously on an unbounded stream until a stop condition.

        MindSpore Rec's rules: ``dataset_sink_mode`` must be a bool; in sink mode
        ``sink_size`` must be exactly 1 and every batch is one "epoch" for callbacks
        (``cur_epoch_num`` and ``cur_step_num`` both advance per batch, and
        ``on_train_epoch_begin/step_begin/step_end/epoch_end`` all fire per batch); on CPU
        sink mode falls back to non-sink (logged), where the whole stream is one epoch
        (``batch_num`` is ``len(train_dataset)``, or ``sys.maxsize`` for a stream).

        Stop conditions (MindSpore Rec has none; the first one met wins, after the current
        step): ``max_steps`` (``cur_step_num``, which counts restored steps), ``max_time``
        (this call's wall time), ``stop_event.is_set()``, ``stop_file`` existing, one of
        ``stop_signals`` (handlers installed for the run, previous ones put back after),
        ``run_context.request_stop()`` from a callback (checked after every step), and the
        dataset ending. Sources also check the event, file, signal and time while waiting.

        Validation: every ``valid_every_n_steps`` steps, the model (with ``metrics``) is
        evaluated on ``valid_dataset``, or — without one — on a held-out window of the next
        ``valid_window`` batches of the stream, which are evaluated *before* they are
        trained on (test-then-train: the metric is honest and no record is withheld). As in
        ``fit``, custom callbacks and ``TimeMonitor`` get the eval hooks, and
        ``cb_params.metrics`` / ``eval_results`` are visible from then on (in sink mode at
        that batch's ``on_train_epoch_end``).

        Checkpoints (``ckpt_dir``): every ``ckpt_every_n_steps`` steps and/or
        ``ckpt_every_n_seconds``, and at the end, ``online-{step}.ckpt`` holds the network,
        optimizer, loss-scale state, the stream cursor of the last *trained* batch and the
        counters, written atomically; the newest ``keep_checkpoint_max`` are kept. With
        ``resume`` the newest one is restored first. Delivery is at-least-once: after a
        crash (even ``kill -9``) and a restart, every record is trained at least once, and
        the records trained twice are those after the last checkpoint (at most one interval).
        Once a checkpoint is durable, the source's ``checkpointed(cursor)`` is called with the
        cursor of the checkpoint before it (and of the final one at the end), so that
        ``DirectorySource(delete_consumed=True)`` can delete consumed files.

        Publishing (``publish_dir``): every ``publish_every_n_steps`` steps and/or
        ``publish_every_n_seconds`` (also while the stream is idle), and at the end, the
        network's weights are exported atomically as ``model-{step}.pt`` plus ``LATEST``
        (see :mod:`lit_amp.rec.publish`); ``publish_hook(info)`` is then called.

        Args:
            train_dataset: an iterable of batches, ideally a :mod:`lit_amp.rec.sources`
                source (its cursor makes restarts lossless); ``(data, label)`` batches when
                ``loss_fn`` is set.
            callbacks: MindSpore and/or Lightning callbacks.
            dataset_sink_mode: sink mode (see above).
            sink_size: must be 1 in sink mode; ignored otherwise.
            max_steps, max_time, stop_event, stop_file, stop_signals: stop conditions.
            valid_dataset, valid_every_n_steps, valid_window: validation.
            ckpt_dir, ckpt_every_n_steps, ckpt_every_n_seconds, keep_checkpoint_max, resume:
                checkpoints.
            publish_dir, publish_every_n_steps, publish_every_n_seconds, keep_published_max,
                publish_hook: publishing.

        Returns:
            An :class:`OnlineSummary` (MindSpore Rec returns None; it never returns at all).

        Raises:
            TypeError: ``dataset_sink_mode`` is not a bool (MindSpore's message: "The input
                value must be a bool"); ``sink_size`` is not an int; a bad option type.
            ValueError: in sink mode ``sink_size`` <= 0 ("The input value must be int and must
                > 0") or != 1 ("The sink_size parameter only support value of 1 currently");
                a bad option value; validation without metrics; a cadence without its folder.
            RuntimeError: a checkpoint written by a different number of processes whose
                source cannot merge cursors.
        """
        # ---- MindSpore Rec's checks, in its order
        if not isinstance(dataset_sink_mode, bool):
            raise TypeError(
                f"For '{_OWNER}', the argument 'dataset_sink_mode': The input value must be a "
                f"bool, but got {type(dataset_sink_mode).__name__}."
            )
        if dataset_sink_mode:
            if not isinstance(sink_size, int) or isinstance(sink_size, bool):
                raise TypeError(
                    f"For '{_OWNER}', the argument 'sink_size': The input value must be int, but "
                    f"got {sink_size!r} ({type(sink_size).__name__})."
                )
            if sink_size <= 0:
                raise ValueError(
                    f"For '{_OWNER}', the argument 'sink_size': The input value must be int and "
                    f"must > 0, but got {sink_size}."
                )
            if sink_size != 1:
                raise ValueError(
                    f"For '{_OWNER}', the argument 'sink_size': The sink_size parameter only "
                    f"support value of 1 currently, but got: {sink_size}"
                )
        if train_dataset is None or not isinstance(train_dataset, Iterable):
            raise TypeError(
                f"For '{_OWNER}', the argument 'train_dataset' must be an iterable of batches "
                f"(a stream source, a DataLoader, ...), but got {type(train_dataset).__name__}."
            )
        cbl, pl_cbs = _split_callbacks(callbacks)
        cbl.check_legacy_methods(raise_error=False)
        opts = self._online_options(
            max_steps=max_steps,
            max_time=max_time,
            stop_event=stop_event,
            stop_file=stop_file,
            stop_signals=stop_signals,
            valid_dataset=valid_dataset,
            valid_every_n_steps=valid_every_n_steps,
            valid_window=valid_window,
            ckpt_dir=ckpt_dir,
            ckpt_every_n_steps=ckpt_every_n_steps,
            ckpt_every_n_seconds=ckpt_every_n_seconds,
            keep_checkpoint_max=keep_checkpoint_max,
            resume=resume,
            publish_dir=publish_dir,
            publish_every_n_steps=publish_every_n_steps,
            publish_every_n_seconds=publish_every_n_seconds,
            keep_published_max=keep_published_max,
            publish_hook=publish_hook,
        )

        # ---- sink mode: CPU falls back to non-sink, as MindSpore Rec
        sink = dataset_sink_mode
        if sink and not self._sink_supported():
            log.info(
                "The CPU doesn't support dataset sink mode, so online training runs with "
                "dataset_sink_mode=False (each epoch is one pass of the stream)."
            )
            sink = False
        if sink:
            batch_num: int = 1
        else:
            try:
                batch_num = len(train_dataset)  # type: ignore[arg-type]
            except TypeError:
                batch_num = sys.maxsize

        lit = self._lit
        lit.apply_amp(self._device_hint())
        source = cursor_source(train_dataset)
        if source is None and opts.ckpt_dir is not None:
            log.warning(
                "online_train: %s has no state_dict()/load_state_dict(), so checkpoints cannot "
                "hold the stream position; after a restart the stream starts wherever the "
                "dataset itself starts. Use a lit_amp.rec.sources source for at-least-once "
                "delivery.",
                type(train_dataset).__name__,
            )
        if opts.ckpt_dir is None and getattr(source, "delete_consumed", False):
            log.warning(
                "online_train: %s(delete_consumed=True) deletes files only once a checkpoint "
                "counts them as consumed, and ckpt_dir is None: nothing will be deleted.",
                type(source).__name__,
            )
        stream = OnlineStream(train_dataset, source)
        cb_params = InternalCallbackParam(
            train_network=lit,
            network=self._network,
            loss_fn=self._loss_fn,
            optimizer=self._optimizer,
            epoch_num=sys.maxsize,
            batch_num=batch_num,
            mode="train",
            parallel_mode="data_parallel"
            if self._trainer_kwargs.get("strategy")
            else "stand_alone",
            device_number=1,
            rank=0,
            train_dataset=train_dataset,
            valid_dataset=opts.valid_dataset,
            eval_network=lit.eval_network,
            list_callback=list(cbl.callbacks),
            train_dataset_element=None,
            last_save_ckpt_step=None,
            latest_ckpt_file=None,
            dataset_sink_mode=sink,
            cur_epoch_num=0,
            cur_step_num=0,
            net_outputs=None,
        )
        loop = OnlineLoop(cbl, cb_params, stream, opts, sink=sink, network=self._network)
        trainer = self._make_trainer(max_epochs=1, callbacks=[loop, *pl_cbs])
        lit._sink_mode = False
        with _quiet_lightning():
            trainer.fit(lit, train_dataloaders=stream)
        self._current_epoch_num = int(cb_params.cur_epoch_num)
        step = int(cb_params.cur_step_num)
        self._current_step_num = (step - 1) % batch_num + 1 if step > 0 else 0
        self.last_online_summary = loop.summary
        return loop.summary

    def _online_options(self, **kw: Any) -> OnlineOptions:
        max_steps = _positive_int("max_steps", kw["max_steps"])
        max_time = _seconds("max_time", kw["max_time"])
        ev = kw["stop_event"]
        if ev is not None and not callable(getattr(ev, "is_set", None)):
            raise TypeError(
                f"For '{_OWNER}', the argument 'stop_event' must have is_set() (a "
                f"threading.Event or multiprocessing.Event) or be None, but got "
                f"{type(ev).__name__}."
            )
        stop_file = _path("stop_file", kw["stop_file"])
        sigs = kw["stop_signals"]
        if sigs is None:
            sigs = ()
        if not isinstance(sigs, (tuple, list)):
            raise TypeError(
                f"For '{_OWNER}', the argument 'stop_signals' must be a tuple of signal numbers, "
                f"but got {sigs!r}."
            )
        for s in sigs:
            if isinstance(s, bool) or not isinstance(s, int) or s not in signal.valid_signals():
                raise ValueError(
                    f"For '{_OWNER}', 'stop_signals' must hold valid signal numbers, but got {s!r}."
                )
            if s in _UNCATCHABLE:
                raise ValueError(
                    f"For '{_OWNER}', 'stop_signals' can't hold {signal.Signals(s).name}: it "
                    "cannot be caught."
                )
        valid_dataset = kw["valid_dataset"]
        if valid_dataset is not None and not isinstance(valid_dataset, Iterable):
            raise TypeError(
                f"For '{_OWNER}', the argument 'valid_dataset' must be an iterable of batches or "
                f"None, but got {type(valid_dataset).__name__}."
            )
        valid_every = _positive_int("valid_every_n_steps", kw["valid_every_n_steps"])
        valid_window = _positive_int("valid_window", kw["valid_window"], allow_none=False)
        if valid_dataset is not None and valid_every is None:
            raise ValueError(
                f"For '{_OWNER}', 'valid_dataset' needs 'valid_every_n_steps' (how often to "
                "validate), but it is None."
            )
        if valid_every is not None and not self._lit.metric_fns:
            raise ValueError(
                f"For '{_OWNER}', validation (valid_every_n_steps={valid_every}) needs "
                "'metrics': construct the RecModel with metrics={...}."
            )
        ckpt_dir = _path("ckpt_dir", kw["ckpt_dir"])
        ckpt_steps = _positive_int("ckpt_every_n_steps", kw["ckpt_every_n_steps"])
        ckpt_secs = _seconds("ckpt_every_n_seconds", kw["ckpt_every_n_seconds"])
        keep_ckpt = _positive_int(
            "keep_checkpoint_max", kw["keep_checkpoint_max"], allow_none=False
        )
        if ckpt_dir is None and (ckpt_steps is not None or ckpt_secs is not None):
            raise ValueError(
                f"For '{_OWNER}', 'ckpt_every_n_steps' / 'ckpt_every_n_seconds' need "
                "'ckpt_dir', but it is None."
            )
        if not isinstance(kw["resume"], bool):
            raise TypeError(
                f"For '{_OWNER}', the argument 'resume' must be a bool, but got {kw['resume']!r}."
            )
        publish_dir = _path("publish_dir", kw["publish_dir"])
        pub_steps = _positive_int("publish_every_n_steps", kw["publish_every_n_steps"])
        pub_secs = _seconds("publish_every_n_seconds", kw["publish_every_n_seconds"])
        keep_pub = _positive_int("keep_published_max", kw["keep_published_max"], allow_none=False)
        if publish_dir is None and (pub_steps is not None or pub_secs is not None):
            raise ValueError(
                f"For '{_OWNER}', 'publish_every_n_steps' / 'publish_every_n_seconds' need "
                "'publish_dir', but it is None."
            )
        hook = kw["publish_hook"]
        if hook is not None and not callable(hook):
            raise TypeError(
                f"For '{_OWNER}', the argument 'publish_hook' must be callable or None, but got "
                f"{type(hook).__name__}."
            )
        return OnlineOptions(
            max_steps=max_steps,
            max_time=max_time,
            stop_event=ev,
            stop_file=stop_file,
            stop_signals=tuple(int(s) for s in sigs),
            valid_dataset=valid_dataset,
            valid_every_n_steps=valid_every,
            valid_window=valid_window,  # type: ignore[arg-type]
            ckpt_dir=ckpt_dir,
            ckpt_every_n_steps=ckpt_steps,
            ckpt_every_n_seconds=ckpt_secs,
            keep_checkpoint_max=keep_ckpt,  # type: ignore[arg-type]
            resume=kw["resume"],
            publish_dir=publish_dir,
            publish_every_n_steps=pub_steps,
            publish_every_n_seconds=pub_secs,
            keep_published_max=keep_pub,  # type: ignore[arg-type]
            publish_hook=hook,
        )

    def __repr__(self) -> str:
        return super().__repr__().replace("Model(", "RecModel(", 1)
