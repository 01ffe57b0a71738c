"""``lit-amp`` piped: no progress-bar redraws, one line per epoch, the whole run in lit_amp.log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
