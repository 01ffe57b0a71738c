"""The Lightning glue's strategy check (``lit_amp.model._lightning``): LitModel and the
strategies that start their own worker processes.

``ddp_spawn`` / ``ddp_fork`` workers send back only the weights: LitModel refuses them at fit
start, as Model does, naming ``'ddp'``; examples/lightning_trainer.py's documented multi-process
command (``--devices 2 --strategy ddp``) runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

from lit_amp import LitModel
from tests.helpers.data import make_net

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lightning_trainer.py"
REFUSAL = r"'LitModel.fit'.*'trainer'.*strategy='{}'.*only the weights.*strategy='ddp'"


def _lit() -> tuple[LitModel, nn.Module]:
    net = make_net()
    return LitModel(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 0.01)), net


def _trainer(strategy: str) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=1,
                     logger=False, enable_progress_bar=False, enable_checkpointing=False,
                     enable_model_summary=False)


FORK_FIT = """
import torch
from torch.utils.data import DataLoader, TensorDataset
from tests.model.test_lightning import _lit, _trainer

lit, net = _lit()
before = [p.detach().clone() for p in net.parameters()]
data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,))), batch_size=8)
try:
    _trainer("ddp_fork").fit(lit, data)
except Exception as err:
    print("RAISED", type(err).__name__, str(err).replace("\\n", " "))
print("UNCHANGED", all(torch.equal(a, b) for a, b in zip(before, net.parameters())),
      lit.optimizer.state_dict()["state"] == {})
"""


def test_ddp_fork_is_refused_for_litmodel_at_fit_start_naming_ddp():
    # in a fresh interpreter (forking pytest's own process could inherit its threads' locks);
    # the workers refuse before they meet and torch re-raises their ValueError's text here
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", FORK_FIT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    raised = [ln for ln in proc.stdout.splitlines() if ln.startswith("RAISED")]
    assert raised, "LitModel trained under ddp_fork: " + proc.stdout[-2000:]
    assert re.search(REFUSAL.format("ddp_fork"), raised[0]) and "ValueError" in raised[0]
    assert "UNCHANGED True True" in proc.stdout  # no weight or optimizer state touched


def test_ddp_spawn_is_refused_by_the_same_check_at_fit_start():
    # the same hook the workers run (spawning real workers costs ~15 s here)
    lit, _ = _lit()
    trainer = _trainer("ddp_spawn")
    trainer.strategy._lightning_module = lit
    lit.trainer = trainer
    trainer.state.fn = "fit"
    with pytest.raises(ValueError, match=REFUSAL.format("ddp_spawn")):
        lit.configure_callbacks()
    trainer.state.fn = "validate"  # validate/test/predict send back what they return
    lit.configure_callbacks()


@pytest.mark.slow
def test_the_examples_documented_multi_process_command_runs(tmp_path):
    doc = EXAMPLE.read_text().split('"""')[1]
    (devices, strategy), = re.findall(r"\[--devices (\d+) --strategy (\w+)\]", doc)
    assert strategy == "ddp"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--epochs", "1", "--devices", devices,
                           "--strategy", strategy, "--out", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    acc = [float(a) for a in re.findall(r"validation: \{'val/acc': ([0-9.]+)", proc.stdout)]
    assert len(acc) == 2 and min(acc) > 0.3, proc.stdout[-2000:]  # both ranks; chance is 0.1
    assert (tmp_path / "out" / "logs" / "version_0" / "metrics.csv").is_file()
