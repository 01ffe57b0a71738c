"""``lit-amp -m hydra/launcher=slurm`` on a real SLURM cluster: each job of the sweep is one
SLURM job of 2 tasks that Lightning joins into one DDP job; an Optuna search runs its trials as
SLURM jobs; an ``sbatch`` script with ``srun python examples/slurm_train.py`` trains too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.cluster import probe
from tests.cluster.campaign import params, results, steps

pytestmark = pytest.mark.slurm

TIMEOUT_S = 400


def _ok(part: Any) -> Path:
    rc, out = part.wait(TIMEOUT_S)
    assert rc == 0, out[-3000:]
    return part.dir / "sweep"


def test_each_job_is_one_ddp_job_of_two_slurm_tasks_with_disjoint_samples(amp_sweep):
    sweep = _ok(amp_sweep)
    res = results(sweep)
    assert sorted(res) == [0, 1]
    assert [(r["status"], r["amp"]) for r in res.values()] == [("ok", "O0"), ("ok", "O2")]
    summary = {row["job_num"]: row for row in json.loads((sweep / "summary.json").read_text())}
    assert {n: (row["state"], row["value"]) for n, row in summary.items()} == {
        n: ("done", r["value"]) for n, r in res.items()}
    jobs = set()
    for num in res:
        records = probe.read(sweep / str(num) / "probe")
        assert sorted(records) == [0, 1]  # two ranks, one probe file each
        starts = [r for rank in records.values() for r in rank if r["kind"] == "start"]
        assert {(s["job"], s["world"], s["cluster_env"]) for s in starts} == {
            (starts[0]["job"], 2, "SLURMEnvironment")}  # one SLURM job, world size 2
        jobs.add(starts[0]["job"])
        for epoch in (0, 1):
            ids = [{i for r in steps(records[rank]) if r["epoch"] == epoch for i in r["ids"]}
                   for rank in (0, 1)]
            assert not ids[0] & ids[1] and len(ids[0] | ids[1]) == 96  # disjoint, all samples
    assert len(jobs) == 2  # a SLURM job per sweep job


def test_slurm_jobs_end_with_the_metrics_and_weights_of_lightnings_local_ddp(amp_sweep,
                                                                             amp_local):
    """The same sweep launched here by Lightning (2 processes, no SLURM)."""
    sweep, local = _ok(amp_sweep), _ok(amp_local)
    for num, res in results(sweep).items():
        here = results(local)[num]
        assert res["metrics"] == here["metrics"] and res["amp"] == here["amp"]
        a, b = params(sweep / str(num)), params(local / str(num))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_optuna_search_runs_its_trials_as_slurm_jobs(optuna_slurm):
    sweep = _ok(optuna_slurm)
    res = results(sweep)
    assert sorted(res) == [0, 1] and all(r["status"] == "ok" for r in res.values())
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert best["best_value"] == max(r["value"] for r in res.values())
    logs = sorted((sweep / ".submitit").glob("*/*_0_log.out"))
    assert len(logs) == 2 and all("Starting with JobEnvironment" in p.read_text()
                                  for p in logs)  # each trial ran as a SLURM job


def test_sbatch_script_runs_model_fit_as_two_slurm_tasks(sbatch_example):
    rc, out = sbatch_example.wait(TIMEOUT_S)
    run = sbatch_example.dir / "run"
    logs = "".join(p.read_text() for p in sbatch_example.dir.glob("slurm-*.out"))
    assert rc == 0, out + logs
    result = json.loads((run / "result.json").read_text())
    assert result["world_size"] == 2 and result["num_nodes"] == 1
    assert result["slurm_job_id"] and set(result["metrics"]) == {"acc", "loss"}
    assert "world size 2" in logs
