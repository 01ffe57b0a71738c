"""``AmpPrecision`` with a user's FSDP2 (``fully_shard``) LightningModule on 2 CPU processes.

Converting after ``configure_model`` sharded the module made the model silently stop learning
(the cast hooks ran after FSDP's reshard); it is now refused with the way out, and the way out
(convert before ``fully_shard``) trains.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_fsdp2_plugin_worker.py")


@pytest.mark.slow
def test_amp_precision_under_fsdp2_refuses_late_conversion_and_trains_early_one(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(WORKER), str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for r in (0, 1):
        res = json.loads((tmp_path / f"plugin{r}.json").read_text())
        err = res["after"]["error"]
        assert err and "'module'" in err and "before fully_shard" in err
        assert "auto_mixed_precision" in err and "fsdp2" in err
        first = res["first"]
        assert first["error"] is None and first["bn"] == "torch.float32"
        assert first["loss"] < 0.7 * res["initial"]
