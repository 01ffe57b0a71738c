"""The submit side of ``hydra/launcher=slurm`` (``lit_amp.cli.slurm``) without a cluster: SLURM's
commands are stand-in scripts.

They run everywhere (no ``slurm`` marker): what the checks before submission refuse and how the
jobs are watched. The job side is in tests/cli/test_preemption.py, the real cluster in
tests/cluster/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_amp.cli.schema import ConfigError
from lit_amp.cli.slurm import SlurmJobError, preflight, watch
from tests.cli._helpers import fake_command

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
    fake_command(tmp_path, monkeypatch, "sinfo", SINFO)
    with pytest.raises(ConfigError) as info:
        preflight(params)
    assert message in str(info.value)


def test_a_request_the_partition_holds_passes(tmp_path, monkeypatch):
    fake_command(tmp_path, monkeypatch, "sinfo", SINFO)
    preflight({"partition": "gpu", "nodes": 2, "tasks_per_node": 4, "gpus_per_node": 4,
               "cpus_per_task": 4})
    preflight({"tasks_per_node": 2})  # the default partition


@pytest.mark.parametrize("params, message", [
    # issue #48 (8): the signal's lead covers the whole limit: every start is signalled at once,
    # trains one step and is requeued until submitit gives up ("timed-out too many times")
    ({"timeout_min": 1, "signal_delay_s": 120},
     "hydra.launcher.signal_delay_s=120 is not shorter than hydra.launcher.timeout_min=1 "
     "(60 s)"),
    ({"timeout_min": 2, "signal_delay_s": 120}, "allowed: signal_delay_s < 120"),
    ({"timeout_min": 60, "signal_delay_s": -5}, "hydra.launcher.signal_delay_s=-5"),
    # issue #48 (9): SLURM reads --time=-1 (and 0) as no limit at all
    ({"timeout_min": -1, "signal_delay_s": 120},
     "hydra.launcher.timeout_min=-1 is not a time limit"),
    ({"timeout_min": 0, "signal_delay_s": 0}, "allowed: an int >= 1"),
    ({"timeout_min": "ten", "signal_delay_s": 0}, "hydra.launcher.timeout_min='ten'"),
])
def test_a_time_limit_slurm_cannot_keep_is_refused_before_submission(params, message,
                                                                     monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # refused before SLURM is asked anything
    with pytest.raises(ConfigError) as info:
        preflight({"tasks_per_node": 1, **params})
    assert message in str(info.value)


def test_a_signal_lead_shorter_than_the_limit_passes(tmp_path, monkeypatch):
    fake_command(tmp_path, monkeypatch, "sinfo", SINFO)
    preflight({"tasks_per_node": 1, "timeout_min": 1, "signal_delay_s": 0})  # tests/cluster's
    preflight({"tasks_per_node": 1, "timeout_min": 120, "signal_delay_s": 120})  # the defaults


def test_without_slurms_commands_the_launcher_says_where_to_run(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="run lit-amp -m on a SLURM login node"):
        preflight({"tasks_per_node": 1})


class _Job:
    """What :func:`lit_amp.cli.slurm.watch` reads of a submitit job."""

    def __init__(self, tmp_path: Path, job_id: str) -> None:
        self.job_id, self.num_tasks = job_id, 1
        self.paths = type("Paths", (), {"result_pickle": tmp_path / f"{job_id}_result.pkl",
                                        "stderr": tmp_path / f"{job_id}.err"})()


def test_a_pending_job_is_named_then_cancelled_after_max_pending_min(tmp_path, monkeypatch,
                                                                      capsys):
    fake_command(tmp_path, monkeypatch, "squeue", "12_0|PENDING|Resources\n12_1|RUNNING|None")
    fake_command(tmp_path, monkeypatch, "scancel", "")
    jobs = [_Job(tmp_path, "12_0"), _Job(tmp_path, "12_1")]
    with pytest.raises(SlurmJobError) as info:
        watch(jobs, max_pending_min=0.001, poll_s=0.02, notice_s=0.0)
    assert "SLURM job 12_0 stayed pending" in str(info.value)
    assert "reason: Resources" in str(info.value) and "job(s) 12_1 go on" in str(info.value)
    assert "SLURM job 12_0 pending for" in capsys.readouterr().err  # the notice came first


def test_a_job_gone_without_a_result_is_reported_with_its_state_and_log(tmp_path, monkeypatch):
    fake_command(tmp_path, monkeypatch, "squeue", "")
    fake_command(tmp_path, monkeypatch, "scontrol",
                 "JobId=13 JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0")
    done, gone = _Job(tmp_path, "13_1"), _Job(tmp_path, "13_0")
    done.paths.result_pickle.write_bytes(b"")
    with pytest.raises(SlurmJobError) as info:
        watch([done, gone], max_pending_min=None, poll_s=0.02, grace_s=0.1)
    assert "SLURM job 13_0 ended without a result (FAILED, reason NonZeroExitCode" in str(
        info.value) and str(gone.paths.stderr) in str(info.value)


def test_with_keep_going_a_job_gone_without_a_result_is_noted_and_the_others_waited_for(
        tmp_path, monkeypatch, capsys):
    """``continue_on_error``: the lost job does not end the watch; the job still running is
    waited for until its result appears (issue #48 item 10)."""
    import threading

    fake_command(tmp_path, monkeypatch, "squeue", "14_1|RUNNING|None")
    fake_command(tmp_path, monkeypatch, "scontrol",
                 "JobId=14 JobState=FAILED Reason=NonZeroExitCode ExitCode=0:9")
    gone, running = _Job(tmp_path, "14_0"), _Job(tmp_path, "14_1")
    threading.Timer(0.5, running.paths.result_pickle.write_bytes, (b"",)).start()
    lost = watch([gone, running], max_pending_min=None, poll_s=0.02, grace_s=0.1,
                 keep_going=True)
    assert running.paths.result_pickle.exists()  # watched until its result
    assert list(lost) == ["14_0"]
    assert "ended without a result (FAILED, reason NonZeroExitCode, exit code 0:9)" in lost["14_0"]
    assert "the sweep goes on (waiting for job(s) 14_1)" in capsys.readouterr().err


def test_the_batch_script_forwards_submitits_signal_to_srun(tmp_path):
    """``scancel --signal=USR2 --batch`` signals the batch shell only: with the launcher's setup
    lines the shell survives it and passes it to ``srun`` (here a stand-in that records it),
    whose exit status the script keeps."""
    import signal
    import subprocess
    import time

    from lit_amp.cli.slurm import forward_signal_setup

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text(
        f"#!/bin/bash\ntrap 'echo got USR2 > {tmp_path}/got; exit 7' USR2\n"
        f"touch {tmp_path}/started\nwhile :; do sleep 0.05; done\n")
    (fake / "srun").chmod(0o755)
    script = tmp_path / "batch.sh"
    script.write_text("#!/bin/bash\n" + "\n".join(forward_signal_setup("USR2"))
                      + "\nsrun --unbuffered python -c pass\necho \"srun exit $?\"\n")
    env = {"PATH": f"{fake}:/usr/bin:/bin"}
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 10
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR2)  # the batch shell only, as scancel --batch does
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and out.strip() == "srun exit 7"
    assert (tmp_path / "got").read_text().strip() == "got USR2"
