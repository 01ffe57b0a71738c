"""Stop training at a step boundary when a signal arrives: ``StopOnSignal`` and MindSpore's
``OnRequestExit`` (which also saves a checkpoint on the way out).

A signal handler only records the signal (:class:`lit_amp._signals.SignalRecorder`); the
training loop acts on it at the next step end, so what the run writes as it stops (a
``BackupAndRestore`` backup of the position, a checkpoint) is written by the loop and never
inside the handler: a signal that arrives while a file is being written cannot leave it
truncated.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence
from typing import Any

from lit_amp._runtime import any_rank
from lit_amp._signals import SignalRecorder
from lit_amp._validation import check_bool, check_str
from lit_amp.callbacks._utils import is_rank_zero
from lit_amp.callbacks.base import Callback, RunContext
from lit_amp.serialization import load_checkpoint, save_checkpoint

__all__ = ["OnRequestExit", "StopOnSignal"]

log = logging.getLogger(__name__)

_UNCATCHABLE = {getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n)}


def _check_signal(owner: str, name: str, sig: Any) -> int:
    if isinstance(sig, bool) or not isinstance(sig, int):
        raise TypeError(
            f"For '{owner}', the argument '{name}' must be an int signal number, but got "
            f"{sig!r} of type {type(sig).__name__}."
        )
    if sig in _UNCATCHABLE:
        raise ValueError(
            f"For '{owner}', the argument '{name}' can't be {signal.Signals(sig).name}: it cannot "
            "be caught; use a catchable signal such as SIGTERM, SIGINT or SIGUSR1."
        )
    if sig not in signal.valid_signals():
        raise ValueError(
            f"For '{owner}', the argument '{name}' must be a valid signal number, but got {sig}."
        )
    return int(sig)


def _target(run_context: RunContext, *keys: str) -> Any:
    cb = run_context.original_args()
    for key in keys:
        if cb.get(key) is not None:
            return cb.get(key)
    return None


class StopOnSignal(Callback):
    """On one of ``signals``, finish the current step, agree across processes, and stop.

    At train (eval) begin it installs, for each signal, a handler that only records it in
    :attr:`received`, remembering the previous handler, which it puts back at train (eval)
    end. Installing at train begin displaces Lightning's own SIGTERM handler for the run;
    that one would end ``fit`` with ``SIGTERMException`` at the next step, before any backup
    of the position is written. Handlers can only be installed from the main thread;
    elsewhere a warning is logged and signals are not caught. A signal recorded before train
    begin (``received`` set by the caller) stops the run after its first step.

    Once a signal is recorded, ``request_stop`` is called at the next step end (or epoch end);
    under DDP the processes agree first (one all-reduce of the flag at every step end and
    epoch end), so a signal that reaches any of them stops all of them after the same step,
    and a ``BackupAndRestore`` backup of that position is consistent.

    Args:
        signals: the signal numbers to catch; SIGKILL and SIGSTOP cannot be caught.

    Attributes:
        received: the number of the signal that arrived (None: none).
        stopped_early: set at train end: training stopped before its last step because a
            signal arrived (False when it arrived during the last step: the run is complete).

    Raises:
        TypeError: ``signals`` is not a sequence of ints.
        ValueError: ``signals`` is empty or holds SIGKILL, SIGSTOP or an invalid number.

    Example:
        >>> import signal
        >>> cb = StopOnSignal([signal.SIGTERM, signal.SIGUSR2])
        >>> cb.signals == (signal.SIGTERM, signal.SIGUSR2), cb.received
        (True, None)
    """

    def __init__(self, signals: Sequence[int] = (signal.SIGTERM,)) -> None:
        super().__init__()
        owner = type(self).__name__
        if isinstance(signals, (str, bytes)) or not isinstance(signals, Sequence):
            raise TypeError(
                f"For '{owner}', the argument 'signals' must be a sequence of signal numbers, "
                f"but got {signals!r} of type {type(signals).__name__}."
            )
        if not signals:
            raise ValueError(f"For '{owner}', the argument 'signals' must not be empty.")
        self.signals = tuple(_check_signal(owner, "signals", s) for s in signals)
        self._recorder = SignalRecorder(self.signals, self._log_signal)
        self.stopped_early = False
        self._requested = False
        self._epoch_base = 0
        self._first_epoch = True

    @property
    def received(self) -> int | None:
        """The number of the signal that arrived (None: none)."""
        return self._recorder.received

    @received.setter
    def received(self, value: int | None) -> None:
        self._recorder.received = value

    def _log_signal(self, signum: int) -> None:
        log.debug("%s received signal %s.", type(self).__name__, signum)

    def _install(self) -> None:
        if not self._recorder.install():
            log.warning("%s: signal handlers can only be installed from the main thread; "
                        "signal(s) %s will not stop this run.", type(self).__name__,
                        list(self.signals))

    def _uninstall(self) -> None:
        self._recorder.restore()

    def _agree(self, run_context: RunContext) -> None:
        """Under DDP, stop everywhere if the signal reached any process; then request it."""
        cb = run_context.original_args()
        flag = self.received is not None
        if int(cb.get("device_number", 1) or 1) > 1:
            flag = any_rank(flag)
            if flag and self.received is None:
                self.received = self.signals[0]  # it reached another process
        if flag:
            self._requested = True
            run_context.request_stop()

    def on_train_begin(self, run_context: RunContext) -> None:
        """Install the signal handlers (displacing Lightning's SIGTERM handler for the run)."""
        self._install()
        self._requested = self.stopped_early = False
        self._first_epoch = True

    def on_train_epoch_begin(self, run_context: RunContext) -> None:
        """Remember where this epoch's steps start (a resumed first epoch counts its own)."""
        cb = run_context.original_args()
        self._epoch_base = 0 if self._first_epoch else int(cb.get("cur_step_num", 0) or 0)
        self._first_epoch = False

    def on_train_step_end(self, run_context: RunContext) -> None:
        """Request a stop if a signal arrived (here or, under DDP, at another process)."""
        self._agree(run_context)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        """Request a stop if a signal arrived (here or, under DDP, at another process)."""
        self._agree(run_context)

    def on_train_end(self, run_context: RunContext) -> None:
        """Put the previous handlers back; tell whether the signal cut training short."""
        self._uninstall()
        cb = run_context.original_args()
        last = int(cb.get("initial_epoch", 0) or 0) + int(cb.get("epoch_num", 0) or 0)
        batch_num = cb.get("batch_num")
        steps = int(cb.get("cur_step_num", 0) or 0) - self._epoch_base
        finished = int(cb.get("cur_epoch_num", 0) or 0) >= last and (
            bool(cb.get("dataset_sink_mode")) or not batch_num or steps >= int(batch_num))
        self.stopped_early = self._requested and not finished


class OnRequestExit(StopOnSignal):
    """On a signal (SIGTERM by default), finish the current step, stop, and save a checkpoint.

    A :class:`StopOnSignal` for one signal, plus MindSpore's files: at train begin, if
    ``{directory}/{file_name}_train.ckpt`` exists it is loaded into
    ``cb_params.train_network`` (resuming an interrupted run), unless a ``BackupAndRestore``
    is among the run's callbacks: that one then resumes the run exactly (weights, epoch,
    position within the epoch, random state), and a possibly older file of this callback must
    not replace its backup. At train end, if the signal arrived, ``{file_name}_train.ckpt`` is
    saved (the network, optimizer and loss-scale state, via :func:`lit_amp.save_checkpoint`).
    Evaluation mirrors this with ``{file_name}_eval.ckpt`` (loaded into ``cb_params.network``
    from the eval file, else the train file). Every train (eval) call starts with the flag
    cleared. Only global rank 0 writes files.

    ``save_mindir``: MindSpore also exports a MINDIR graph from the last batch. MINDIR has no
    PyTorch counterpart, so the flag is accepted and nothing more is written (an info message
    is logged once). Export a TorchScript or ONNX model yourself if you need a graph.

    Args:
        save_ckpt: save a checkpoint before exiting (and load one at begin if present).
        save_mindir: accepted for compatibility; see above.
        file_name: the checkpoint file name stem.
        directory: the folder of the files (created if missing).
        sig: the signal to catch; SIGKILL and SIGSTOP cannot be caught.

    Attributes:
        exit: whether the signal arrived (MindSpore's flag; settable).

    Raises:
        TypeError: a flag is not a bool; ``file_name`` or ``directory`` is not a str; ``sig`` is
            not an int.
        ValueError: ``sig`` is SIGKILL, SIGSTOP or not a valid signal number.

    Example:
        >>> import tempfile
        >>> cb = OnRequestExit(file_name="LeNet5", directory=tempfile.mkdtemp())
        >>> cb.train_file_path.endswith("LeNet5_train")
        True
    """

    def __init__(
        self,
        save_ckpt: bool = True,
        save_mindir: bool = True,
        file_name: str = "Net",
        directory: str | os.PathLike = "./",
        sig: int = signal.SIGTERM,
    ) -> None:
        owner = "OnRequestExit"
        sig = _check_signal(owner, "sig", sig)
        super().__init__((sig,))
        self.save_ckpt = check_bool(owner, "save_ckpt", save_ckpt)
        self.save_mindir = check_bool(owner, "save_mindir", save_mindir)
        check_str(owner, "file_name", file_name)
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(
                f"For '{owner}', the argument 'directory' must be a str path, but got "
                f"{directory!r} of type {type(directory).__name__}."
            )
        self.sig = sig
        directory = os.path.abspath(os.fspath(directory))
        if self.save_ckpt or self.save_mindir:
            os.makedirs(directory, exist_ok=True)
        self.train_file_path = os.path.join(directory, f"{file_name}_train")
        self.eval_file_path = os.path.join(directory, f"{file_name}_eval")
        self._mindir_logged = False

    @property
    def exit(self) -> bool:
        """Whether the signal arrived (MindSpore's ``exit`` flag)."""
        return self.received is not None

    @exit.setter
    def exit(self, value: bool) -> None:
        self.received = self.sig if value else None

    def _log_mindir(self) -> None:
        if self.save_mindir and not self._mindir_logged:
            log.info(
                "OnRequestExit: save_mindir=True has no PyTorch counterpart (MINDIR); no graph "
                "is exported, only the checkpoint is saved."
            )
            self._mindir_logged = True

    def _save(self, run_context: RunContext, path: str, *keys: str) -> None:
        cb = run_context.original_args()
        if self.save_ckpt and is_rank_zero(cb):
            save_checkpoint(_target(run_context, *keys), path)
        self._log_mindir()

    # train
    def on_train_begin(self, run_context: RunContext) -> None:
        """Install the signal handler; load ``{file_name}_train.ckpt`` if it exists."""
        self.exit = False
        super().on_train_begin(run_context)
        path = f"{self.train_file_path}.ckpt"
        if self.save_ckpt and os.path.isfile(path):
            cb = run_context.original_args()
            if any(type(c).__name__ == "BackupAndRestore" for c in cb.get("list_callback") or ()):
                # BackupAndRestore resumes the run (weights, epoch, position and random state);
                # this file may be older than its backup and would silently replace it
                log.info("OnRequestExit: BackupAndRestore resumes this run; %s is not loaded.",
                         path)
                return
            log.info("OnRequestExit: loading %s.", path)
            load_checkpoint(path, net=_target(run_context, "train_network", "network"))

    def on_train_end(self, run_context: RunContext) -> None:
        """Restore the previous handler; if the signal arrived, save ``{file_name}_train.ckpt``."""
        super().on_train_end(run_context)
        if self.exit:
            self._save(run_context, self.train_file_path, "train_network", "network")

    # eval
    def on_eval_begin(self, run_context: RunContext) -> None:
        """Install the signal handler; load the eval (else train) checkpoint if it exists."""
        self.exit = False
        self._install()
        if not self.save_ckpt:
            return
        target = _target(run_context, "network", "eval_network")
        for path in (f"{self.eval_file_path}.ckpt", f"{self.train_file_path}.ckpt"):
            if os.path.isfile(path):
                log.info("OnRequestExit: loading %s.", path)
                load_checkpoint(path, net=target)
                break

    def on_eval_step_end(self, run_context: RunContext) -> None:
        """Request a stop if the signal arrived."""
        if self.exit:
            run_context.request_stop()

    def on_eval_end(self, run_context: RunContext) -> None:
        """Restore the previous handler; if the signal arrived, save ``{file_name}_eval.ckpt``."""
        self._uninstall()
        if self.exit:
            self._save(run_context, self.eval_file_path, "network", "eval_network")
