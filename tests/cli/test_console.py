"""``lit-amp`` piped: no progress-bar redraws, an epoch line, no noise, the run in lit_amp.log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_piped_run_prints_epoch_lines_and_logs_the_monitors(tmp_path):
    cmd = [sys.executable, "-m", "lit_amp", "epochs=2", "valid_frequency=1", "data=synthetic",
           "data.num_train=200", "data.num_valid=100", "callbacks.loss_monitor.per_print_times=1",
           "hydra.run.dir=out"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    both = proc.stdout + proc.stderr
    assert "\r" not in both and "it/s]" not in both  # no tqdm redraw frames in a pipe
    assert "epoch 1/2" in proc.stdout and "epoch 2/2" in proc.stdout
    assert "train/loss" in proc.stdout  # the epoch line carries the logged values
    log = (tmp_path / "out" / "lit_amp.log").read_text()
    assert "epoch: 1 step: 1, loss is" in log  # MindSpore's LossMonitor
    assert "epoch 2/2" in log and "test accuracy:" in log and "| acc" in log


# ---- issue #48 item 22: the console of a real run, piped, holds no noise -------------------

_SMALL = ["data=synthetic", "model=mlp", "data.num_train=96", "data.num_valid=64"]


def _lit_amp(tmp_path: Path, *overrides: str, env: dict | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """``lit-amp <overrides>`` as a user types it, piped, on a machine with SLURM installed.

    A stand-in ``srun`` is on the PATH (Lightning warns wherever one is found) and the process
    is in no SLURM job, as on a login node or a workstation with SLURM.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    srun = bin_dir / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(0o755)
    exe = Path(sys.executable).with_name("lit-amp")
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "lit_amp"]
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("SLURM_") and k not in ("PYTHONWARNINGS", "HYDRA_FULL_ERROR")}
    full_env = {**base, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **(env or {})}
    return subprocess.run([*cmd, *overrides, "hydra.run.dir=out", "hydra.sweep.dir=sweep"],
                          cwd=tmp_path, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def _lines(proc: subprocess.CompletedProcess) -> list[str]:
    return (proc.stdout + proc.stderr).splitlines()


def test_a_piped_run_prints_each_epoch_once_and_no_lightning_advice(tmp_path):
    proc = _lit_amp(tmp_path, *_SMALL, "epochs=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = _lines(proc)
    text = "\n".join(lines)
    # (a) Lightning's srun hint: 5 lines a run before (one per Trainer), none now
    assert "srun" not in text
    assert "Warning" not in text and "warn" not in text.lower(), text
    # (c) each epoch's eval result once: LossMonitor's line; the epoch line adds the rest
    for e in (1, 2):
        assert sum(ln.startswith(f"Eval result: epoch {e},") for ln in lines) == 1
        epoch_line = [ln for ln in lines if ln.startswith(f"epoch {e}/2")]
        assert len(epoch_line) == 1 and "val/" not in epoch_line[0], text
        assert "train/loss" in epoch_line[0]
    # (f) what README's "Command line" says a piped epoch prints: TimeMonitor's two times,
    # LossMonitor's eval result and the epoch line -- four lines, then the report
    per_epoch = ("Eval epoch time:", "Eval result:", "Train epoch time:", "epoch ")
    assert [ln.split(" ")[0] for ln in lines[:8]] == [p.split(" ")[0] for p in per_epoch * 2]
    assert lines[8] == "" and lines[9].startswith("lit-amp train finished")
    assert len(lines) == 8 + 11, text  # the report: blank, title, 5-line table, acc, 3 paths
    readme = (ROOT / "README.md").read_text()
    assert "TimeMonitor's epoch times, LossMonitor's eval result and one" in readme
    # (d) the eval loss is logged once: a Loss metric ('loss') is the mean eval loss
    metrics_csv = next((tmp_path / "out").rglob("metrics.csv")).read_text().splitlines()[0]
    assert "val/eval_loss" in metrics_csv.split(",") and "val/loss" not in metrics_csv.split(",")
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert set(result["metrics"]) == {"acc", "loss"}  # MindSpore's names are unchanged


@pytest.mark.slow
def test_a_ddp_run_prints_its_notes_once_and_no_sync_dist_advice(tmp_path):
    # 2 CPU processes; THOR: its note about validation, then the evaluation after training
    proc = _lit_amp(tmp_path, *_SMALL, "epochs=1", "logger=none", "optimizer=thor",
                    "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                    timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = "\n".join(_lines(proc))
    # (e) a note of the run once, not once per rank
    assert text.count("optimizer=thor: no validation during training") == 1, text
    # (b) Lightning's sync_dist advice, once per logged metric before: the values are reduced
    assert "sync_dist" not in text, text
    assert "srun" not in text and "Warning" not in text, text  # (a) in the worker too
    assert text.count("lit-amp train finished") == 1 and text.count("epoch 1/1") == 1


@pytest.mark.parametrize("sweep", [False, True])
def test_an_unknown_key_is_one_line(sweep, tmp_path):
    args = ["-m", "foo=1,2"] if sweep else ["foo=1"]
    proc = _lit_amp(tmp_path, *args, "data=synthetic")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr  # 8 lines before
    assert proc.stderr.startswith("lit-amp: no group/key 'foo'; at the top level there are: ")


def test_inside_a_slurm_job_without_srun_the_hint_is_shown_once(monkeypatch):
    import warnings

    from lit_amp.cli.console import quiet_warnings

    hint = "The `srun` command is available on your system but is not used. HINT: test-once"
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # sbatch without srun: the hint may be right
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_warnings()
        for _ in range(3):  # one per Trainer
            warnings.warn(hint, UserWarning, stacklevel=1)
            warnings.warn(hint, UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == [hint]
