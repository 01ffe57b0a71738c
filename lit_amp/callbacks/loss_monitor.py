"""MindSpore's ``LossMonitor``: print the training loss, stop on NaN/Inf, print fit's metrics."""

from __future__ import annotations

from typing import Any

from lit_amp._runtime import rank, reduce_sum, world_size
from lit_amp._validation import check_int
from lit_amp.callbacks._utils import handle_loss, is_finite, is_rank_zero
from lit_amp.callbacks.base import Callback, RunContext

__all__ = ["LossMonitor"]


def _invalid_loss_ranks(invalid: bool) -> list[int]:
    """The ranks whose loss is NaN/Inf at this step, agreed by all ranks (one all-reduce).

    Without an initialised multi-process ``torch.distributed`` group: ``[0]`` or ``[]``.
    """
    flags = [0] * world_size()
    flags[rank()] = int(invalid)
    return [r for r, f in enumerate(reduce_sum(flags)) if f]


class LossMonitor(Callback):
    """Print the loss during training, and the evaluation metrics at each epoch end of ``fit``.

    At a train step end it prints ``"epoch: {e} step: {step_in_epoch}, loss is {loss}"`` when at
    least ``per_print_times`` steps passed since the last print (in dataset sink mode a step end
    comes once per sink, so the loss is printed at the nearest sink). ``step_in_epoch`` is
    ``(cur_step_num - 1) % batch_num + 1``. The loss is the float mean of a tensor output, or the
    float of the first element of a ``(loss, overflow, scale)`` tuple.

    A NaN or Inf loss raises ValueError, which terminates training. MindSpore skips this check
    under loss scaling (tuple outputs); lit_amp checks there too (see ``docs/differences.md``).

    Printing happens on global rank 0 only. Under ``torch.distributed`` (DDP) the ranks decide
    together: every step end all-reduces one flag per rank, and when any rank's loss is NaN/Inf
    every rank raises the ValueError (naming the ranks) at the same step, so no rank is left
    waiting in a collective for a rank that has stopped. Every rank must therefore run the
    same number of step ends (as DDP's equal-length samplers guarantee).

    Args:
        per_print_times: print every this many steps; 0 never prints the loss.

    Raises:
        TypeError: ``per_print_times`` is not an int.
        ValueError: ``per_print_times`` is negative.

    Example:
        >>> import torch
        >>> from lit_amp.callbacks.base import RunContext
        >>> rc = RunContext({"cur_epoch_num": 1, "cur_step_num": 1, "batch_num": 4,
        ...                  "net_outputs": torch.tensor(0.5)})
        >>> LossMonitor().on_train_step_end(rc)
        epoch: 1 step: 1, loss is 0.5
    """

    def __init__(self, per_print_times: int = 1) -> None:
        super().__init__()
        self._per_print_times = check_int(
            "LossMonitor", "per_print_times", per_print_times, minimum=0
        )
        self._last_print_time = 0

    @property
    def per_print_times(self) -> int:
        """How many steps between two prints (0: never)."""
        return self._per_print_times

    def on_train_begin(self, run_context: RunContext) -> None:
        """Reset the print counter (``cur_step_num`` restarts at 0 in every run)."""
        self._last_print_time = 0

    def on_train_step_end(self, run_context: RunContext) -> None:
        """Check the loss for NaN/Inf and print it every ``per_print_times`` steps.

        Raises:
            ValueError: the loss is NaN or Inf (on any rank under torch.distributed).
        """
        cb = run_context.original_args()
        cur_epoch = cb.get("cur_epoch_num", 1)
        cur_step = int(cb.get("cur_step_num", 0))
        batch_num = int(cb.get("batch_num", 0) or 0)
        step_in_epoch = (cur_step - 1) % batch_num + 1 if batch_num > 0 else cur_step
        loss = handle_loss(cb.get("net_outputs"))
        invalid = loss is not None and not is_finite(loss)
        bad_ranks = _invalid_loss_ranks(invalid)
        if bad_ranks:
            where = (f" The loss is NAN or INF on rank(s) {bad_ranks} (this rank's: {loss}); all "
                     "ranks stop." if world_size() > 1 else "")
            raise ValueError(  # MindSpore 2.10's message, then the ranks under DDP
                f"In epoch: {cur_epoch} step: {step_in_epoch}, loss is NAN or INF, training "
                f"process cannot continue, terminating training.{where}"
            )
        if self._per_print_times == 0:
            return
        # cur_step_num may have been rolled back (resume / a new run): re-anchor the counter.
        if cur_step <= self._last_print_time:
            step = max(self._per_print_times, batch_num if cb.get("dataset_sink_mode") else 1)
            while cur_step <= self._last_print_time:
                self._last_print_time -= step
        if cur_step - self._last_print_time >= self._per_print_times:
            self._last_print_time = cur_step
            if is_rank_zero(cb):
                print(f"epoch: {cur_epoch} step: {step_in_epoch}, loss is {loss}", flush=True)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        """During ``fit``, print the evaluation metrics of this epoch."""
        cb = run_context.original_args()
        metrics: Any = cb.get("metrics")
        if metrics and is_rank_zero(cb):
            print(f"Eval result: epoch {cb.get('cur_epoch_num')}, metrics: {metrics}", flush=True)
