"""MindSpore's ``EarlyStopping``: stop training when a monitored value stops improving."""

from __future__ import annotations

import copy
import logging
import math
from typing import Any

from lit_amp._validation import check_bool, check_choice, check_int, check_number, check_str
from lit_amp.callbacks._utils import (
    MONITOR_MODES,
    ImprovementMixin,
    available_monitors,
    is_min_mode,
    is_rank_zero,
    monitor_value,
)
from lit_amp.callbacks.base import Callback, RunContext

__all__ = ["EarlyStopping"]

log = logging.getLogger(__name__)


class EarlyStopping(ImprovementMixin, Callback):
    """Stop training when the monitored value has not improved for ``patience`` epochs.

    Runs at each train epoch end. ``monitor="loss"`` reads the training loss of the last step
    (``net_outputs``: a tensor's mean, or the first element of a tuple); any other name reads
    ``cb_params.eval_results[monitor]``, which ``fit`` fills with the metrics and
    ``"eval_loss"``. A missing value logs a warning and the epoch is skipped. Under an
    initialized ``torch.distributed`` the value is averaged over the processes.

    Per evaluated epoch: ``wait += 1``; if the value improves on ``best`` (min mode:
    ``value < best - min_delta``; max mode: ``value > best + min_delta``), ``best`` is updated
    (and the weights snapshot when ``restore_best_weights``), and if ``baseline`` is None or the
    value also improves on ``baseline``, ``wait`` is reset to 0 and training goes on. Otherwise,
    when ``wait >= patience``, training is asked to stop.

    This follows MindSpore's documentation where its source differs: with ``patience=0`` an
    improving epoch does not stop training (the first epoch that fails to improve does);
    ``baseline`` is the given baseline (the source stores ``min_delta``); a monitored value of
    exactly 0 is a real value (the source skips it).

    ``mode='auto'`` uses min mode for the monitors ``loss``, ``eval_loss``, ``mae``, ``mse``,
    ``perplexity``, ``hausdorff_distance``, ``mean_surface_distance`` and
    ``root_mean_square_distance``, and max mode for every other name.

    Args:
        monitor: the quantity to watch ("loss", "eval_loss" or a metric name given to Model).
        min_delta: the smallest change that counts as an improvement (its absolute value).
        patience: epochs without improvement to wait before stopping (non-negative int).
        verbose: print (on rank 0) when restoring weights and the epoch training stopped at.
        mode: 'auto', 'min' or 'max'.
        baseline: a value the monitor must also beat to reset the wait counter, or None.
        restore_best_weights: load the weights of the best epoch (a deep copy of
            ``cb_params.network.state_dict()``) when stopping, or at train end.

    Attributes:
        best: the best value seen (``inf`` / ``-inf`` before the first).
        wait: epochs since the last improvement.
        stopped_epoch: the epoch at which a stop was requested (0 if none).

    Raises:
        TypeError: ``monitor`` or ``mode`` is not a str; ``min_delta`` or ``baseline`` is not a
            number; ``patience`` is not an int; a flag is not a bool.
        ValueError: ``patience`` is negative; ``mode`` is not 'auto', 'min' or 'max'; at an
            epoch end, the monitored value is not a scalar.

    Example:
        >>> from lit_amp.callbacks.base import RunContext
        >>> es = EarlyStopping(monitor="acc", patience=1)
        >>> for epoch, acc in enumerate([0.5, 0.7, 0.6], start=1):
        ...     rc = RunContext({"cur_epoch_num": epoch, "eval_results": {"acc": acc}})
        ...     es.on_train_epoch_end(rc)
        >>> es.stopped_epoch, es.best
        (3, 0.7)
    """

    def __init__(
        self,
        monitor: str = "eval_loss",
        min_delta: float = 0,
        patience: int = 0,
        verbose: bool = False,
        mode: str = "auto",
        baseline: float | None = None,
        restore_best_weights: bool = False,
    ) -> None:
        super().__init__()
        owner = "EarlyStopping"
        self.monitor = check_str(owner, "monitor", monitor)
        self.min_delta = abs(float(check_number(owner, "min_delta", min_delta)))
        self.patience = check_int(owner, "patience", patience, minimum=0)
        self.verbose = check_bool(owner, "verbose", verbose)
        self.mode = check_choice(owner, "mode", check_str(owner, "mode", mode), MONITOR_MODES)
        b = check_number(owner, "baseline", baseline, allow_none=True)
        self.baseline = None if b is None else float(b)
        self.restore_best_weights = check_bool(owner, "restore_best_weights", restore_best_weights)
        self._min_mode = is_min_mode(self.mode, self.monitor)
        self.wait = 0
        self.stopped_epoch = 0
        self.best = self._initial_best()
        self.best_weights: dict[str, Any] | None = None
        self._restored = False

    def on_train_begin(self, run_context: RunContext | None) -> None:
        """Reset the counters, the best value and the weight snapshot."""
        self.wait = 0
        self.stopped_epoch = 0
        self.best = self._initial_best()
        self.best_weights = None
        self._restored = False

    def _snapshot(self, cb_params: dict) -> None:
        net = cb_params.get("network")
        if net is None:
            log.warning("EarlyStopping: cb_params has no 'network'; best weights not saved.")
            return
        self.best_weights = copy.deepcopy(net.state_dict())
        self._restored = False

    def _restore(self, cb_params: dict) -> None:
        net = cb_params.get("network")
        if self.best_weights is None or net is None or self._restored:
            return
        if self.verbose and is_rank_zero(cb_params):
            print("Restoring model weights from the end of the best epoch.", flush=True)
        net.load_state_dict(self.best_weights)
        self._restored = True

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        """Update ``best``/``wait`` and request a stop when patience ran out.

        Raises:
            ValueError: the monitored value is not a scalar.
        """
        cb = run_context.original_args()
        current = monitor_value("EarlyStopping", self.monitor, cb)
        if current is None:
            log.warning(
                "Early stopping is conditioned on %r, which is not available. Available choices "
                "are: %s",
                self.monitor,
                available_monitors(cb),
            )
            return
        if math.isnan(current):
            log.warning("EarlyStopping: the monitored value %r is NaN.", self.monitor)
        if self.restore_best_weights and self.best_weights is None:
            self._snapshot(cb)
        self.wait += 1
        if self.is_improvement(current, self.best):
            self.best = current
            if self.restore_best_weights:
                self._snapshot(cb)
            if self.baseline is None or self.is_improvement(current, self.baseline):
                self.wait = 0
                return
        if self.wait >= self.patience:
            self.stopped_epoch = int(cb.get("cur_epoch_num", 0))
            run_context.request_stop()
            if self.restore_best_weights:
                self._restore(cb)

    def on_train_end(self, run_context: RunContext) -> None:
        """Restore the best weights if asked (and not done yet); report the stop epoch."""
        cb = run_context.original_args()
        if self.restore_best_weights:
            self._restore(cb)
        if self.stopped_epoch > 0 and self.verbose and is_rank_zero(cb):
            print(f"Epoch {self.stopped_epoch:05d}: early stopping", flush=True)
