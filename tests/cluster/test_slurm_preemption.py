"""Preemption, requeue and the time limit on a real SLURM cluster, through the launcher.

Three jobs of one sweep train the same thing (``callbacks=fault_tolerant``): job 0 gets
``scontrol requeue``, job 1 ``scancel --signal=USR2`` (the signal submitit asks SLURM to send
before the time limit), job 2 nothing. A fourth job meets its 2-minute time limit. Each
interrupted job must come back in its own directory, resume mid-epoch from its backup, train
every remaining sample exactly once, and end with job 2's parameters bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.cluster import probe
from tests.cluster.campaign import params, results, steps

pytestmark = pytest.mark.slurm

TIMEOUT_S = 600  # a cap: the time-limit job takes 2 starts of up to 2 minutes each


def _sweep(part: Any) -> Path:
    rc, out = part.wait(TIMEOUT_S)
    assert rc == 0 and not part.errors, (part.errors, out[-3000:])
    return part.dir / "sweep"


def _task_logs(sweep: Path, job: str) -> str:
    return "".join(p.read_text() for p in (sweep / ".submitit").glob(f"{job}/*_log.*"))


def _starts(records: dict[int, list[dict]]) -> set[int]:
    return {r["start"] for rank in records.values() for r in rank}


def _same_as_reference(job_dir: Path, reference: Path, mid_epoch: bool = True,
                       restarts_stopped: bool = False) -> None:
    """Two starts, the first stopped before the end (in the middle of an epoch); together they
    trained exactly the reference's samples in its order on each rank, and ended with its
    parameters.

    ``restarts_stopped``: a later start may be stopped too (a time limit applies to every start:
    on a loaded machine a start-up can take the whole minute); every start then resumes where
    the one before it stopped, and the last one finishes.
    """
    records, ref = probe.read(job_dir / "probe"), probe.read(reference / "probe")
    starts = _starts(records)
    if restarts_stopped:
        assert len(starts) >= 2 and starts == set(range(len(starts)))
    else:
        assert starts == {0, 1}
    for rank in (0, 1):
        first = steps(records[rank], 0)
        assert 0 < len(first) < 12 and (len(first) % 6 != 0 or not mid_epoch)
        trained = [r["ids"] for n in sorted(starts) for r in steps(records[rank], n)]
        assert trained == [r["ids"] for r in steps(ref[rank])]
    a, b = params(job_dir), params(reference)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_scontrol_requeue_resumes_mid_epoch_in_its_directory_bit_identical(faults):
    sweep = _sweep(faults)
    assert sorted(p.name for p in sweep.iterdir() if p.name.isdigit()) == ["0", "1", "2"]
    _same_as_reference(sweep / "0", sweep / "2")
    assert results(sweep)[0]["status"] == "ok"
    job = probe.read(sweep / "0" / "probe")[0][0]["job"]
    assert "SIGTERM (scontrol requeue or a preemption) stopped training" in _task_logs(sweep, job)


def test_the_launchers_signal_stops_at_a_step_and_submitit_requeues(faults):
    sweep = _sweep(faults)
    _same_as_reference(sweep / "1", sweep / "2")
    job = probe.read(sweep / "1" / "probe")[0][0]["job"]
    logs = _task_logs(sweep, job)
    assert "SIGUSR2 (submitit's pre-time-limit signal) stopped training" in logs
    assert "Caught signal SIGUSR2" in logs and "preempted" in logs  # submitit's handler ran


def test_only_the_signalled_jobs_are_requeued(faults):
    sweep = _sweep(faults)
    assert _starts(probe.read(sweep / "2" / "probe")) == {0}  # the reference ran once
    assert [results(sweep)[n]["status"] for n in (0, 1, 2)] == ["ok"] * 3


def test_lightning_auto_requeue_is_off_and_submitit_owns_the_signal(faults):
    """Lightning's SLURMEnvironment runs with auto_requeue=False: no SIGUSR1 handler during
    training and no hpc_ckpt files; the requeues above went through submitit only."""
    sweep = _sweep(faults)
    for job in ("0", "1", "2"):
        for rank in probe.read(sweep / job / "probe").values():
            for start in (r for r in rank if r["kind"] == "start"):
                assert (start["cluster_env"], start["auto_requeue"]) == ("SLURMEnvironment",
                                                                          False)
                assert start["sigusr1"] == "0"  # SIG_DFL: Lightning installed no handler
    assert not list(sweep.rglob("hpc_ckpt*"))


def test_requeue_to_resumed_training_is_timed(faults):
    """Seconds from the ``scontrol requeue`` command to the first step of the job's next start
    (the cluster waits cred_expire=5 s before it starts a requeued job again)."""
    sweep = _sweep(faults)
    first = min(r["t"] for r in steps(probe.read(sweep / "0" / "probe")[0], 1))
    took = first - faults.stamps["requeue"]
    print(f"\nrequeue -> resumed training: {took:.1f} s")
    assert 0 < took < 180


def test_a_job_killed_at_its_time_limit_is_requeued_and_resumes(time_limit, faults):
    tl, ref = _sweep(time_limit), _sweep(faults) / "2"
    # where it stops depends on start-up, and so does whether the next start-up fits the limit
    _same_as_reference(tl / "0", ref, mid_epoch=False, restarts_stopped=True)
    job = probe.read(tl / "0" / "probe")[0][0]["job"]
    logs = _task_logs(tl, job)
    assert "SIGTERM (its time limit) stopped training" in logs
    assert "this job is timed-out" in logs  # submitit counted a time-out, then requeued
