"""A SLURM job of a sweep that ends without a result, and submitit's signal sent to the batch
shell only (``lost_job``: three jobs of the same training, ``callbacks=fault_tolerant``).

Job 0's training processes are SIGKILLed after 2 steps (both ranks, as the OOM killer or a
lost node would): its SLURM job ends without a result. With ``continue_on_error`` (the
default) the sweep must still wait for jobs 1 and 2, record job 0 as failed with SLURM's
reason, write ``summary.md`` and exit with status 1 (a failed job), not stop at the lost job
(issue #48 item 10). Job 1 gets ``scancel --signal=USR2 --batch`` after 2 steps: it must be
requeued and resume as with ``scancel --signal=USR2``, not end (item 11). Job 2 is left alone
(the reference).
"""

from __future__ import annotations

import json

import pytest

from tests.cluster import probe
from tests.cluster.campaign import results
from tests.cluster.test_slurm_preemption import _same_as_reference, _task_logs

pytestmark = pytest.mark.slurm

TIMEOUT_S = 400


def test_a_killed_job_is_recorded_failed_and_the_sweep_waits_for_the_others(lost_job):
    rc, out = lost_job.wait(TIMEOUT_S)
    assert not lost_job.errors, (lost_job.errors, out[-3000:])
    sweep = lost_job.dir / "sweep"
    res = results(sweep)
    assert rc == 1, out[-3000:]  # continue_on_error's rule: a failed job, exit status 1
    assert [res[n]["status"] for n in (0, 1, 2)] == ["failed", "ok", "ok"], out[-3000:]
    job = probe.read(sweep / "0" / "probe")[0][0]["job"]
    error = res[0]["error"]
    assert f"SLURM job {job} ended without a result (FAILED" in error, error
    assert "its log says: srun: error:" in error and "Killed" in error, error
    assert res[0]["slurm_job_id"] == job
    summary = (sweep / "summary.md").read_text()
    assert "1 of 3 jobs FAILED: 0" in summary and f"failed: SLURM job {job} ended" in summary
    states = [row["state"] for row in json.loads((sweep / "summary.json").read_text())]
    assert states == ["failed", "done", "done"]  # summarized after jobs 1 and 2 ended
    assert f"SLURM job {job} ended without a result" in out and "the sweep goes on" in out
    assert "1 of the sweep's jobs failed: job(s) 0" in out
    assert "Traceback" not in out


def test_scancel_usr2_batch_requeues_like_the_launchers_signal(lost_job):
    lost_job.wait(TIMEOUT_S)
    assert not lost_job.errors, lost_job.errors
    sweep = lost_job.dir / "sweep"
    _same_as_reference(sweep / "1", sweep / "2")
    job = probe.read(sweep / "1" / "probe")[0][0]["job"]
    logs = _task_logs(sweep, job)
    assert "SIGUSR2 (submitit's pre-time-limit signal) stopped training" in logs
    assert "Caught signal SIGUSR2" in logs and "preempted" in logs  # submitit's handler ran
    assert results(sweep)[1]["status"] == "ok"
