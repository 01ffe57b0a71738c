"""Console output of ``lit-amp`` runs: piped output without redraws, the run in its log file.

- :func:`piped`: when standard output is not a terminal (``lit-amp ... | tee``, CI logs,
  SLURM's ``slurm-<id>.out``), Lightning's progress bar would write a carriage-return redraw
  per step; ``lit-amp`` turns it off there and adds :class:`EpochLine` (one line per epoch).
- :func:`quiet_warnings`: the one home of the warnings ``lit-amp`` does not show (Lightning's
  advice that does not apply to a ``lit-amp`` run).
- :func:`console_to_log`: MindSpore-style monitors (``LossMonitor``, ``TimeMonitor``) and the
  result table ``print``; within the block every printed line also goes to Hydra's per-run
  log file (``<run dir>/lit_amp.log``) through the ``lit_amp.console`` logger, so the file
  holds the whole run. The terminal output is unchanged.

Example:
    >>> import io
    >>> piped(io.StringIO())
    True
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import IO, Any

import lightning as L

__all__ = ["EpochLine", "console_to_log", "piped", "quiet_warnings"]

log = logging.getLogger("lit_amp.console")


def piped(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (standard output by default) is not an interactive terminal.

    Args:
        stream: the stream to test.

    Returns:
        True for a pipe, a file or a captured stream.
    """
    stream = sys.stdout if stream is None else stream
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return True


def quiet_warnings() -> None:
    """Hide the warnings of Lightning that do not apply to a ``lit-amp`` run (process-wide).

    ``lit-amp`` calls it before each job (the DDP worker processes Lightning starts run the
    command again, so they call it too). Hidden:

    - ThroughputMonitor's note that the module defines no FLOPs: lit_amp's LitModel defines
      none, and the monitor logs samples per second, which is what ``result.json`` reports;
    - "The `srun` command is available on your system but is not used", which Lightning
      repeats for every Trainer (5 times a run) wherever SLURM is installed: outside a SLURM
      job (no ``SLURM_JOB_ID``) the process is not meant to run under ``srun`` (``lit-amp``'s
      SLURM launcher starts its jobs with ``srun``); inside a job that did not use ``srun``,
      where the hint may be right, it is shown once.

    (The Model API's own filters -- data-loader hints, the ``sync_dist`` advice -- live in
    :func:`lit_amp.model.model.quiet_lightning`, around every Trainer call of ``Model``.)

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     quiet_warnings()
        ...     warnings.warn("When using the `ThroughputMonitor`, ...")
        >>> seen
        []
    """
    warnings.filterwarnings("ignore", message="When using the `ThroughputMonitor`")
    warnings.filterwarnings("once" if os.environ.get("SLURM_JOB_ID") else "ignore",
                            message="The `srun` command is available on your system but is not "
                                    "used")


def _fmt(v: Any) -> str:
    try:
        return f"{float(v):.4f}"
    except (TypeError, ValueError):
        return str(v)


class EpochLine(L.Callback):
    """One line per training epoch (instead of a progress bar's redraws), on rank 0.

    ``epoch 3/30: train/loss 0.4102, val/acc 0.8840, val/eval_loss 0.3891`` — the epoch counts from
    ``initial_epoch`` (a resumed run continues its numbering) and the values are what the
    LitModel logged, less those another line of the epoch already printed (``leave_out``).

    Args:
        epochs: the final epoch number (MindSpore's ``epoch``).
        initial_epoch: epochs done before this run (replaced at the start of training by the
            LitModel's ``epoch_offset``, which counts a restored backup).
        print_lines: print the lines (False: only track the initial epoch).
        leave_out: prefixes of logged names not to print: ``("val/",)`` where MindSpore's
            ``LossMonitor`` prints each validated epoch's metrics (``Eval result: ...``).

    Example:
        >>> EpochLine(30).epochs
        30
    """

    def __init__(self, epochs: int, initial_epoch: int = 0, print_lines: bool = True,
                 leave_out: tuple[str, ...] = ()) -> None:
        self.epochs = int(epochs)
        self.initial_epoch = int(initial_epoch)
        self.print_lines = print_lines
        self.leave_out = tuple(leave_out)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Take the epoch the run really starts from: a BackupAndRestore backup may move it."""
        self.initial_epoch = int(getattr(pl_module, "epoch_offset", self.initial_epoch))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Print the epoch's line (after validation, when the epoch ran one)."""
        if not self.print_lines or trainer.global_rank != 0 or trainer.sanity_checking:
            return
        metrics = {k: v for k, v in trainer.callback_metrics.items()
                   if k.startswith(("train/", "val/")) and "samples_per_sec" not in k
                   and not (self.leave_out and k.startswith(self.leave_out))
                   and getattr(v, "numel", lambda: 1)() == 1}
        epoch = self.initial_epoch + trainer.current_epoch + 1
        values = ", ".join(f"{k} {_fmt(v)}" for k, v in sorted(metrics.items()))
        print(f"epoch {epoch}/{self.epochs}" + (f": {values}" if values else ""), flush=True)


class _Tee:
    """A text stream writing to ``stream`` and, line by line, to the ``lit_amp.console`` log."""

    def __init__(self, stream: IO[str], logger: logging.Logger) -> None:
        self._stream = stream
        self._logger = logger
        self._pending = ""

    def write(self, text: str) -> int:
        self._stream.write(text)
        self._pending += text.replace("\r", "\n")
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if line.strip():
                self._logger.info(line)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def console_to_log() -> Iterator[None]:
    """Copy what the run prints into Hydra's per-run log file (see the module docstring).

    Without a Hydra file handler on the root logger (a plain ``compose``), nothing changes.
    """
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    if not files:
        yield
        return
    console = logging.getLogger("lit_amp.console.stdout")
    saved = (console.handlers[:], console.propagate, console.level)
    console.handlers[:] = files  # the file only: Hydra's console handler already shows it
    console.propagate = False
    console.setLevel(logging.INFO)
    out = sys.stdout
    sys.stdout = _Tee(out, console)
    try:
        yield
    finally:
        sys.stdout = out
        console.handlers[:], console.propagate, console.level = saved
