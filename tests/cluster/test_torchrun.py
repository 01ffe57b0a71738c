"""torchrun across two "nodes" on one machine, against Lightning's own DDP launch (issue #29).

The tests start two torchrun agents (``--nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d``,
one worker process each, gloo on the CPU), as a two-node job would on a cluster:

- ``lit-amp trainer=ddp`` and ``examples/ddp_model.py`` (``Model.fit``) end with the same
  metrics and bit-identical weights as the same run launched by Lightning on 2 processes;
- one node's worker SIGKILLed mid-training: the other node's worker fails at its next
  collective with gloo's "Connection closed/reset by peer" within seconds, and both torchrun
  agents exit non-zero, naming the killed rank;
- with ``--max-restarts=1`` torchrun restarts the group, which resumes from the
  ``callbacks=fault_tolerant`` backup and ends with the uninterrupted run's weights;
- ``trainer.devices`` / ``trainer.num_nodes`` that do not match torchrun's world stop the run at
  once with one ``lit-amp:`` line naming the values to set.

The runs are tiny (synthetic MNIST-1D-shaped data, an MLP, 3 epochs of 5 steps per rank).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lit_amp.cli import ConfigError
from lit_amp.cli.launch import torchrun_trainer_kwargs
from tests.helpers.dist import free_port

ROOT = Path(__file__).resolve().parents[2]
LIT_AMP = Path(sys.executable).with_name("lit-amp")
# lit-amp as the user types it (the console script), else the same program as a module
ENTRY = ["--no-python", str(LIT_AMP)] if LIT_AMP.exists() else ["-m", "lit_amp"]
COMMAND = [str(LIT_AMP)] if LIT_AMP.exists() else [sys.executable, "-m", "lit_amp"]
# 3 epochs of 200 samples in batches of 20: 5 steps per rank and epoch with 2 ranks; the
# fault-tolerant callbacks back up every epoch
RUN = ["trainer=ddp", "trainer.accelerator=cpu", "epochs=3", "data=synthetic",
       "data.num_train=200", "data.num_valid=100", "data.batch_size=20", "model=mlp",
       "callbacks=fault_tolerant", "trainer.enable_progress_bar=false", "logger=none"]
KILL = ["+extra_trusted_targets=[tests.cluster.*]"]
# a run's wall time bound, generous: the slowest took ~55 s on a 2-core machine at load 10
TIMEOUT_S = 240

pytestmark = pytest.mark.torchrun


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    """This environment less any launcher's variables, lit_amp importable, runs under ``tmp``."""
    launcher = ("SLURM_", "TORCHELASTIC_", "PL_", "LIT_AMP_RUN_ID")
    dist = {"LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
            "MASTER_ADDR", "MASTER_PORT", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher) and k not in dist}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
            "LIT_AMP_LOG_DIR": str(tmp / "runs"), **extra}


def _descendants(pid: int) -> list[int]:
    """The pids below ``pid`` (torchrun starts its workers in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Job:
    """Processes started together (torchrun agents, or one launcher), output in log files."""

    def __init__(self, cmds: list[list[str]], cwd: Path, env: dict[str, str],
                 name: str = "node") -> None:
        self.logs = [cwd / f"{name}{i}.log" for i in range(len(cmds))]
        self.procs = []
        for cmd, log in zip(cmds, self.logs):
            with open(log, "w") as out:
                self.procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out,
                                                   stderr=subprocess.STDOUT))
        self.ended: list[float | None] = [None] * len(cmds)

    def wait(self, timeout: float = TIMEOUT_S) -> list[int]:
        """Wait for every process; return their exit statuses (kill all and fail on timeout)."""
        deadline = time.monotonic() + timeout
        while any(t is None for t in self.ended):
            for i, p in enumerate(self.procs):
                if self.ended[i] is None and p.poll() is not None:
                    self.ended[i] = time.time()
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"still running after {timeout} s:\n{self.tails()}")
            time.sleep(0.05)
        return [p.returncode for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            for pid in [*_descendants(p.pid), p.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()

    def text(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    def tails(self) -> str:
        return "\n".join(f"--- {log.name}\n{self.text(i)[-3000:]}"
                         for i, log in enumerate(self.logs))


def torchrun(args: list[str], cwd: Path, env: dict[str, str], *, nnodes: int = 2,
             max_restarts: int = 0, rdzv_id: str = "job") -> Job:
    """``nnodes`` torchrun agents of one process each, meeting at a c10d rendezvous."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
           "--nproc-per-node=1", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id={rdzv_id}",
           f"--max-restarts={max_restarts}", *args]
    return Job([cmd] * nnodes, cwd, env)


