"""``lit-amp`` on the GPU: the demo experiment and a resume from its checkpoint, as users run
them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cuda


def _lit_amp(args: list[str], cwd, device) -> dict:
    trainer = "trainer=gpu" if device.type == "cuda" else "trainer=cpu"
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-m", "lit_amp", trainer, "logger=csv", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((cwd / args[-1].split("=", 1)[1] / "result.json").read_text())


def test_the_default_experiment_trains_on_the_gpu_at_o2_and_resumes(tmp_path, device):
    first = _lit_amp(["amp=O2", "epochs=3", "hydra.run.dir=runs/first"], tmp_path, device)
    assert first["status"] == "ok" and first["amp"] == "O2"
    assert first["value"] > 0.3  # MNIST-1D CNN after 3 epochs (chance: 0.1)
    ckpt = first["latest_ckpt"]
    assert os.path.isfile(ckpt)
    again = _lit_amp(["amp=O2", "epochs=4", f"ckpt_path={ckpt}", "hydra.run.dir=runs/again"],
                     tmp_path, device)
    assert again["status"] == "ok"
    assert again["latest_ckpt"].endswith(".ckpt") and "-4_" in again["latest_ckpt"]
