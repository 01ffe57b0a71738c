"""Validation during ``online_train``: the held-out window (test-then-train) or a fixed set.

Without a ``valid_dataset``, :func:`validate` evaluates the next ``valid_window`` batches of
the stream, which the stream then yields for training: each record is evaluated before it is
trained on, so the metric is honest and no record is withheld. The eval hooks go to the
eval callbacks of training (custom callbacks and ``TimeMonitor``), as in ``Model.fit``.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from lit_amp.callbacks.bridge import MindSporeCallbackBridge
from lit_amp.rec.online.options import ValidationOptions
from lit_amp.rec.online.ranks import Ranks
from lit_amp.rec.online.stream import OnlineStream

__all__ = ["validate", "validation_due"]


def validation_due(opts: ValidationOptions | None, step: int) -> bool:
    """Whether step ``step`` is on the validation cadence.

    Example:
        >>> validation_due(ValidationOptions(valid_every_n_steps=2), 4), validation_due(None, 4)
        (True, False)
    """
    return opts is not None and step % opts.valid_every_n_steps == 0


def _batches(opts: ValidationOptions, stream: OnlineStream, ranks: Ranks) -> Any:
    if opts.valid_dataset is not None:
        return opts.valid_dataset
    batches = stream.holdout(opts.valid_window)
    # under DDP every rank evaluates if any has a batch (a rank whose shard ran dry evaluates
    # none): metrics and loss are reduced across ranks, so a rank that skipped would leave the
    # others waiting for it
    (anyone,) = ranks.reduce_max([1 if batches else 0])
    return batches if anyone else None


def validate(
    bridge: MindSporeCallbackBridge,
    opts: ValidationOptions,
    stream: OnlineStream,
    ranks: Ranks,
    trainer: L.Trainer,
    lit: Any,
) -> None:
    """Evaluate ``lit`` once and expose ``metrics`` / ``eval_results`` in ``cb_params``.

    Args:
        bridge: the run's callback bridge (its eval hooks and train-key save/restore).
        opts: the validation options.
        stream: the run's stream (the held-out window comes from it).
        ranks: the DDP ranks.
        trainer: the running Trainer (moves batches to the device).
        lit: the train-step module (``begin_eval``, ``eval_step``, ``end_eval``,
            ``last_eval_results``).
    """
    batches = _batches(opts, stream, ranks)
    if batches is None:
        return
    try:
        batch_num = len(batches)
    except TypeError:
        batch_num = None
    bridge.begin_fit_eval(batch_num)
    try:
        bridge.begin_eval_epoch()
        was_training = lit.training
        lit.eval()
        lit.begin_eval()
        try:
            with torch.no_grad():
                for batch in batches:
                    batch = trainer.strategy.batch_to_device(batch)
                    bridge.eval_step_begin(batch)
                    bridge.eval_step_end(lit.eval_step(batch))
                lit.end_eval()
        finally:
            lit.train(was_training)
        res = lit.last_eval_results
        bridge.end_eval(res)
    except BaseException:
        bridge.end_fit_eval(None)
        raise
    bridge.end_fit_eval(res)
