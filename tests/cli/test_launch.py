"""DDP inside ``lit-amp`` runs and sweeps (``lit_amp.cli.launch``): the worker command, the
job's own run directory, identical weights on both ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_amp.cli import main
from lit_amp.cli.launch import config_flags, hydra_subprocess_cmd

ROOT = Path(__file__).resolve().parents[2]


def test_config_flags_are_kept_for_ddp_workers():
    argv = ["-cn", "x", "--config-dir=/c", "amp=O2", "--config-path", "p"]
    assert config_flags(argv) == ["-cn", "x", "--config-dir=/c", "--config-path", "p"]


def test_ddp_worker_command_uses_the_job_dir(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from hydra.core import hydra_config

    hc = SimpleNamespace(
        overrides=SimpleNamespace(task=["amp=O2", "trainer=ddp"],
                                  hydra=["hydra.sweep.dir=/x", "hydra.job.chdir=false"]),
        runtime=SimpleNamespace(output_dir=str(tmp_path / "3"), cwd=str(tmp_path)),
        job=SimpleNamespace(name="lit_amp"),
    )
    monkeypatch.setattr(hydra_config.HydraConfig, "get", staticmethod(lambda: hc))
    monkeypatch.setattr(sys, "argv", ["lit-amp", "-m", "amp=O0,O2", "trainer=ddp"])
    cmd, cwd = hydra_subprocess_cmd(1)
    assert cwd == str(tmp_path)
    assert "-m" not in cmd[2:] or cmd[1] == "-m"  # no multirun flag for the worker
    assert "amp=O2" in cmd and "amp=O0,O2" not in cmd
    assert f'hydra.run.dir="{tmp_path / "3"}"' in cmd and "hydra.mode=RUN" in cmd
    assert "hydra.job.chdir=false" in cmd and "hydra.sweep.dir=/x" not in cmd


@pytest.mark.slow
def test_multirun_sweep_with_the_ddp_script_launcher(tmp_path):
    """trainer=ddp (Lightning's script launcher re-running the command) inside a -m sweep over
    every AMP level: each job launches its own second process in its own run dir, both ranks end
    identical, and no job inherits the previous job's process group or environment."""
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable, "-m", "lit_amp", "-m", "amp=O0,O1,O2,O3", "trainer=ddp",
        "trainer.accelerator=cpu", "trainer.devices=2", "trainer.sync_batchnorm=false",
        "data=synthetic", "data.num_train=200", "data.num_valid=100", "epochs=1",
        "valid_frequency=null", "callbacks=minimal", "trainer.enable_progress_bar=false",
        "+callbacks.digest._target_=tests.cli._helpers.WeightDigest",
        "extra_trusted_targets=[tests.*]",
        "+callbacks.digest.out=${hydra:runtime.output_dir}",
        f"hydra.sweep.dir={sweep}",
    ]
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "NODE_RANK")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((sweep / str(i) / "result.json").read_text()) for i in range(4)]
    assert [r["amp"] for r in results] == ["O0", "O1", "O2", "O3"]
    assert all(r["status"] == "ok" for r in results)
    for i in range(4):
        ranks = [json.loads((sweep / str(i) / f"weights_rank{r}.json").read_text())
                 for r in (0, 1)]
        assert [r["world"] for r in ranks] == [2, 2]
        assert ranks[0]["weights"] == ranks[1]["weights"]
    summary = (sweep / "summary.md").read_text()
    assert "| 0 | O0 | done |" in summary and "| 3 | O3 | done |" in summary
    # the workers ran the job's own overrides in the job's dir, not the whole sweep again
    assert not (sweep / "0" / "0").exists() and not (tmp_path / "multirun").exists()
    # the checkpoint rank 0 wrote under DDP reloads in a single process, same accuracy
    again = main(["mode=eval", f"ckpt_path={results[2]['latest_ckpt']}", "amp=O2",
                  "data=synthetic", "data.num_train=200", "data.num_valid=100",
                  "trainer.enable_progress_bar=false", f"hydra.run.dir={tmp_path / 'eval'}"])
    assert again == pytest.approx(results[2]["value"])


@pytest.mark.slow
def test_ddp_sim_two_processes_end_with_identical_weights(tmp_path):
    """trainer=ddp_sim: two CPU processes (the command re-run by Lightning), one run directory,
    identical weights on both ranks, one result.json."""
    cmd = [
        sys.executable, "-m", "lit_amp", "trainer=ddp_sim", "amp=O2", "data=synthetic",
        "data.num_train=200", "data.num_valid=100", "epochs=1", "valid_frequency=1",
        "callbacks=minimal", "logger=none",
        "+callbacks.digest._target_=tests.cli._helpers.WeightDigest",
        "extra_trusted_targets=[tests.*]", "+callbacks.digest.out=${hydra:runtime.output_dir}",
        "hydra.run.dir=run",
    ]
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "NODE_RANK")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "run"
    ranks = [json.loads((run_dir / f"weights_rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert ranks[0]["weights"] == ranks[1]["weights"]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and 0.0 <= result["value"] <= 1.0