def _weights(ckpt: str | Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]


def _assert_same_weights(a: str | Path, b: str | Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    differ = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not differ, f"weights differ from the Lightning-launched run: {differ}"


def _result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


class Reference:
    """``lit-amp trainer=ddp trainer.devices=2`` (Lightning starts both processes), started at
    once so that it runs beside a torchrun job; :meth:`result` waits for it."""

    def __init__(self, tmp: Path) -> None:
        self.run_dir = tmp / "run"
        self.job = Job([[*COMMAND, *RUN, "trainer.devices=2", f"hydra.run.dir={self.run_dir}"]],
                       tmp, _env(tmp), name="lightning")

    def result(self) -> dict:
        assert self.job.wait() == [0], self.job.tails()
        return _result(self.run_dir)


@pytest.fixture(scope="module")
def lightning_ddp(tmp_path_factory) -> Reference:
    return Reference(tmp_path_factory.mktemp("lightning_ddp"))


def test_lit_amp_under_torchrun_equals_lightning_ddp(lightning_ddp: Reference,
                                                     tmp_path: Path) -> None:
    job = torchrun([*ENTRY, *RUN, "trainer.num_nodes=2"], tmp_path, _env(tmp_path),
                   rdzv_id="same")
    reference = lightning_ddp.result()
    assert job.wait() == [0, 0], job.tails()
    # both nodes wrote into one run directory, named after torchrun's --rdzv-id
    run_dir = tmp_path / "runs" / "train" / "torchrun-same"
    got = _result(run_dir)
    assert got["status"] == "ok"
    assert got["metrics"] == reference["metrics"]
    _assert_same_weights(got["latest_ckpt"], reference["latest_ckpt"])
    assert sorted(job.text(i).count("lit-amp train finished") for i in (0, 1)) == [0, 1]


def test_model_script_under_torchrun_equals_lightning_ddp(tmp_path: Path) -> None:
    script = [str(ROOT / "examples" / "ddp_model.py"), "--accelerator", "cpu", "--epochs", "2",
              "--data", "synthetic", "--train-samples", "400"]
    lightning = Job([[sys.executable, *script, "--devices", "2", "--out",
                      str(tmp_path / "lightning")]], tmp_path, _env(tmp_path), name="lightning")
    job = torchrun([*script, "--devices", "1", "--num-nodes", "2", "--out",
                    str(tmp_path / "torchrun")], tmp_path, _env(tmp_path))
    assert lightning.wait() == [0], lightning.tails()
    assert job.wait() == [0, 0], job.tails()
    a = json.loads((tmp_path / "lightning" / "metrics.json").read_text())
    b = json.loads((tmp_path / "torchrun" / "metrics.json").read_text())
    assert (a["num_nodes"], b["num_nodes"], a["world_size"], b["world_size"]) == (1, 2, 2, 2)
    assert {k: a[k] for k in ("acc", "loss")} == {k: b[k] for k in ("acc", "loss")}
    wa = torch.load(tmp_path / "lightning" / "final.pt", weights_only=True)
    wb = torch.load(tmp_path / "torchrun" / "final.pt", weights_only=True)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def _kill_rank1(tmp: Path) -> tuple[list[str], Path]:
    marker = tmp / "killed"
    node = (f"+callbacks.kill={{_target_: tests.cluster._kill_worker.KillWorker, rank: 1, "
            f"step: 7, marker: '{marker}'}}")
    return [node, *KILL], marker


def test_killed_worker_stops_the_other_node_with_a_clear_error(tmp_path: Path) -> None:
    kill, marker = _kill_rank1(tmp_path)  # rank 1 dies after step 7 (epoch 2 of 3)
    job = torchrun([*ENTRY, *RUN, "trainer.num_nodes=2", *kill], tmp_path, _env(tmp_path))
    codes = job.wait()
    assert marker.exists(), job.tails()
    killed_at = float(marker.read_text().split()[0])
    assert all(c != 0 for c in codes), job.tails()
    logs = [job.text(0), job.text(1)]
    victim = next(i for i in (0, 1) if "Signal 9 (SIGKILL)" in logs[i])
    survivor = logs[1 - victim]
    # the survivor's worker names the cause, and torchrun reports its failure
    assert "Connection closed by peer" in survivor or "Connection reset by peer" in survivor
    assert "FAILED" in survivor
    # bounded: the other node's torchrun ends seconds after the kill, not after a timeout
    assert job.ended[1 - victim] - killed_at < 30, job.ended[1 - victim] - killed_at
    # the epoch-1 backup is there for a restart, and no result was written
    run_dir = tmp_path / "runs" / "train" / "torchrun-job"
    assert (run_dir / "backup" / "backup.ckpt").is_file()
    assert not (run_dir / "result.json").exists()


def test_max_restarts_resumes_from_the_backup_to_the_same_weights(lightning_ddp: Reference,
                                                                  tmp_path: Path) -> None:
    kill, marker = _kill_rank1(tmp_path)
    env = _env(tmp_path, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")  # pytorch#135712
    job = torchrun([*ENTRY, *RUN, "trainer.num_nodes=2", *kill], tmp_path, env, max_restarts=1)
    assert job.wait() == [0, 0], job.tails()
    assert marker.exists(), "rank 1 was never killed"
    logs = job.text(0) + job.text(1)
    assert "exitcode: -9" in logs  # torchrun saw its worker die, and restarted the group
    assert logs.count("Restoring the backup") == 2, job.tails()  # both restarted workers
    got, reference = _result(tmp_path / "runs" / "train" / "torchrun-job"), lightning_ddp.result()
    assert got["status"] == "ok"
    assert got["metrics"] == reference["metrics"]
    _assert_same_weights(got["latest_ckpt"], reference["latest_ckpt"])


def test_devices_that_do_not_match_torchrun_stop_at_once(tmp_path: Path) -> None:
    job = torchrun([*ENTRY, *RUN, "trainer.num_nodes=2"], tmp_path, _env(tmp_path), nnodes=1)
    t0 = time.time()
    assert job.wait(timeout=120) == [1], job.tails()
    out = job.text(0)
    assert ("lit-amp: torchrun started 1 process(es), 1 per node on 1 node(s) "
            "(--nproc-per-node=1 --nnodes=1), but trainer.devices=1 trainer.num_nodes=2; "
            "set trainer.devices=1 trainer.num_nodes=1") in out, out[-3000:]
    assert "Traceback" not in out.split("lit-amp: torchrun started")[0][-2000:]
    assert time.time() - t0 < 120


def _torchrun_env(monkeypatch, local: int, world: int, restarts: int = 0) -> None:
    for k, v in {"TORCHELASTIC_RUN_ID": "x", "LOCAL_WORLD_SIZE": str(local),
                 "WORLD_SIZE": str(world), "RANK": "0", "TORCHELASTIC_MAX_RESTARTS": str(restarts),
                 "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():
        monkeypatch.setenv(k, v)


def test_trainer_kwargs_follow_torchrun_world(monkeypatch, caplog) -> None:
    kw = {"devices": 2, "num_nodes": 1}
    assert torchrun_trainer_kwargs(kw) is kw  # not under torchrun: untouched
    _torchrun_env(monkeypatch, local=2, world=4)
    assert torchrun_trainer_kwargs({"devices": "auto", "num_nodes": 2})["devices"] == 2
    assert torchrun_trainer_kwargs({"devices": [0, 1], "num_nodes": 2})["devices"] == [0, 1]
    assert torchrun_trainer_kwargs({"devices": "0,1", "num_nodes": 2})["devices"] == "0,1"
    for bad in ({"devices": 4, "num_nodes": 1}, {"devices": 1, "num_nodes": 4},
                {"devices": "auto", "num_nodes": 1}):
        with pytest.raises(ConfigError, match="set trainer.devices=2 trainer.num_nodes=2"):
            torchrun_trainer_kwargs(bad)
    with caplog.at_level(logging.WARNING):
        torchrun_trainer_kwargs({"devices": 2, "num_nodes": 2})
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in caplog.text  # no restarts, no warning
    _torchrun_env(monkeypatch, local=2, world=4, restarts=1)
    with caplog.at_level(logging.WARNING):
        torchrun_trainer_kwargs({"devices": 2, "num_nodes": 2})
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in caplog.text
