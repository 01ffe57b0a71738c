"""Catch a signal by recording it, and let the training loop act on it at a step boundary.

Every owner of a stop-on-signal (``StopOnSignal``/``OnRequestExit``, ``online_train``'s stop
conditions, the SLURM task of ``hydra/launcher=slurm``, an interruptible ``-m`` sweep) uses
:class:`SignalRecorder`: the handler only records the signal (and may call the owner's
``on_signal``), so nothing is written inside a handler and a file being written when the
signal lands is never left truncated. Handlers are installed from the main thread only (Python
allows no other) and the previous handlers are put back. Imports no torch.

Example:
    >>> import os, signal
    >>> rec = SignalRecorder([signal.SIGUSR1])
    >>> rec.install(), rec.received
    (True, None)
    >>> os.kill(os.getpid(), signal.SIGUSR1)
    >>> rec.received == signal.SIGUSR1
    True
    >>> rec.restore()
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

__all__ = ["SignalRecorder"]

#: the handlers :meth:`SignalRecorder.install` replaces when asked to keep anyone else's
_DEFAULTS = (signal.SIG_DFL, signal.default_int_handler)


class SignalRecorder:
    """Records which of ``signals`` arrived last; puts the previous handlers back on restore.

    Args:
        signals: the signal numbers to catch.
        on_signal: called with the signal number after it is recorded (a log line, a
            forward to another owner, or an exception the owner wants raised at once).

    Attributes:
        signals: the signal numbers.
        received: the number of the last signal that arrived (None: none); settable.
    """

    def __init__(self, signals: Iterable[int],
                 on_signal: Callable[[int], None] | None = None) -> None:
        self.signals = tuple(dict.fromkeys(int(s) for s in signals))
        self.received: int | None = None
        self._on_signal = on_signal
        self._previous: dict[int, Any] = {}

    @property
    def installed(self) -> bool:
        """Whether this recorder's handlers are in place."""
        return bool(self._previous)

    def previous(self, sig: int) -> Any:
        """The handler this recorder replaced for ``sig`` (None: not replaced)."""
        return self._previous.get(sig)

    def install(self, *, over_defaults_only: bool = False) -> bool:
        """Install the handlers (a no-op when they are in place).

        Args:
            over_defaults_only: replace only the default handlers (``SIG_DFL``, Python's
                ``KeyboardInterrupt`` one); a handler someone else installed is kept.

        Returns:
            False outside the main thread, where no handler can be installed; else True.
        """
        if self._previous:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in self.signals:
            if over_defaults_only and signal.getsignal(sig) not in _DEFAULTS:
                continue
            self._previous[sig] = signal.signal(sig, self._record)
        return True

    def restore(self) -> None:
        """Put the previous handlers back (safe to call more than once)."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        if self._on_signal is not None:
            self._on_signal(signum)
