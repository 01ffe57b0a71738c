"""A wheel of lit_amp works: built offline, installed into a fresh folder, run from elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_installs_and_runs_from_outside_the_repository(tmp_path):
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info next to its sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "lit_amp", src / "lit_amp",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist, target, work = tmp_path / "dist", tmp_path / "target", tmp_path / "elsewhere"
    work.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist),
                            str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    wheel = next(dist.glob("lit_amp-*.whl"))
    inst = subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert inst.returncode == 0, inst.stderr[-2000:]
    assert (target / "lit_amp" / "cli" / "conf" / "config.yaml").is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LIT_AMP_LOG_DIR")}
    env.update(PYTHONPATH=str(target), OMP_NUM_THREADS="1")
    where = subprocess.run([sys.executable, "-c", "import lit_amp; print(lit_amp.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip().startswith(str(target)), where.stdout + where.stderr
    run = subprocess.run(
        [sys.executable, "-m", "lit_amp", "epochs=1", "data=synthetic", "data.num_train=200",
         "data.num_valid=100", "callbacks=minimal", "trainer.enable_progress_bar=false",
         "hydra.run.dir=out"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((work / "out" / "result.json").read_text())
    assert result["status"] == "ok" and 0.0 <= result["value"] <= 1.0
    assert "test accuracy:" in run.stdout
