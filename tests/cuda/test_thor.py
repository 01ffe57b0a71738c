"""THOR on the device under mixed precision: it trains, and its statistics stay float32.

``ConvertModelUtils.convert_to_thor_model`` at O2 with dynamic loss scaling (the device's default
dtype: float16 on CUDA), and a user's LightningModule under ``AmpPrecision("O2")`` in float16
and bfloat16. While training, the layers compute in the low dtype on the device; THOR's Kronecker
factors and their inverses (``layers[i].A/G/A_inv/G_inv``, also in the optimizer's
``state_dict()["thor"]``) are float32 tensors on the device; the loss drops and every parameter
stays finite float32.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from lit_amp import AmpPrecision, DynamicLossScaleManager, Model
from lit_amp.callbacks import Callback
from lit_amp.thor import ConvertModelUtils, thor
from tests.helpers.data import make_batches

pytestmark = pytest.mark.cuda

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(),
                         nn.Linear(16, 2))


class _Probe(L.Callback):
    """Per training batch: the compute dtype of the first Linear, THOR's factor dtypes/devices."""

    def __init__(self, net: nn.Module, opt) -> None:
        self.opt = opt
        self.compute: set = set()
        self.factors: set = set()
        net[0].register_forward_pre_hook(
            lambda m, a: self.compute.add((a[0].dtype, m.weight.dtype, a[0].device.type)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for lf in self.opt.layers:
            for t in (lf.A, lf.G, lf.A_inv, lf.G_inv):
                if t is not None:
                    self.factors.add((t.dtype, t.device.type))


def _check_factors(opt, device) -> None:
    assert opt.refreshes >= 2 and all(lf.ready for lf in opt.layers)
    for lf in opt.layers:
        for t in (lf.A, lf.G, lf.A_inv, lf.G_inv):
            assert t.dtype == F32 and torch.isfinite(t).all(), lf
    for layer in opt.state_dict()["thor"]["layers"]:
        for key in ("A", "G", "A_inv", "G_inv"):
            assert layer[key].dtype == F32, key


class _Losses(Callback):
    def __init__(self) -> None:
        self.values: list[float] = []

    def on_train_step_end(self, run_context) -> None:
        out = run_context.original_args().net_outputs
        self.values.append(float(out[0] if isinstance(out, tuple) else out))


def test_thor_model_at_o2_on_the_device(device, on_cuda, accelerator):
    net = _net()
    loss = nn.CrossEntropyLoss()
    opt = thor(net, 0.05, 0.03, 0.9, frequency=3)
    scaler = DynamicLossScaleManager(2.0**16, scale_factor=2, scale_window=50)
    model = Model(net, loss, opt, metrics={"acc"}, amp_level="O2", trainer=accelerator,
                  loss_scale_manager=scaler)
    model = ConvertModelUtils.convert_to_thor_model(model, net, loss, opt, metrics={"acc"},
                                                    amp_level="O2", loss_scale_manager=scaler)
    assert type(model).__name__ == "ThorModel"
    probe, losses = _Probe(net, opt), _Losses()
    model.train(4, make_batches(8), callbacks=[probe, losses])
    low = F16 if on_cuda else BF16
    assert probe.compute == {(low, low, device.type)}  # the layers computed low on the device
    assert probe.factors == {(F32, device.type)}  # the statistics: fp32, on the device
    _check_factors(opt, device)
    assert opt.steps == 32 - model.lit_model.loss_scale.skipped_steps  # skipped: no THOR step
    first, last = sum(losses.values[:8]) / 8, sum(losses.values[-8:]) / 8
    assert last < 0.7 * first, losses.values
    assert all(p.dtype == F32 and torch.isfinite(p).all() for p in net.parameters())
    assert model.eval(make_batches(4, seed=3))["acc"] > 0.8


class _UserModule(L.LightningModule):
    def __init__(self, plugin: AmpPrecision) -> None:
        super().__init__()
        self.net = _net()
        self.plugin = plugin
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        # G is divided by the loss scale the backward ran with (the plugin's current scale)
        self.opt = thor(self.net, 0.05, 0.03, 0.9, frequency=3,
                        grad_scale=lambda: self.plugin.loss_scale)
        return self.opt


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
def test_thor_in_a_users_module_under_amp_precision(device, accelerator, dtype):
    plugin = AmpPrecision("O2", dtype=dtype)  # fp16: MindSpore's dynamic scaling from 2**24
    module = _UserModule(plugin)
    dtypes: set = set()
    module.net[2].register_forward_pre_hook(lambda m, a: dtypes.add((a[0].dtype, m.weight.dtype)))
    trainer = L.Trainer(max_epochs=4, plugins=[plugin], enable_checkpointing=False, **accelerator)
    trainer.fit(module, DataLoader(make_batches(8), batch_size=None))
    assert dtypes == {(dtype, dtype)}
    opt = module.opt
    _check_factors(opt, device)
    if dtype == F16:  # 2**24 overflows float16 for real: those steps are skipped
        assert plugin.skipped_steps >= 1 and plugin.loss_scale < 2.0**24
        assert opt.steps == 32 - plugin.skipped_steps
    else:
        assert plugin.skipped_steps == 0 and opt.steps == 32
    first, last = sum(module.losses[:8]) / 8, sum(module.losses[-8:]) / 8
    assert last < 0.7 * first, module.losses
    assert all(p.dtype == F32 and torch.isfinite(p).all() for p in module.net.parameters())
