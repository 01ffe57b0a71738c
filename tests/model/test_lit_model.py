"""LitModel in anyone's own Lightning Trainer script; the demo's accuracy target."""

from __future__ import annotations

import time

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp import LitModel, Model
from tests.helpers.data import make_batches, make_loaders, make_net
from tests.helpers.trainer import quiet_trainer


def test_litmodel_in_a_plain_trainer(tmp_path):
    net = make_net()
    lit = LitModel(
        net,
        nn.CrossEntropyLoss(),
        torch.optim.Adam(net.parameters(), lr=0.05),
        metrics={"acc", "loss"},
    )
    train, val = make_loaders()
    trainer = quiet_trainer(tmp_path)
    trainer.fit(lit, train, val)
    assert trainer.global_step == 8 * 8  # one optimizer step per batch
    assert trainer.callback_metrics["val/acc"] > 0.9
    assert "val/eval_loss" in trainer.callback_metrics
    res = trainer.validate(lit, val, verbose=False)[0]
    assert res["val/acc"] == pytest.approx(lit.last_eval_results["metrics"]["acc"])
    preds = trainer.predict(lit, DataLoader(TensorDataset(torch.randn(5, 4)), batch_size=5))
    assert preds[0].shape == (5, 2)


def test_litmodel_resumes_from_a_lightning_checkpoint(tmp_path):
    def run(max_epochs, ckpt_path=None):
        torch.manual_seed(0)
        net = make_net()
        lit = LitModel(
            net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        )
        t = L.Trainer(
            max_epochs=max_epochs,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path),
        )
        t.fit(
            lit,
            DataLoader(TensorDataset(*map(torch.cat, zip(*make_batches(4)))), batch_size=16),
            ckpt_path=ckpt_path,
        )
        return net, t

    full, _ = run(4)
    _, t2 = run(2)
    ckpt = t2.checkpoint_callback.best_model_path
    resumed, t3 = run(4, ckpt_path=ckpt)
    assert t3.global_step == 16
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_litmodel_trains_with_gradient_hooks_callback(tmp_path):
    """A callback that overrides a gradient hook takes Lightning's full path, still correct."""

    class GradSeen(L.Callback):
        n = 0

        def on_after_backward(self, trainer, pl_module):
            GradSeen.n += 1

    net = make_net()
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1))
    train, _ = make_loaders()
    quiet_trainer(tmp_path, callbacks=[GradSeen()]).fit(lit, train)
    assert GradSeen.n == 8 * 8


@pytest.mark.slow
def test_demo_reaches_85_percent_on_mnist1d_quickly(tmp_path, monkeypatch):
    """What `make demo` runs: the default experiment of `lit-amp`."""
    pytest.importorskip("mnist1d")
    from lit_amp.cli import main

    monkeypatch.setenv("LIT_AMP_LOG_DIR", str(tmp_path))
    t0 = time.perf_counter()
    acc = main(["task_name=demo"])
    assert acc >= 0.85
    assert time.perf_counter() - t0 < 120
    assert list(tmp_path.rglob("*.ckpt"))


def test_model_trainer_options_are_used(tmp_path):
    net = make_net()
    model = Model(
        net,
        nn.CrossEntropyLoss(),
        torch.optim.SGD(net.parameters(), lr=0.1),
        trainer={"accelerator": "cpu", "default_root_dir": str(tmp_path), "limit_train_batches": 2},
    )
    model.train(3, make_batches(5))
    assert model.trainer.global_step == 6
    assert model.trainer.default_root_dir == str(tmp_path)
