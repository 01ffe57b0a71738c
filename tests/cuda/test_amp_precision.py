"""``AmpPrecision("O2")`` in a Lightning ``Trainer`` on the device, for a LitModel and a user's
LightningModule, in float16 and bfloat16.

The layers compute in the low dtype on the device (BatchNorm in float32 from the low input),
parameters stay float32, float16 gets MindSpore's dynamic loss scaling (2**24 overflows float16
for real, so the first steps are skipped and the scale comes down), bfloat16 none; the loss
drops. Without a ``dtype`` the plugin picks float16 on CUDA, MindSpore's default.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from lit_amp import AmpPrecision, LitModel
from tests.helpers.data import make_batches

pytestmark = pytest.mark.cuda

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


class _Watch(L.Callback):
    """Hooks registered when training starts (after the plugin converted the module): what the
    layers compute with, and the network's output as its caller gets it."""

    def __init__(self, net: nn.Module) -> None:
        self.net = net
        self.seen: dict = {"linear": set(), "bn": set(), "out": set()}

    def on_train_start(self, trainer, pl_module) -> None:
        net, seen = self.net, self.seen
        net[0].register_forward_pre_hook(
            lambda m, a: seen["linear"].add((a[0].dtype, m.weight.dtype, a[0].device.type)))
        net[1].register_forward_pre_hook(
            lambda m, a: seen["bn"].add((a[0].dtype, m.weight.dtype)))
        net.register_forward_hook(lambda m, a, out: seen["out"].add(out.dtype))


class _UserModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _net()
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class _LitLosses(L.Callback):
    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(outputs["loss"])


def _fit(module: L.LightningModule, plugin: AmpPrecision, accelerator: dict, *cbs) -> None:
    trainer = L.Trainer(max_epochs=4, plugins=[plugin], callbacks=list(cbs),
                        enable_checkpointing=False, **accelerator)
    trainer.fit(module, DataLoader(make_batches(8), batch_size=None))


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("kind", ["LitModel", "LightningModule"])
def test_amp_precision_o2_on_the_device(device, accelerator, kind, dtype):
    plugin = AmpPrecision("O2", dtype=dtype)
    if kind == "LitModel":
        net = _net()
        module = LitModel(net, nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
        rec, watch = _LitLosses(), _Watch(net)
        _fit(module, plugin, accelerator, rec, watch)
        losses = rec.losses
    else:
        module = _UserModule()
        net = module.net
        watch = _Watch(net)
        _fit(module, plugin, accelerator, watch)
        losses = module.losses
    seen = watch.seen
    assert plugin.config.dtype == dtype and plugin.config.device_type == device.type
    assert seen["linear"] == {(dtype, dtype, device.type)}  # computed low, on the device
    # BatchNorm computes in fp32 at O2: fp32 weights and statistics, the low activation in
    assert seen["bn"] == {(dtype, F32)}
    assert seen["out"] == {F32}  # the network's output is cast back
    assert all(t.dtype == F32 and torch.isfinite(t) for t in losses) and len(losses) == 32
    if dtype == F16:  # MindSpore's DynamicLossScaleManager(): 2**24, down on real overflows
        assert plugin.controller.enabled and plugin.skipped_steps >= 1
        assert plugin.loss_scale < 2.0**24
    else:
        assert not plugin.controller.enabled and plugin.loss_scale == 1.0
    assert all(p.dtype == F32 and torch.isfinite(p).all() for p in net.parameters())
    first, last = float(sum(losses[:8])) / 8, float(sum(losses[-8:])) / 8
    assert last < 0.7 * first, [float(v) for v in losses]


def test_amp_precision_default_dtype_on_the_device(device, on_cuda, accelerator):
    plugin = AmpPrecision("O2")
    module = _UserModule()
    watch = _Watch(module.net)
    trainer = L.Trainer(max_steps=2, plugins=[plugin], callbacks=[watch],
                        enable_checkpointing=False, **accelerator)
    trainer.fit(module, DataLoader(make_batches(2), batch_size=None))
    seen = watch.seen
    low = F16 if on_cuda else BF16  # MindSpore's float16 on CUDA; bfloat16 on the CPU
    assert plugin.config.dtype == low and plugin.precision == (
        "16-mixed" if on_cuda else "bf16-mixed")
    assert seen["linear"] == {(low, low, device.type)}
    assert plugin.controller.enabled == on_cuda  # O2 float16: dynamic loss scaling
