"""Sweep state (``lit_amp.cli.sweep_state``): after a SIGTERM in the middle of a ``-m``
sweep the summary lists every job with its state and the sweep is marked incomplete; the same
command with ``--resume`` runs only what is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lit_amp.cli import main
from lit_amp.cli.sweep_summary import main as summary_main

ROOT = Path(__file__).resolve().parents[2]
# job 0 trains 1 epoch, job 1 long enough to be stopped, job 2 two epochs
SWEEP = ["-m", "epochs=1,400,2", "data=synthetic", "data.num_train=64", "data.batch_size=64",
         "data.num_valid=64", "valid_frequency=null", "callbacks=none", "logger=none",
         "trainer.enable_progress_bar=false"]


def _start(cwd: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("LIT_AMP_LOG_DIR", None)
    return subprocess.Popen([sys.executable, "-m", "lit_amp", *SWEEP, *extra], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.slow
def test_sigterm_marks_the_sweep_incomplete_and_resume_runs_the_rest(tmp_path):
    proc = _start(tmp_path)
    multirun = tmp_path / "runs" / "train" / "multirun"
    _wait_for(multirun, proc)
    sweep = next(multirun.iterdir())
    _wait_for(sweep / "1", proc)  # Hydra made job 1's directory: it is starting
    time.sleep(0.2)  # job 1 is building or training (a signal at any point interrupts it)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "the sweep was interrupted by SIGTERM" in err and "--resume" in err

    summary = (sweep / "summary.md").read_text()
    states = {r["job_num"]: r["state"] for r in json.loads((sweep / "summary.json").read_text())}
    assert states == {0: "done", 1: "interrupted", 2: "not started"}
    assert "| 0 | 1 | done |" in summary and "| 1 | 400 | interrupted (SIGTERM) |" in summary
    assert "| 2 | 2 | not started |" in summary
    assert "Sweep incomplete (1 done, 1 interrupted, 1 not started of 3 jobs)" in summary
    assert summary_main([str(sweep)]) == 1  # the summary command says incomplete too
    first = (sweep / "0" / "result.json").read_bytes()

    proc = _start(tmp_path, "--resume")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert f"resuming the sweep in {sweep.relative_to(tmp_path)}" in err
    assert "job epochs=1" in out and "is done (its result.json): not run again" in out
    assert out.count("not run again") == 1  # jobs 1 and 2 ran
    assert (sweep / "0" / "result.json").read_bytes() == first
    rows = json.loads((sweep / "summary.json").read_text())
    assert [(r["job_num"], r["state"]) for r in rows] == [(0, "done"), (1, "done"), (2, "done")]
    assert "incomplete" not in (sweep / "summary.md").read_text()
    assert len(list(multirun.iterdir())) == 1  # the same sweep directory, no new one


def test_resume_refuses_a_sweep_started_with_other_overrides(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps(
        {"overrides": ["seed=0,1,2"], "jobs": [{"job_num": i, "overrides": [f"seed={i}"]}
                                               for i in range(3)]}))
    with pytest.raises(SystemExit) as info:
        main(["-m", "seed=0,1", "--resume", f"hydra.sweep.dir={sweep}"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "was started with other overrides (seed=0,1,2)" in err
    assert sorted(p.name for p in sweep.iterdir()) == ["sweep.json"]  # nothing ran or changed
