"""The instantiate helper (Hydra 1.4 whitelist detection) and the sweep summary."""

from __future__ import annotations

import contextlib
import json

import hydra.utils as hu

from lit_amp.cli import instantiate as inst
from lit_amp.cli.sweep_summary import load_results, markdown_table, summarize


def test_plain_hydra_13_instantiate():
    lin = inst.instantiate({"_target_": "torch.nn.Linear", "in_features": 2, "out_features": 1})
    assert lin.out_features == 1
    assert inst.whitelist_support() is None  # hydra-core 1.3.8 has no whitelist


def test_whitelist_context_is_used_when_hydra_has_one(monkeypatch):
    seen = []

    @contextlib.contextmanager
    def execution_whitelist(patterns):
        seen.append(tuple(patterns))
        yield

    monkeypatch.setattr(hu, "execution_whitelist", execution_whitelist, raising=False)
    assert inst.whitelist_support() == ("context", "execution_whitelist")
    inst.instantiate({"_target_": "torch.nn.Identity"}, trusted=["my_pkg.*"])
    assert seen and "lit_amp.*" in seen[0] and "torch.*" in seen[0] and "my_pkg.*" in seen[0]


def test_whitelist_kwarg_is_used_when_hydra_has_one(monkeypatch):
    calls = {}

    def fake_instantiate(config, *args, _execution_whitelist_=None, **kwargs):
        calls["wl"] = _execution_whitelist_
        return "made"

    monkeypatch.setattr(hu, "instantiate", fake_instantiate)
    monkeypatch.setattr(inst, "_hydra_instantiate", lambda: fake_instantiate)
    assert inst.whitelist_support() == ("kwarg", "_execution_whitelist_")
    assert inst.instantiate({"_target_": "x.Y"}, trusted=["x.*"]) == "made"
    assert "lightning.*" in calls["wl"] and "x.*" in calls["wl"]


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
