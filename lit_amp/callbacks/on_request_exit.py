"""MindSpore's ``OnRequestExit``: stop cleanly and save a checkpoint when a signal arrives."""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

from lit_amp._validation import check_bool, check_str
from lit_amp.callbacks._utils import any_rank, is_rank_zero
from lit_amp.callbacks.base import Callback, RunContext
from lit_amp.serialization import load_checkpoint, save_checkpoint

__all__ = ["OnRequestExit"]

log = logging.getLogger(__name__)

_UNCATCHABLE = {getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n)}


class OnRequestExit(Callback):
    """On a signal (SIGTERM by default), finish the current step, stop, and save a checkpoint.

    At train (eval) begin it installs a handler for ``sig`` that only sets a flag, remembering
    the previous handler, which it puts back at train (eval) end. Handlers can only be installed
    from the main thread; elsewhere a warning is logged and signals are not caught. At train
    begin, if ``{directory}/{file_name}_train.ckpt`` exists it is loaded into
    ``cb_params.train_network`` (resuming an interrupted run), unless a ``BackupAndRestore``
    is among the run's callbacks: that one then resumes the run exactly (weights, epoch,
    position within the epoch, random state), and a possibly older file of this callback must
    not replace its backup. Once flagged, ``request_stop`` is
    called at every step end and epoch end; at train end ``{file_name}_train.ckpt`` is saved (the
    network, optimizer and loss-scale state, via :func:`lit_amp.save_checkpoint`).
    Evaluation mirrors this with ``{file_name}_eval.ckpt`` (loaded into ``cb_params.network``
    from the eval file, else the train file). Only global rank 0 writes files.

    ``save_mindir``: MindSpore also exports a MINDIR graph from the last batch. MINDIR has no
    PyTorch counterpart, so the flag is accepted and nothing more is written (an info message
    is logged once). Export a TorchScript or ONNX model yourself if you need a graph.

    Under DDP the processes agree at every train step end and epoch end (one all-reduce of
    the flag): a signal that reaches any of them, at any step, stops all of them after the
    same step, so a ``BackupAndRestore`` backup of that position is consistent.

    Args:
        save_ckpt: save a checkpoint before exiting (and load one at begin if present).
        save_mindir: accepted for compatibility; see above.
        file_name: the checkpoint file name stem.
        directory: the folder of the files (created if missing).
        sig: the signal to catch; SIGKILL and SIGSTOP cannot be caught.

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
        super().__init__()
        owner = "OnRequestExit"
        self.save_ckpt = check_bool(owner, "save_ckpt", save_ckpt)
        self.save_mindir = check_bool(owner, "save_mindir", save_mindir)
        check_str(owner, "file_name", file_name)
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(
                f"For '{owner}', the argument 'directory' must be a str path, but got "
                f"{directory!r} of type {type(directory).__name__}."
            )
        if isinstance(sig, bool) or not isinstance(sig, int):
            raise TypeError(
                f"For '{owner}', the argument 'sig' must be an int signal number, but got "
                f"{sig!r} of type {type(sig).__name__}."
            )
        if sig in _UNCATCHABLE:
            raise ValueError(
                f"For '{owner}', the argument 'sig' can't be {signal.Signals(sig).name}: it cannot "
                "be caught; use a catchable signal such as SIGTERM, SIGINT or SIGUSR1."
            )
        if sig not in signal.valid_signals():
            raise ValueError(
                f"For '{owner}', the argument 'sig' must be a valid signal number, but got {sig}."
            )
        self.sig = int(sig)
        directory = os.path.abspath(os.fspath(directory))
        if self.save_ckpt or self.save_mindir:
            os.makedirs(directory, exist_ok=True)
        self.train_file_path = os.path.join(directory, f"{file_name}_train")
        self.eval_file_path = os.path.join(directory, f"{file_name}_eval")
        self.exit = False
        self._previous_handler: Any = None
        self._installed = False
        self._mindir_logged = False

    # signal handling
    def _handle_signal(self, signum: int, frame: FrameType | None) -> None:
        log.debug("OnRequestExit received signal %s.", signum)
        self.exit = True

    def _install(self) -> None:
        self.exit = False
        if self._installed:
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                "OnRequestExit: signal handlers can only be installed from the main thread; "
                "signal %s will not stop this run.",
                self.sig,
            )
            return
        self._previous_handler = signal.signal(self.sig, self._handle_signal)
        self._installed = True

    def _uninstall(self) -> None:
        if not self._installed:
            return
        previous = self._previous_handler
        signal.signal(self.sig, signal.SIG_DFL if previous is None else previous)
        self._installed = False
        self._previous_handler = None

    def _log_mindir(self) -> None:
        if self.save_mindir and not self._mindir_logged:
            log.info(
                "OnRequestExit: save_mindir=True has no PyTorch counterpart (MINDIR); no graph "
                "is exported, only the checkpoint is saved."
            )
            self._mindir_logged = True

    # train
    def on_train_begin(self, run_context: RunContext) -> None:
        """Install the signal handler; load ``{file_name}_train.ckpt`` if it exists."""
        self._install()
        path = f"{self.train_file_path}.ckpt"
        if self.save_ckpt and os.path.isfile(path):
            cb = run_context.original_args()
            if any(type(c).__name__ == "BackupAndRestore" for c in cb.get("list_callback") or ()):
                # BackupAndRestore resumes the run (weights, epoch, position and random state);
                # this file may be older than its backup and would silently replace it
                log.info("OnRequestExit: BackupAndRestore resumes this run; %s is not loaded.",
                         path)
                return
            target = cb.get("train_network")
            if target is None:
                target = cb.get("network")
            log.info("OnRequestExit: loading %s.", path)
            load_checkpoint(path, net=target)

    def _agree(self, run_context: RunContext) -> None:
        """Under DDP, stop everywhere if the signal reached any process; then request it."""
        cb = run_context.original_args()
        if int(cb.get("device_number", 1) or 1) > 1:
            self.exit = any_rank(self.exit)
        if self.exit:
            run_context.request_stop()

    def on_train_step_end(self, run_context: RunContext) -> None:
        """Request a stop if the signal arrived (here or, under DDP, at another process)."""
        self._agree(run_context)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        """Request a stop if the signal arrived (here or, under DDP, at another process)."""
        self._agree(run_context)

    def on_train_end(self, run_context: RunContext) -> None:
        """Restore the previous handler; if the signal arrived, save ``{file_name}_train.ckpt``."""
        self._uninstall()
        if not self.exit:
            return
        cb = run_context.original_args()
        target = cb.get("train_network")
        if target is None:
            target = cb.get("network")
        if self.save_ckpt and is_rank_zero(cb):
            save_checkpoint(target, self.train_file_path)
        self._log_mindir()

    # eval
    def on_eval_begin(self, run_context: RunContext) -> None:
        """Install the signal handler; load the eval (else train) checkpoint if it exists."""
        self._install()
        if not self.save_ckpt:
            return
        cb = run_context.original_args()
        target = cb.get("network")
        if target is None:
            target = cb.get("eval_network")
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
        if not self.exit:
            return
        cb = run_context.original_args()
        target = cb.get("network")
        if target is None:
            target = cb.get("eval_network")
        if self.save_ckpt and is_rank_zero(cb):
            save_checkpoint(target, self.eval_file_path)
        self._log_mindir()
