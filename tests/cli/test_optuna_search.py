"""``lit-amp -m hparams_search=optuna``: a real Optuna (TPE) search through Hydra's sweeper (#29).

Four trials of one epoch on small synthetic MNIST-1D-shaped data: every trial writes its
``result.json``, the trials try different hyper-parameters, and the best value and parameters
the sweeper reports (``optimization_results.yaml`` in the sweep directory) are those of the
best trial's ``result.json``.
"""

from __future__ import annotations

import json

import pytest
import yaml

from lit_amp.cli import main

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper",
                    reason="needs lit_amp[optuna] (hydra-optuna-sweeper; the dev extra has it)")


def test_optuna_search_reports_the_best_of_its_trials(tmp_path):
    sweep = tmp_path / "search"
    main(["-m", "hparams_search=optuna", "hydra.sweeper.n_trials=4",
          "hydra.sweeper.sampler.n_startup_trials=2", "epochs=1", "data=synthetic",
          "data.num_train=200", "data.num_valid=100", "model=mlp",
          "trainer.enable_progress_bar=false", "logger=none", f"hydra.sweep.dir={sweep}"])
    trials = [json.loads((sweep / str(i) / "result.json").read_text()) for i in range(4)]
    assert [t["status"] for t in trials] == ["ok"] * 4
    searched = ("optimizer.lr=", "data.batch_size=", "amp=")
    points = {tuple(o for o in t["overrides"] if o.startswith(searched)) for t in trials}
    assert len(points) == 4 and all(len(p) == 3 for p in points)  # 4 different trials

    reported = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    values = [t["value"] for t in trials]
    assert all(isinstance(v, float) for v in values)
    assert reported["best_value"] == max(values)
    best = [t for t in trials if t["value"] == max(values)]
    params = {f"{k}={v}" for k, v in reported["best_params"].items()}
    assert any(params <= set(t["overrides"]) for t in best), (params, best)
    # the sweep summary lists every trial too
    summary = (sweep / "summary.md").read_text()
    assert all(f"| {i} |" in summary for i in range(4))
