"""GradientAccumulation: one optimizer update per window, in LitModel and in a plain module."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp import LitModel
from lit_amp.boost import AutoBoost, GradientAccumulation
from lit_amp.boost.grad_accumulation import accumulation_boundary


def _data(n: int = 48):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8)


def _trainer(cb, epochs: int = 1) -> L.Trainer:
    return L.Trainer(
        max_epochs=epochs,
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )


def test_boundary():
    assert [accumulation_boundary(i, 2) for i in range(4)] == [False, True, False, True]
    with pytest.raises(ValueError, match="'grad_accumulation_step' must be >= 1, but got 0"):
        GradientAccumulation(0)
    with pytest.raises(TypeError, match="must be an int"):
        GradientAccumulation(2.0)


def test_litmodel_window_equals_big_batch():
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    ref = nn.Linear(4, 2)
    ref.load_state_dict(net.state_dict())
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.5))
    boost = AutoBoost(
        "O0",
        {
            "boost": {"mode": "manual", "grad_accumulation": True},
            "grad_accumulation": {"grad_accumulation_step": 3},
        },
    )
    trainer = _trainer(boost)
    trainer.fit(lit, _data())
    assert lit.grad_accumulation_steps == 3
    assert trainer.global_step == 2  # 6 batches / 3
    # the same as SGD on batches of 24 (the mean of 3 micro-batch means)
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    xs = torch.cat([b[0] for b in _data()])
    ys = torch.cat([b[1] for b in _data()])
    for i in range(2):
        opt.zero_grad()
        nn.functional.cross_entropy(
            ref(xs[24 * i : 24 * i + 24]), ys[24 * i : 24 * i + 24]
        ).backward()
        opt.step()
    for a, b in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)


class _Plain(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_automatic_optimization_module():
    trainer = _trainer(GradientAccumulation(2), epochs=2)
    trainer.fit(_Plain(), _data())
    assert trainer.accumulate_grad_batches == 2
    assert trainer.global_step == 6  # 2 epochs x 6 batches / 2
