"""The Lightning glue (``lit_amp.model._lightning``): LitModel and the strategies that start
their own worker processes; a Trainer call nested in a running fit.

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
from lit_amp.model._lightning import make_trainer, nested_call
from tests.helpers.data import make_batches, make_net

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


def _evaluated_lit() -> LitModel:
    net = make_net()
    return LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                    metrics={"acc"})


def _loader() -> torch.utils.data.DataLoader:
    x, y = (torch.cat(t) for t in zip(*make_batches(2)))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)


class _NestedValidate(L.Callback):
    """At the first epoch end, validates the fitted module with a Trainer of its own."""

    def __init__(self, data) -> None:
        self.data, self.seen = data, {}

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        inner = make_trainer({"accelerator": "cpu"}, [])
        fx_name = pl_module._current_fx_name
        with nested_call(pl_module, inner):
            inner.validate(pl_module, dataloaders=self.data, verbose=False)
            self.seen["inside"] = pl_module._trainer
        self.seen.update(inner=inner, after=pl_module._trainer,
                         fx_name=(fx_name, pl_module._current_fx_name))


def test_a_nested_validate_gives_the_module_back_to_the_running_fit(monkeypatch):
    moved = []
    monkeypatch.setattr(LitModel, "cpu", lambda self: moved.append(self) or self)
    lit = _evaluated_lit()
    data = _loader()
    spy = _NestedValidate(data)
    trainer = make_trainer({"accelerator": "cpu"}, [spy], max_epochs=1)
    trainer.fit(lit, train_dataloaders=data)
    assert spy.seen["inside"] is spy.seen["inner"]  # the inner call ran with its own Trainer
    assert spy.seen["after"] is trainer  # ... and the fit's Trainer is the module's again
    assert spy.seen["fx_name"] == ("on_train_epoch_end", "on_train_epoch_end")
    # the inner teardown left the module in place; the fit's own teardown moved it
    assert moved == [lit]
    assert "cpu" not in lit.__dict__


def test_nested_call_outside_a_fit_changes_nothing():
    lit = _evaluated_lit()
    inner = make_trainer({"accelerator": "cpu"}, [])
    with nested_call(lit, inner):
        inner.validate(lit, dataloaders=_loader(), verbose=False)
    assert lit._trainer is inner  # a plain validate: Lightning's own attachment stays
