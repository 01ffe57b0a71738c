"""AutoBoost as a Lightning callback: LitModel, plain modules, AMP levels, THOR, pure torch."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp import LitModel
from lit_amp.boost import AutoBoost, CommonHeadLastFN
from lit_amp.demos import ResNet1D


def _loader(n: int = 96, batch: int = 16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 40, generator=g)
    y = (x[:, :20].sum(1) > 0).long() + 2 * (x[:, 20:].sum(1) > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch)


def _trainer(*callbacks, epochs: int = 1, **kw) -> L.Trainer:
    return L.Trainer(
        max_epochs=epochs,
        callbacks=list(callbacks),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        **kw,
    )


def _lit(amp_level: str = "O0", **kw):
    torch.manual_seed(0)
    net = ResNet1D(channels=4, blocks=(2, 2, 2), num_classes=4)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    return (
        net,
        opt,
        LitModel(net, nn.CrossEntropyLoss(), opt, metrics={"acc"}, amp_level=amp_level, **kw),
    )


class _Losses(L.Callback):
    def __init__(self) -> None:
        self.values: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.values.append(float(loss))


def test_o1_with_litmodel_keeps_fast_path():
    net, opt, lit = _lit()
    boost = AutoBoost("O1", {"grad_freeze": {"param_groups": 4}})
    losses = _Losses()
    trainer = _trainer(boost, losses, epochs=4)
    trainer.fit(lit, _loader(), _loader(32))
    less_bn = boost.get_algorithm("less_bn")
    assert less_bn.removed_bn == [f"layers.{i}.bn1" for i in range(6)]
    assert isinstance(net.fc, CommonHeadLastFN)
    opt_params = {id(p) for g in opt.param_groups for p in g["params"]}
    assert opt_params == {id(p) for p in net.parameters()}  # multiplier trained, bias gone
    assert net.fc.multiplier.item() != 1.0
    assert lit._fast  # AutoBoost overrides no gradient hook: LitModel's fast path stays on
    assert boost.get_algorithm("grad_freeze").position == trainer.global_step == 24
    assert all(p.requires_grad for p in net.parameters())  # restored after fit
    assert sum(losses.values[-6:]) < sum(losses.values[:6])
    assert "acc" in lit.last_eval_results["metrics"]


class _Plain(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = ResNet1D(channels=4, blocks=(2, 2, 2), num_classes=4)

    def forward(self, x):
        return self.body(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def test_o1_with_a_plain_lightning_module():
    module = _Plain()
    boost = AutoBoost("O1", {"grad_freeze": {"param_groups": 4}})
    trainer = _trainer(boost)
    trainer.fit(module, _loader())
    # no ``network`` attribute: the module itself is processed
    assert isinstance(module.body.fc, CommonHeadLastFN)
    assert boost.get_algorithm("grad_freeze").position == 6
    opt = trainer.optimizers[0]
    assert any(p is module.body.fc.multiplier for g in opt.param_groups for p in g["params"])


def test_composes_with_amp_o2_applied_first():
    """What Model.train does: AMP conversion before the Trainer, boost's surgery after it (the
    other order, AMP in configure_model, is the boost contract's O2 run)."""
    net, opt, lit = _lit("O2", keep_batchnorm_fp32=True)
    lit.apply_amp(torch.device("cpu"))
    boost = AutoBoost("O1", {"grad_freeze": {"param_groups": 4}})
    losses = _Losses()
    _trainer(boost, losses, epochs=2).fit(lit, _loader())
    assert isinstance(net.fc, CommonHeadLastFN)
    assert len(boost.get_algorithm("less_bn").removed_bn) == 6  # also after AMP conversion
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values)
    assert all(p.dtype == torch.float32 for p in net.parameters())  # fp32 storage kept


def test_thor_is_excluded(caplog):
    class THOR(torch.optim.SGD):
        pass

    torch.manual_seed(0)
    net = ResNet1D(channels=4, blocks=(1, 1), num_classes=4)
    lit = LitModel(net, nn.CrossEntropyLoss(), THOR(net.parameters(), lr=0.1))
    boost = AutoBoost("O2")
    _trainer(boost).fit(lit, _loader())
    assert "not applied with the THOR optimizer" in caplog.text
    assert isinstance(net.fc, nn.Linear)
    assert isinstance(net.layers[0].bn1, nn.BatchNorm1d)


def test_pure_torch_process_and_attach():
    torch.manual_seed(0)
    net = ResNet1D(channels=4, blocks=(2, 2, 2), num_classes=4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    boost = AutoBoost("O1", {"grad_freeze": {"param_groups": 4, "freeze_p": 1.0, "freeze_type": 0}})
    net2, opt2 = boost.network_auto_process_train(net, opt)
    assert net2 is net and opt2 is opt
    assert any(p is net.fc.multiplier for p in opt.param_groups[0]["params"])
    boost.attach(net, [opt])
    x, y = next(iter(_loader()))
    nn.functional.cross_entropy(net(x), y).backward()
    assert net.conv1.weight.grad is None  # index 1: the first group is frozen
    opt.step()
    assert boost.get_algorithm("grad_freeze").position == 1
    boost.detach()
    assert net.conv1.weight.requires_grad
    assert boost.network_auto_process_eval(net) is net
    assert repr(boost) == "AutoBoost(level='O1', enabled=['less_bn', 'grad_freeze'])"


def test_instances_do_not_share_state():
    a, b = AutoBoost("O1"), AutoBoost("O1")
    a.get_algorithm("grad_freeze").position = 5
    assert b.get_algorithm("grad_freeze").position == 0
    assert a.state_dict()["algorithms"]["grad_freeze"]["position"] == 5
    b.load_state_dict(a.state_dict())
    assert b.get_algorithm("grad_freeze").position == 5
