"""``RecModel``: MindSpore Rec's ``online_train`` on a Lightning ``Trainer``, made a service.

``RecModel(network, loss_fn, optimizer, ...)`` is a :class:`lit_amp.Model`; its
``online_train(train_dataset, callbacks=None, dataset_sink_mode=True, sink_size=1)`` trains
continuously from an unbounded stream with MindSpore Rec's argument rules and callback
semantics, and adds what MindSpore Rec lacks, each configured by one option group of
:mod:`lit_amp.rec.online`: stop conditions (:class:`StopOptions`), checkpoints that hold the
stream cursor (:class:`CheckpointOptions`: at-least-once delivery across a crash), a publish
cadence for serving weights (:class:`PublishOptions`) and validation on a held-out window
(:class:`ValidationOptions`). See :meth:`RecModel.online_train`.
"""

from __future__ import annotations

import copy
import datetime
import logging
import sys
from collections.abc import Iterable
from typing import Any

from lit_amp._validation import check_type
from lit_amp.callbacks.base import InternalCallbackParam
from lit_amp.model.model import Model, quiet_lightning, split_callbacks
from lit_amp.rec.online import (
    CheckpointOptions,
    OnlineLoop,
    OnlineSummary,
    PublishOptions,
    StopOptions,
    ValidationOptions,
)
from lit_amp.rec.online.stream import OnlineStream, cursor_source

__all__ = ["RecModel", "OnlineSummary"]

log = logging.getLogger(__name__)

_OWNER = "RecModel.online_train"


def _check_sink(dataset_sink_mode: Any, sink_size: Any) -> None:
    """MindSpore Rec's checks of ``dataset_sink_mode`` and ``sink_size``, in its order."""
    if not isinstance(dataset_sink_mode, bool):
        raise TypeError(
            f"For '{_OWNER}', the argument 'dataset_sink_mode': The input value must be a "
            f"bool, but got {type(dataset_sink_mode).__name__}."
        )
    if not dataset_sink_mode:
        return
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


def _check_options(
    stop: Any, checkpoint: Any, publish: Any, validation: Any
) -> StopOptions:
    """The option groups have their types; returns ``stop`` or the default StopOptions."""
    for name, value, cls in (
        ("stop", stop, StopOptions),
        ("checkpoint", checkpoint, CheckpointOptions),
        ("publish", publish, PublishOptions),
        ("validation", validation, ValidationOptions),
    ):
        check_type(_OWNER, name, value, cls, f"a {cls.__name__}", allow_none=True)
    return StopOptions() if stop is None else stop


