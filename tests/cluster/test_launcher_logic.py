"""The SLURM launcher's decisions without a cluster: SLURM's commands are stand-in scripts.

They run everywhere (no ``slurm`` marker): what the checks before submission refuse, why a
SIGTERM arrived, and that Lightning's auto-requeue is off under SLURM.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment

from lit_amp.cli import preemption
from lit_amp.cli.schema import ConfigError
from lit_amp.cli.slurm import preflight


def _fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, output: str) -> None:
    """A ``name`` command on the PATH that prints ``output``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


#: ``sinfo -h -N -o %P|%c|%G`` of a cluster with a 2-CPU CPU partition and a 4-GPU partition
SINFO = "cpu*|2|(null)\ngpu|16|gpu:a100:4(S:0-1)\ngpu|16|gpu:a100:4(S:0-1)"


@pytest.mark.parametrize("params, message", [
    ({"partition": "nope", "tasks_per_node": 2},
     "hydra.launcher.partition='nope' is not a partition of this cluster; allowed: cpu, gpu"),
    ({"tasks_per_node": 3},
     "partition 'cpu' have at most 2; allowed: trainer.devices <= 2 with cpus_per_task=1"),
    ({"partition": "gpu", "tasks_per_node": 4, "cpus_per_task": 8},
     "32 CPUs, but the nodes of partition 'gpu' have at most 16"),
    ({"tasks_per_node": 1, "gpus_per_node": 1},
     "have at most 0; allowed: trainer.devices <= 0, or trainer.accelerator=cpu"),
    ({"partition": "gpu", "tasks_per_node": 8, "gpus_per_node": 8, "cpus_per_task": 2},
     "asks for 8 GPUs per node"),
    ({"partition": "gpu", "nodes": 3, "tasks_per_node": 1},
     "partition 'gpu' has 2; allowed: trainer.num_nodes <= 2"),
])
def test_a_request_the_partition_cannot_hold_is_refused_before_submission(
    tmp_path, monkeypatch, params, message,
):
    _fake(tmp_path, monkeypatch, "sinfo", SINFO)
    with pytest.raises(ConfigError) as info:
        preflight(params)
    assert message in str(info.value)


def test_a_request_the_partition_holds_passes(tmp_path, monkeypatch):
    _fake(tmp_path, monkeypatch, "sinfo", SINFO)
    preflight({"partition": "gpu", "nodes": 2, "tasks_per_node": 4, "gpus_per_node": 4,
               "cpus_per_task": 4})
    preflight({"tasks_per_node": 2})  # the default partition


def test_without_slurms_commands_the_launcher_says_where_to_run(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="run lit-amp -m on a SLURM login node"):
        preflight({"tasks_per_node": 1})


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
    _fake(tmp_path, monkeypatch, "scontrol", f"JobId=7 JobName=x {fields} ExitCode=0:0")
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
