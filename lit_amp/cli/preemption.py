"""The job side of ``hydra/launcher=slurm``: a SLURM signal stops training after the step in
progress, the loop writes the backup, then the job is requeued or ends.

submitit owns the signal and the requeue (Lightning's auto-requeue is off:
:func:`trainer_kwargs`). Both would act inside the signal handler, mid-step; here
:func:`run_task` replaces submitit's handlers with a recorder, the run's ``StopOnSignal``
(:func:`callbacks`) stops every rank after the same step, a ``BackupAndRestore`` writes the
position, :func:`check_stopped` skips evaluation and ``result.json``, and the task hands over
to submitit's handler (requeue) or ends; a job whose ``result.json`` says ``ok`` is not trained
again. Cases and tests: docs/clusters.md, "Preemption, requeue and the time limit".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from lit_amp._signals import SignalRecorder

__all__ = ["Preempted", "callbacks", "check_stopped", "run_task", "sigterm_cause",
           "trainer_kwargs"]


class Preempted(BaseException):
    """Training stopped early for a SLURM signal: no evaluation, no ``result.json``.

    A ``BaseException`` so that neither a sweep's ``continue_on_error`` nor Hydra records it
    as a failed job: :func:`run_task` hands the job over to submitit or SLURM.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Job:
    """This process's SLURM task: the signals it defers and what arrived."""

    def __init__(self, requeue_signal: int) -> None:
        self.requeue_signal = requeue_signal
        self.signals = SignalRecorder((requeue_signal, signal.SIGTERM), self._forward)
        self.stop: Any = None  # the run's StopOnSignal

    @property
    def received(self) -> int | None:
        """The signal that arrived (None: none)."""
        return self.signals.received

    def _forward(self, signum: int) -> None:
        if self.stop is not None and self.stop.received is None:
            self.stop.received = signum


_job: _Job | None = None


def restart_count() -> int:
    """How many times SLURM has started this job before (``SLURM_RESTART_COUNT``)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def job_id() -> str:
    """This job's id as ``squeue`` shows it (``<array job>_<task>`` in a job array)."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array:
        return f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID')}"
    return os.environ.get("SLURM_JOB_ID", "?")


def callbacks() -> list:
    """The run's extra callbacks inside a launcher job: one ``StopOnSignal`` (else none)."""
    if _job is None:
        return []
    from lit_amp.callbacks.on_request_exit import StopOnSignal

    stop = StopOnSignal((_job.requeue_signal, signal.SIGTERM))
    stop.received = _job.received  # a signal before training stops it after its first step
    _job.stop = stop
    return [stop]


def trainer_kwargs(kw: dict) -> dict:
    """Under SLURM, ``kw`` with Lightning's ``SLURMEnvironment(auto_requeue=False)`` added
    (unless a cluster environment is given): submitit, not Lightning, requeues."""
    from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment

    if not SLURMEnvironment.detect():
        return kw
    plugins = kw.get("plugins") or []
    plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if any(isinstance(p, ClusterEnvironment) for p in plugins):
        return kw
    return {**kw, "plugins": [*plugins, SLURMEnvironment(auto_requeue=False)]}


def check_stopped(run_callbacks: list) -> None:
    """Right after training: raise :class:`Preempted` if a signal cut it short.

    Raises:
        Preempted: training stopped before its last step because a SLURM signal arrived.
    """
    stop = _job.stop if _job is not None else None
    if stop is None or not stop.stopped_early:
        return
    if not any(type(cb).__name__ == "BackupAndRestore" for cb in run_callbacks):
        print(f"lit-amp: SLURM job {job_id()}: no BackupAndRestore among the callbacks, so the "
              "job starts training from the beginning when it comes back; use "
              "callbacks=fault_tolerant.", file=sys.stderr, flush=True)
    raise Preempted(int(stop.received))


def sigterm_cause() -> str:
    """Why this job got SIGTERM: ``'time limit'``, ``'requeue'`` (``scontrol requeue`` or a
    preemption: SLURM counted a restart) or ``'cancel'`` (anything else, ``scancel``)."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", os.environ["SLURM_JOB_ID"]],
                             capture_output=True, text=True, timeout=30).stdout
    except (KeyError, OSError, subprocess.TimeoutExpired):
        return "cancel"
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    if fields.get("Reason") == "TimeLimit" or fields.get("JobState") == "TIMEOUT":
        return "time limit"
    restarts = fields.get("Restarts", "0")
    return "requeue" if restarts.isdigit() and int(restarts) > restart_count() else "cancel"


def _hand_over(job: _Job, signum: int) -> None:
    """After a stop at a step boundary: let submitit requeue, or end the task."""
    name = signal.Signals(signum).name
    cause = "submitit's pre-time-limit signal" if signum == job.requeue_signal else None
    if cause is None:
        cause = {"time limit": "its time limit", "requeue": "scontrol requeue or a preemption",
                 "cancel": "scancel"}[sigterm_cause()]
    requeue = cause in ("its time limit", "submitit's pre-time-limit signal")
    then = ("submitit requeues it" if requeue else
            "SLURM starts it again" if cause.startswith("scontrol") else "it is not requeued")
    print(f"lit-amp: SLURM job {job_id()} (start {restart_count() + 1}): {name} ({cause}) "
          f"stopped training after the step in progress; the backup holds the position and "
          f"{then}.", file=sys.stderr, flush=True)
    code, handler = 128 + signum, job.signals.previous(job.requeue_signal)
    if requeue and callable(handler):
        try:
            handler(signum, None)  # global rank 0: dump the submission, requeue, exit
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
    _exit(code)


def _exit(code: int) -> None:
    """End the task now: the exit handlers run and the output is flushed, but the thousands of
    modules torch and Lightning imported are not torn down one by one (seconds that the
    requeued job would wait)."""
    import atexit
    import logging

    try:
        atexit._run_exitfuncs()
        logging.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def run_task(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run one SLURM task of a launcher job (``call``: the launcher's own ``__call__``).

    Training stopped by a signal ends the process here (no result is written): submitit
    requeued the job, SLURM starts it again, or it was cancelled.
    """
    global _job
    import submitit

    from lit_amp.cli import sweep_state

    job = _Job(getattr(signal, "SIG" + submitit.JobEnvironment.USR_SIG))
    job.signals.install()  # a SLURM task runs its launcher call in the main thread
    _job = job
    sweep_state.resume_active = restart_count() > 0  # a finished job is not trained again
    try:
        return call(*args, **kwargs)
    except Preempted as stop:
        _hand_over(job, stop.signum)
    finally:
        _job = None
        sweep_state.resume_active = False
        job.signals.restore()
