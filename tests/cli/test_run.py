"""A ``lit-amp`` run (``lit_amp.cli.run``): fast_dev_run of every experiment, the entry point,
errors, a sweep (DDP inside runs: tests/cli/test_launch.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_amp.cli import main
from lit_amp.cli.run import run
from tests.cli._helpers import compose_cfg, options

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", options("experiment"))
def test_experiment_fast_dev_run(name, tmp_path):
    cfg = compose_cfg([f"experiment={name}", "debug=fdr", "trainer.accelerator=cpu"], tmp_path,
                      fast=False)
    value = run(cfg)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "ok"
    assert result["mode"] == ("online" if name == "online" else "train")
    if name != "online":
        assert isinstance(value, float) and 0.0 <= value <= 1.0
        assert "acc" in result["metrics"]


def test_main_returns_the_optimized_metric(tmp_path, capsys):
    value = main([
        "data=synthetic", "data.num_train=200", "data.num_valid=100", "epochs=2",
        "valid_frequency=1", "trainer.enable_progress_bar=false", "callbacks=minimal",
        "trainer.log_every_n_steps=1", f"hydra.run.dir={tmp_path}",
    ])
    out = capsys.readouterr().out
    assert isinstance(value, float) and 0.0 <= value <= 1.0
    assert "test accuracy:" in out and "checkpoints:" in out and "| acc" in out
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["value"] == pytest.approx(value)
    # Lightning's ThroughputMonitor (window: one epoch = 2 batches; logged every step here)
    assert result["samples_per_sec"] > 0
    assert list((tmp_path / "checkpoints").glob("*.ckpt"))
    # mode=eval reloads that checkpoint and gets the same accuracy
    ckpt = result["latest_ckpt"]
    again = main(["mode=eval", f"ckpt_path={ckpt}", "data=synthetic", "data.num_train=200",
                  "data.num_valid=100", "trainer.enable_progress_bar=false",
                  f"hydra.run.dir={tmp_path / 'eval'}"])
    assert again == pytest.approx(value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("amp=O5", "Could not find 'amp/O5'"),
        ("amp.level=O7", "Invalid value 'O7', expected one of [O0, O1, O2, O3, auto]"),
        ("epochs=abc", "full_key: epochs"),
        ("epochs=0", "'epochs' must be >= 1"),
        ("optimizer.lr=-1", "the configuration of 'optimizer' was rejected"),
        ("mode=eval", "mode=eval needs a checkpoint"),
    ],
)
def test_config_errors_are_one_clear_message(override, message, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["data=synthetic", override, f"hydra.run.dir={tmp_path}"])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_multirun_sweep_of_two_amp_levels(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable, "-m", "lit_amp", "-m", "amp=O0,O2", "data=synthetic",
        "data.num_train=300", "data.num_valid=100", "epochs=1", "valid_frequency=null",
        "callbacks=minimal", "trainer.enable_progress_bar=false", f"hydra.sweep.dir={sweep}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((sweep / str(i) / "result.json").read_text()) for i in (0, 1)]
    assert [r["amp"] for r in results] == ["O0", "O2"]
    assert all(r["status"] == "ok" and 0.0 <= r["value"] <= 1.0 for r in results)
    summary = (sweep / "summary.md").read_text()
    assert "| 0 | O0 | done |" in summary and "| 1 | O2 | done |" in summary
    assert "lit-amp sweep summary" in proc.stdout
    assert (sweep / "summary.png").is_file()


def test_readme_thor_command_trains_then_evaluates(tmp_path) -> None:
    """README's `lit-amp ... optimizer=thor` with the default experiment (which validates every
    few epochs): MindSpore's THOR model refuses evaluation during training, so the CLI trains
    and evaluates once at the end instead of failing."""
    from tests.cli._helpers import FAST_DATA

    acc = main(["amp=O2", "loss_scale=dynamic", "boost=O1", "optimizer=thor", "epochs=2",
                "logger=none", *FAST_DATA, f"hydra.run.dir={tmp_path}"])
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "ok" and 0.0 <= acc <= 1.0
    assert "acc" in result["metrics"]
