"""Stop conditions of ``online_train`` and the signal handlers that set one.

:class:`StopConditions` answers "why stop now?" from :class:`~lit_amp.rec.online.options.
StopOptions`: :meth:`~StopConditions.local_reason` holds the conditions any moment can check
(a caught signal, ``max_time``, ``stop_event``, ``stop_file``: the stream's idle hook asks it
while waiting for data), :meth:`~StopConditions.step_reason` adds those checked after a
step (``run_context.request_stop()``, ``max_steps``). The first reason found wins; the loop
agrees on it across DDP ranks. A signal is caught by a :class:`~lit_amp._signals.SignalRecorder`
(main thread only; the previous handlers are put back by :meth:`~StopConditions.finish`).
"""

from __future__ import annotations

import logging
import os
import signal
import time

from lit_amp._signals import SignalRecorder
from lit_amp.rec.online.options import StopOptions

__all__ = ["StopConditions"]

log = logging.getLogger(__name__)


class StopConditions:
    """The stop checks of one ``online_train`` run (see the module docstring).

    Args:
        opts: the stop options.

    Example:
        >>> stop = StopConditions(StopOptions(max_steps=3, stop_signals=()))
        >>> stop.start()
        >>> stop.step_reason(2, stop_requested=False), stop.step_reason(3, stop_requested=False)
        (None, 'max_steps')
        >>> stop.finish()
    """

    def __init__(self, opts: StopOptions) -> None:
        self.opts = opts
        self.deadline: float | None = None
        self._signals = SignalRecorder(opts.stop_signals or (), self._log_signal)

    def start(self, t0: float | None = None) -> None:
        """Start the clock of ``max_time`` (at ``t0``, a ``time.monotonic()``); install handlers."""
        t0 = time.monotonic() if t0 is None else t0
        if self.opts.max_time is not None:
            self.deadline = t0 + float(self.opts.max_time)
        self._install_signals()

    def finish(self) -> None:
        """Put the previous signal handlers back (safe to call more than once)."""
        self._signals.restore()

    @property
    def signal(self) -> int | None:
        """The number of the caught signal (None: none)."""
        return self._signals.received

    def max_steps_reached(self, step: int) -> bool:
        """Whether ``step`` (``cur_step_num``) reached ``max_steps``."""
        return self.opts.max_steps is not None and step >= self.opts.max_steps

    def local_reason(self) -> str | None:
        """The stop conditions that any moment can check (not the per-step ones), or None."""
        if self.signal is not None:
            try:
                return f"signal:{signal.Signals(self.signal).name}"
            except ValueError:
                return f"signal:{self.signal}"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "max_time"
        ev = self.opts.stop_event
        if ev is not None and ev.is_set():
            return "stop_event"
        stop_file = self.opts.stop_file
        if stop_file is not None and os.path.exists(stop_file):
            return "stop_file"
        return None

    def step_reason(self, step: int, *, stop_requested: bool) -> str | None:
        """Why to stop after step ``step`` (``stop_requested``: a callback asked), or None."""
        if stop_requested:
            return "request_stop"
        if self.max_steps_reached(step):
            return "max_steps"
        return self.local_reason()

    # ---------------------------------------------------------------- signals
    def _log_signal(self, signum: int) -> None:
        log.info("online_train: received signal %s; stopping after the current step.", signum)

    def _install_signals(self) -> None:
        if self._signals.signals and not self._signals.install():
            log.warning(
                "online_train runs outside the main thread: signal handlers for %s cannot be "
                "installed; use stop_event or stop_file to stop it.",
                list(self._signals.signals),
            )
