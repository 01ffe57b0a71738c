"""MindSpore's ``TimeMonitor``: epoch and per-step wall time, optionally host data time."""

from __future__ import annotations

import time

from lit_amp._validation import check_bool, check_int
from lit_amp.callbacks._utils import is_rank_zero
from lit_amp.callbacks.base import Callback, RunContext

__all__ = ["TimeMonitor"]


class TimeMonitor(Callback):
    """Print the time an epoch took and the mean time per step, in training and evaluation.

    At each epoch end it prints
    ``"{Mode} epoch time: {X:.3f} ms, per step time: {Y:.3f} ms"`` where Mode is ``Train`` or
    ``Eval``, and the step count is ``cb_params.batch_num`` when positive, else ``data_size``.
    It uses the legacy hooks, so it runs in both ``train`` and ``eval``; it is the one built-in
    callback that ``fit`` also calls during its per-epoch evaluation.

    With ``data_time=True`` it adds MindSpore's ``" (data time: {Z:.3f} ms)"``: the host time spent
    between a step end and the next step begin (fetching the next batch), summed over the epoch
    and divided by the step count. In dataset sink mode data fetching overlaps computation and a
    step end comes once per sink, so no data time is printed there.

    Training and evaluation keep separate clocks, so the evaluation ``fit`` runs inside a train
    epoch does not restart the train epoch's clock (in MindSpore it does). Printing happens on
    global rank 0 only.

    Args:
        data_size: the step count to use when ``batch_num`` is not known; None or a positive int.
        data_time: also report the host data-fetch time per step.

    Raises:
        TypeError: ``data_size`` is not an int or None; ``data_time`` is not a bool.
        ValueError: ``data_size`` is not positive; or, at an epoch end, neither ``batch_num``
            nor ``data_size`` gives a positive step count.

    Example:
        >>> from lit_amp.callbacks.base import RunContext
        >>> tm = TimeMonitor(data_size=10)
        >>> rc = RunContext({"mode": "train"})
        >>> tm.on_train_epoch_begin(rc)
        >>> tm.on_train_epoch_end(rc)  # doctest: +ELLIPSIS
        Train epoch time: ... ms, per step time: ... ms
    """

    def __init__(self, data_size: int | None = None, data_time: bool = False) -> None:
        super().__init__()
        self.data_size = check_int(
            "TimeMonitor", "data_size", data_size, minimum=1, allow_none=True
        )
        self.data_time = check_bool("TimeMonitor", "data_time", data_time)
        # One clock per mode: fit's evaluation runs inside a train epoch and must not reset it.
        self._epoch_start: dict[str, float] = {}
        self._data_sum: dict[str, float] = {}
        self._data_start: dict[str, float | None] = {}

    @staticmethod
    def _state(run_context: RunContext) -> tuple[str, bool]:
        cb = run_context.original_args()
        return str(cb.get("mode", "train")), bool(cb.get("dataset_sink_mode", False))

    def epoch_begin(self, run_context: RunContext) -> None:
        """Start the epoch clock (train and eval)."""
        mode, _ = self._state(run_context)
        now = time.perf_counter()
        self._epoch_start[mode] = now
        self._data_sum[mode] = 0.0
        self._data_start[mode] = now

    def step_begin(self, run_context: RunContext) -> None:
        """Add the time since the previous step end (or epoch begin) to the data time."""
        mode, sink = self._state(run_context)
        start = self._data_start.get(mode)
        if self.data_time and not sink and start is not None:
            self._data_sum[mode] = self._data_sum.get(mode, 0.0) + time.perf_counter() - start
            self._data_start[mode] = None

    def step_end(self, run_context: RunContext) -> None:
        """Start timing the fetch of the next batch."""
        mode, sink = self._state(run_context)
        if self.data_time and not sink:
            self._data_start[mode] = time.perf_counter()

    def epoch_end(self, run_context: RunContext) -> None:
        """Print the epoch time and the per-step time (train and eval).

        Raises:
            ValueError: no positive step count (``batch_num`` <= 0 and ``data_size`` None).
        """
        mode, sink = self._state(run_context)
        now = time.perf_counter()
        epoch_ms = (now - self._epoch_start.get(mode, now)) * 1000.0
        cb = run_context.original_args()
        steps = self.data_size
        batch_num = cb.get("batch_num")
        if isinstance(batch_num, int) and not isinstance(batch_num, bool) and batch_num > 0:
            steps = batch_num
        if steps is None:
            raise ValueError(
                "For 'TimeMonitor', the step count must be a positive int: cb_params.batch_num "
                f"is {batch_num!r} and the argument 'data_size' is None; pass data_size."
            )
        step_ms = epoch_ms / steps
        line = f"{mode.title()} epoch time: {epoch_ms:.3f} ms, per step time: {step_ms:.3f} ms"
        if self.data_time and not sink:
            data_ms = self._data_sum.get(mode, 0.0) * 1000.0 / steps
            line += f" (data time: {data_ms:.3f} ms)"
        if is_rank_zero(cb):
            print(line, flush=True)