class RecModel(Model):
    """MindSpore Rec's ``RecModel``: a :class:`~lit_amp.Model` with online training.

    The constructor is ``Model``'s (MindSpore Rec's, plus lit_amp's ``trainer`` and Model's
    ``**kwargs``, which MindSpore Rec's lacks, so ``loss_scale_manager`` can be set).

    Attributes:
        last_online_summary: the :class:`OnlineSummary` of the last ``online_train`` call.

    Example:
        >>> import torch
        >>> from lit_amp.rec import StopOptions, WideDeep
        >>> from lit_amp.rec.sources import SyntheticClickSource
        >>> net = WideDeep(vocab_size=100, embed_dim=4, hidden=(16,))
        >>> model = RecModel(net, torch.nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters()))
        >>> summary = model.online_train(SyntheticClickSource(batch_size=64),
        ...                              stop=StopOptions(max_steps=5))
        >>> summary.steps, summary.records, summary.stop_reason
        (5, 320, 'max_steps')
    """

    last_online_summary: OnlineSummary | None = None

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
        stop: StopOptions | None = None,
        checkpoint: CheckpointOptions | None = None,
        publish: PublishOptions | None = None,
        validation: ValidationOptions | None = None,
    ) -> OnlineSummary:
        """Train continuously on an unbounded stream until a stop condition.

        MindSpore Rec's rules: ``dataset_sink_mode`` must be a bool; in sink mode
        ``sink_size`` must be exactly 1 and every batch is one "epoch" for callbacks
        (``cur_epoch_num`` and ``cur_step_num`` both advance per batch, and
        ``on_train_epoch_begin/step_begin/step_end/epoch_end`` all fire per batch); on CPU
        sink mode falls back to non-sink (logged), where the whole stream is one epoch
        (``batch_num`` is ``len(train_dataset)``, or ``sys.maxsize`` for a stream).

        What MindSpore Rec lacks comes in four option groups (see each class):

        - ``stop`` (:class:`StopOptions`): ``max_steps``, ``max_time``, a stop event, a stop
          file, signals (SIGTERM / SIGINT by default). ``run_context.request_stop()`` from a
          callback and the dataset ending always stop. The first condition met wins, after
          the current step.
        - ``checkpoint`` (:class:`CheckpointOptions`): ``online-{step}.ckpt`` files holding
          weights, optimizer, loss scale, stream cursor and counters; resumed from. Once a
          checkpoint is durable, the source's ``checkpointed(cursor)`` is called with the
          cursor of the checkpoint before it (and of the final one at the end), so that
          ``DirectorySource(delete_consumed=True)`` can delete consumed files.
        - ``publish`` (:class:`PublishOptions`): weights for serving (:mod:`lit_amp.rec.serving`).
        - ``validation`` (:class:`ValidationOptions`): test-then-train on a held-out window, or
          a fixed validation set (the model needs ``metrics``).

        Args:
            train_dataset: an iterable of batches, ideally a :mod:`lit_amp.rec.sources`
                source (its cursor makes restarts lossless); ``(data, label)`` batches when
                ``loss_fn`` is set.
            callbacks: MindSpore and/or Lightning callbacks.
            dataset_sink_mode: sink mode (see above).
            sink_size: must be 1 in sink mode; ignored otherwise.
            stop: the stop conditions (None: ``StopOptions()``, the signals only).
            checkpoint: cursor checkpoints and resume (None: none).
            publish: weights publishing (None: none).
            validation: validation during training (None: none).

        Returns:
            An :class:`OnlineSummary` (MindSpore Rec returns None; it never returns at all).

        Raises:
            TypeError: ``dataset_sink_mode`` is not a bool (MindSpore's message: "The input
                value must be a bool"); ``sink_size`` is not an int; an option group of the
                wrong type.
            ValueError: in sink mode ``sink_size`` <= 0 ("The input value must be int and must
                > 0") or != 1 ("The sink_size parameter only support value of 1 currently");
                ``validation`` without ``metrics``.
            RuntimeError: a checkpoint written by a different number of processes whose
                source cannot merge cursors.
        """
        _check_sink(dataset_sink_mode, sink_size)
        if train_dataset is None or not isinstance(train_dataset, Iterable):
            raise TypeError(
                f"For '{_OWNER}', the argument 'train_dataset' must be an iterable of batches "
                f"(a stream source, a DataLoader, ...), but got {type(train_dataset).__name__}."
            )
        cbl, pl_cbs = split_callbacks(callbacks)
        cbl.check_legacy_methods(raise_error=False)
        stop = _check_options(stop, checkpoint, publish, validation)
        if validation is not None and not self.lit_model.metric_fns:
            raise ValueError(
                f"For '{_OWNER}', validation (valid_every_n_steps="
                f"{validation.valid_every_n_steps}) needs 'metrics': construct the RecModel "
                "with metrics={...}."
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
                batch_num = len(train_dataset)
            except TypeError:
                batch_num = sys.maxsize

        lit = self.lit_model
        lit.apply_amp(self._device_hint())
        source = cursor_source(train_dataset)
        _warn_about_cursor(train_dataset, source, checkpoint)
        stream = OnlineStream(train_dataset, source)
        cb_params = self._online_params(train_dataset, cbl, batch_num, sink, validation)
        loop = OnlineLoop(
            cbl, cb_params, stream, sink=sink, network=self._network, stop=stop,
            checkpoint=checkpoint, publish=publish, validation=validation,
        )
        user_kwargs = self._trainer_kwargs
        self._trainer_kwargs = with_peer_timeout(user_kwargs, stop.peer_timeout)
        try:
            trainer = self._make_trainer(max_epochs=1, callbacks=[loop, *pl_cbs])
        finally:
            self._trainer_kwargs = user_kwargs
        lit.sink_mode = False
        with quiet_lightning():
            trainer.fit(lit, train_dataloaders=stream)
        self._current_epoch_num = int(cb_params.cur_epoch_num)
        step = int(cb_params.cur_step_num)
        self._current_step_num = (step - 1) % batch_num + 1 if step > 0 else 0
        self.last_online_summary = loop.summary
        return loop.summary

    def _online_params(
        self,
        train_dataset: Iterable,
        cbl: Any,
        batch_num: int,
        sink: bool,
        validation: ValidationOptions | None,
    ) -> InternalCallbackParam:
        """The ``cb_params`` an ``online_train`` run starts with."""
        lit = self.lit_model
        return InternalCallbackParam(
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
            valid_dataset=None if validation is None else validation.valid_dataset,
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

    def __repr__(self) -> str:
        return super().__repr__().replace("Model(", "RecModel(", 1)


def with_peer_timeout(trainer_kwargs: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``trainer_kwargs`` with a DDP strategy whose collectives time out after ``seconds``.

    A DDP strategy named by string (``"ddp"``; the spawning ones are refused) becomes the same
    ``DDPStrategy`` with ``timeout``; a ``DDPStrategy`` object still at Lightning's default
    timeout (30 minutes) gets a copy with ``timeout``; anything else is left as it is.

    Example:
        >>> kw = with_peer_timeout({"strategy": "ddp"}, 120)
        >>> kw["strategy"]._timeout.total_seconds()
        120.0
        >>> with_peer_timeout({"strategy": "auto"}, 120)
        {'strategy': 'auto'}
    """
    from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
    from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

    strategy = trainer_kwargs.get("strategy")
    timeout = datetime.timedelta(seconds=seconds)
    if isinstance(strategy, str) and strategy in StrategyRegistry:
        entry = StrategyRegistry[strategy]
        if entry["strategy"] is DDPStrategy:
            return {**trainer_kwargs,
                    "strategy": DDPStrategy(**{**entry["init_params"], "timeout": timeout})}
    elif type(strategy) is DDPStrategy and strategy._timeout == default_pg_timeout:
        strategy = copy.copy(strategy)
        strategy._timeout = timeout
        return {**trainer_kwargs, "strategy": strategy}
    return trainer_kwargs


def _warn_about_cursor(dataset: Any, source: Any, checkpoint: CheckpointOptions | None) -> None:
    """Warn when checkpoints cannot hold the stream position, or cannot let files go."""
    if source is None and checkpoint is not None:
        log.warning(
            "online_train: %s has no state_dict()/load_state_dict(), so checkpoints cannot "
            "hold the stream position; after a restart the stream starts wherever the "
            "dataset itself starts. Use a lit_amp.rec.sources source for at-least-once "
            "delivery.",
            type(dataset).__name__,
        )
    if checkpoint is None and getattr(source, "delete_consumed", False):
        log.warning(
            "online_train: %s(delete_consumed=True) deletes files only once a checkpoint "
            "counts them as consumed, and there is no checkpoint: nothing will be deleted.",
            type(source).__name__,
        )
