"""The GPU benchmarks (bench/gpu_*.py, issue #24) run once, blind, on a GPU machine: their dry
runs check every code path and the result files on the CPU, and without CUDA a real run is
refused with a clear message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {"amp": "gpu_amp.py", "host_bound": "gpu_host_bound.py",
           "loss_scale": "gpu_loss_scale.py"}
TIMEOUT = 120


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    for var in ("GPU_OUT", "OUT"):
        env.pop(var, None)
    return env


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict:
    """The three dry runs, started together; ``{name: (returncode, output, out_dir)}``."""
    procs = {}
    for name, script in SCRIPTS.items():
        out = tmp_path_factory.mktemp(f"gpu_{name}")
        procs[name] = (subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / script), "--dry-run", "--out", str(out)],
            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ), out)
    results = {}
    for name, (proc, out) in procs.items():
        try:
            text, _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
            text = f"TIMEOUT after {TIMEOUT} s\n{text}"
        results[name] = (proc.returncode, text, out)
    return results


def _load(dry_runs: dict, name: str) -> tuple[dict, str]:
    rc, text, out = dry_runs[name]
    assert rc == 0, text[-4000:]
    js, md = out / f"gpu_{name}.json", out / f"gpu_{name}.md"
    assert js.is_file() and md.is_file(), sorted(p.name for p in out.iterdir())
    data = json.loads(js.read_text())
    assert data["benchmark"] == f"gpu_{name}"
    assert data["dry_run"] is True
    for key in ("device", "device_name", "driver", "torch", "cuda", "lightning"):
        assert key in data["machine"]
    assert data["elapsed_s"] > 0 and data["budget_s"] > 0
    assert data["targets"] and all(
        {"name", "value", "target", "met"} <= set(t) for t in data["targets"])
    assert isinstance(data["all_targets_met"], bool)
    mdt = md.read_text()
    assert mdt.startswith(f"# gpu_{name}") and data["machine"]["device_name"] in mdt.splitlines()[0]
    return data, mdt


def _check_measured(res: dict, names: list[str]) -> None:
    assert res["errors"] == {}
    assert list(res["median_steps_per_s"]) == names
    for n in names:
        assert res["median_steps_per_s"][n] > 0
        assert len(res["steps_per_s"][n]) == res["rounds"] >= 1


def test_gpu_amp_dry_run(dry_runs):
    data, md = _load(dry_runs, "amp")
    assert set(data["results"]) == {"resnet18", "transformer"}
    for r in data["results"].values():
        names = list(r["how"])
        assert len(names) == 14 and "fp16 lit_amp O2 (Model)" in names
        assert "bf16 lit_amp O2 (AmpPrecision)" in names and "fp16 Lightning 16-mixed" in names
        _check_measured(r, names)
        for dt in ("fp16", "bf16"):
            assert all(v is not None for v in r["ratio_to_hand_autocast"][dt].values())
        assert r["resolved"]["bf16 lit_amp O2 (AmpPrecision)"]["amp"]["dtype"] == "torch.bfloat16"
    assert "| fp16 lit_amp O2 (Model) |" in md


def test_gpu_host_bound_dry_run(dry_runs):
    data, md = _load(dry_runs, "host_bound")
    r = data["results"]
    _check_measured(r, list(r["how"]))
    assert len(r["how"]) == 5
    ident = data["identity_check"]
    assert ident["identical"] is True, ident
    graph = r["resolved"]["Model.train (sink, graph)"]
    assert set(graph) == {"sink_graph_supported", "sink_graph", "sink_graph_status"}
    assert "sink_graph supported" in md


def test_gpu_loss_scale_dry_run(dry_runs):
    data, md = _load(dry_runs, "loss_scale")
    r = data["results"]
    _check_measured(r, list(r["how"]))
    assert set(r["time_ratio_scaled_to_unscaled"]) == {"lit_amp", "torch"}
    dyn = r["resolved"]["lit_amp O2 fp16, dynamic scale"]
    assert dyn["loss_scaling_enabled"] and dyn["skipped_steps"] == 0 and dyn["final_scale"] == 1024
    assert r["resolved"]["lit_amp O2 fp16, no scaling"]["loss_scaling_enabled"] is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the scripts would run for real")
def test_gpu_scripts_refuse_to_run_without_cuda(tmp_path):
    procs = {s: subprocess.Popen([sys.executable, str(ROOT / "bench" / s), "--out",
                                  str(tmp_path)], cwd=ROOT, env=_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for s in SCRIPTS.values()}
    for script, proc in procs.items():
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode != 0, script
        assert "needs a CUDA device; use --dry-run on CPU" in err, (script, err[-2000:])
    assert not list(tmp_path.iterdir())
