"""Sweep summaries (``lit_amp.cli.sweep_summary``): a ``lit-amp -m`` sweep's exit status, the
table, JSON and plot, mean ± std over seeds, learning curves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_amp.cli import main
from lit_amp.cli.sweep_summary import load_results, markdown_table, seed_table, summarize
from lit_amp.cli.sweep_summary import main as summary_main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sweep_with_a_failed_job_exits_non_zero_and_summarizes_over_seeds(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable, "-m", "lit_amp", "-m", "optimizer.lr=0.01,-1", "seed=0,1",
        "data=synthetic", "data.num_train=200", "data.num_valid=100", "epochs=2",
        "valid_frequency=1", "callbacks=minimal", "trainer.enable_progress_bar=false",
        "trainer.log_every_n_steps=1", f"hydra.sweep.dir={sweep}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "2 of the sweep's jobs failed" in proc.stderr
    statuses = [json.loads((sweep / str(i) / "result.json").read_text())["status"]
                for i in range(4)]
    assert statuses.count("failed") == 2
    summary = (sweep / "summary.md").read_text()
    assert "acc (mean ± std over seed)" in summary
    assert "| 0.01 |" in summary and "| -1 | no successful job | 0 | 2 |" in summary
    assert "2 of 4 jobs FAILED" in summary
    assert (sweep / "curves.png").stat().st_size > 1000
    # the summary command reports the failure too
    assert summary_main([str(sweep)]) == 1


def test_every_job_failed_exits_non_zero(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    with pytest.raises(SystemExit) as info:
        main(["-m", "optimizer.lr=-1,-2", "data=synthetic", "data.num_train=100",
              "data.num_valid=100", "epochs=1", "callbacks=minimal", "logger=none",
              f"hydra.sweep.dir={sweep}"])
    assert info.value.code == 1
    assert "2 of the sweep's jobs failed: job(s) 0, 1" in capsys.readouterr().err


def test_seed_table_mean_and_sample_std():
    rows = [{"overrides": [f"amp={a}", f"seed={s}"], "status": st, "value": v,
             "optimized_metric": "acc"}
            for a, s, v, st in [("O0", 0, 0.5, "ok"), ("O0", 1, 0.7, "ok"), ("O0", 2, 0.9, "ok"),
                                ("O2", 0, 0.6, "ok"), ("O2", 1, None, "failed")]]
    table = seed_table(rows)
    assert "| O0 | 0.7000 ± 0.2000 | 3 | 0 |" in table
    assert "| O2 | 0.6000 ± nan | 1 | 1 |" in table
    assert seed_table([{"overrides": ["amp=O0"]}, {"overrides": ["amp=O2"]}]) is None


def _write(d, i, **kw):
    (d / str(i)).mkdir(parents=True)
    row = {"overrides": [f"amp=O{i}", "epochs=1"], "status": "ok", "value": 0.5 + i / 10,
           "optimized_metric": "acc", "samples_per_sec": 100.0 * (i + 1), "wall_s": 1.0, **kw}
    (d / str(i) / "result.json").write_text(json.dumps(row))


def test_summary_table_json_and_plot(tmp_path):
    _write(tmp_path, 0)
    _write(tmp_path, 1)
    _write(tmp_path, 2, status="failed", value=None, error="RuntimeError: boom")
    rows = load_results(tmp_path)
    assert [r["_dir"] for r in rows] == ["0", "1", "2"]
    table = markdown_table(rows)
    assert table.splitlines()[0] == "| run | amp | state | acc | samples/s | wall s |"
    assert "| 1 | O1 | done | 0.6000 | 200.0 | 1.0 |" in table
    assert "failed: RuntimeError: boom" in table
    summary = summarize(tmp_path)
    assert summary.startswith(table) and summary.endswith("1 of 3 jobs FAILED: 2")
    assert (tmp_path / "summary.md").is_file() and (tmp_path / "summary.json").is_file()
    assert (tmp_path / "summary.png").stat().st_size > 1000


def test_summary_of_an_empty_dir(tmp_path):
    assert summarize(tmp_path) is None
