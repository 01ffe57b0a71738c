"""AmpFSDPPrecision under Lightning's real FSDPStrategy: 2 CPU processes (gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("_fsdp_worker.py")


def _run(tmp_path: Path, level: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "NODE_RANK")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(WORKER), str(tmp_path), level], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_fsdp_o2_on_two_cpu_processes(tmp_path):
    (tmp_path / "O0").mkdir()
    (tmp_path / "O2").mkdir()
    base0, base1 = _run(tmp_path / "O0", "O0")
    r0, r1 = _run(tmp_path / "O2", "O2")
    assert r0["world"] == r1["world"] == 2
    for r in (base0, base1):
        assert set(sum(r["seen"].values(), [])) == {"torch.float32"}
    for r in (r0, r1):
        # O2 under FSDP: Linear layers compute in bf16, LayerNorm (black list) in fp32 and
        # hands a bf16 output on (what these forward hooks see), the network output is fp32;
        # the sharded parameters stay stored in fp32
        assert r["seen"]["fc1"] == ["torch.bfloat16"]
        assert r["norm_computes_in"] == ["torch.float32"]
        assert r["seen"]["norm"] == ["torch.bfloat16"]
        assert r["seen"]["fc2"] == ["torch.bfloat16"]
        assert r["seen"]["output"] == ["torch.float32"]
        assert r["storage"] == ["torch.float32"]
        # it learns: the last epoch's mean loss is well below the first one's
        first, last = r["losses"][:8], r["losses"][-8:]
        assert sum(last) / len(last) < 0.7 * sum(first) / len(first)
    # the unsharded weights are identical on both ranks, in fp32, and the O2 run ends where
    # the fp32 (O0) FSDP run ends, up to bf16 rounding
    assert r0["weights"] == r1["weights"] and base0["weights"] == base1["weights"]
    assert r0["full_dtypes"] == ["torch.float32"]
    for name, values in r0["weights"].items():
        torch.testing.assert_close(torch.tensor(values), torch.tensor(base0["weights"][name]),
                                   atol=1e-2, rtol=0)


@pytest.mark.slow
def test_litmodel_under_fsdp_strategy_is_refused_with_the_way_out(tmp_path):
    """LitModel trains inside training_step (manual optimization), which Lightning's FSDP
    strategy cannot run (a backward inside FSDP's forward): a clear ValueError, not FSDP's
    internal assertion."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "NODE_RANK")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(WORKER), str(tmp_path), "O2", "litmodel"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "ValueError: For 'Model'/'LitModel', the argument 'strategy'" in proc.stderr
    assert "AmpFSDPPrecision" in proc.stderr and "HandleTrainingState" not in proc.stderr
    assert "strategy='fsdp2'" in proc.stderr  # the sharded strategy LitModel trains under
