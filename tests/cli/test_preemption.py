"""The job side of ``hydra/launcher=slurm`` (``lit_amp.cli.preemption``) without a cluster:
SLURM's commands are stand-in scripts.

They run everywhere (no ``slurm`` marker): why a SIGTERM arrived, that Lightning's auto-requeue
is off under SLURM, and what a stop without a backup says.
"""

from __future__ import annotations

import signal

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment

from lit_amp.cli import preemption
from tests.cli._helpers import fake_command


@pytest.mark.parametrize("fields, restarts, cause", [
    ("JobState=COMPLETING Reason=TimeLimit Restarts=0", "", "time limit"),
    ("JobState=COMPLETING Reason=None Restarts=1", "", "requeue"),
    ("JobState=COMPLETING Reason=None Restarts=2", "1", "requeue"),
    ("JobState=COMPLETING Reason=None Restarts=1", "1", "cancel"),
])
def test_the_cause_of_a_sigterm_comes_from_scontrol(tmp_path, monkeypatch, fields, restarts,
                                                    cause):
    """SLURM counts a restart when it requeues (scontrol requeue, preemption); the time limit
    says TimeLimit; anything else is a cancel (scancel)."""
    fake_command(tmp_path, monkeypatch, "scontrol", f"JobId=7 JobName=x {fields} ExitCode=0:0")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", restarts)
    assert preemption.sigterm_cause() == cause


def test_under_slurm_lightnings_auto_requeue_is_off(monkeypatch):
    for var in ("SLURM_NTASKS", "SLURM_JOB_NAME"):
        monkeypatch.delenv(var, raising=False)
    assert preemption.trainer_kwargs({"devices": 2}) == {"devices": 2}  # not under SLURM
    for var, value in (("SLURM_NTASKS", "2"), ("SLURM_NTASKS_PER_NODE", "2"),
                       ("SLURM_JOB_NAME", "train")):
        monkeypatch.setenv(var, value)
    kw = preemption.trainer_kwargs({"devices": 2})
    (env,) = kw["plugins"]
    assert isinstance(env, SLURMEnvironment) and env.auto_requeue is False
    own = LightningEnvironment()
    assert preemption.trainer_kwargs({"plugins": [own]})["plugins"] == [own]  # yours is kept


def test_outside_a_launcher_job_nothing_is_added_or_raised():
    assert preemption.callbacks() == []
    preemption.check_stopped([])  # no SLURM signal handling active: a no-op


def test_a_stop_without_a_backup_says_the_job_trains_from_the_beginning(monkeypatch, capsys):
    job = preemption._Job(signal.SIGUSR2)
    job.stop = type("Stop", (), {"stopped_early": True, "received": signal.SIGTERM})()
    monkeypatch.setattr(preemption, "_job", job)
    with pytest.raises(preemption.Preempted) as info:
        preemption.check_stopped([])
    assert info.value.signum == signal.SIGTERM
    assert "starts training from the beginning" in capsys.readouterr().err
