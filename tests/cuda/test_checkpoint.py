"""Checkpoints written on the device load on the CPU and back on the device; training resumes.

A ``Model.train`` on the device at O2 with dynamic loss scaling writes lit_amp
``ModelCheckpoint`` files; ``save_checkpoint`` writes a network whose parameters live on the
device. Both load on the CPU (``load_checkpoint`` maps to the CPU) into a fresh network, and back
onto the device with ``load_param_into_net``, with equal weights and equal predictions; a new
Model resumed from the epoch-1 file on the device ends with the uninterrupted run's weights and
loss scale.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp import (
    DynamicLossScaleManager,
    Model,
    load_checkpoint,
    load_param_into_net,
    save_checkpoint,
)
from lit_amp.callbacks import CheckpointConfig, ModelCheckpoint
from tests.helpers.data import make_batches, make_net

pytestmark = pytest.mark.cuda


BATCHES = 4


def _model(trainer: dict, seed: int = 0):
    torch.manual_seed(seed)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model = Model(net, nn.CrossEntropyLoss(), opt, amp_level="O2", trainer=trainer,
                  loss_scale_manager=DynamicLossScaleManager(2.0**12, scale_factor=2,
                                                             scale_window=3))
    return model, net, opt


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    return max((sa[k].cpu() - sb[k].cpu()).abs().max().item() for k in sa)


def test_device_checkpoints_load_on_cpu_and_device_and_resume(tmp_path, device, accelerator,
                                                              exact_fp32):
    model, net, opt = _model(accelerator)
    ckpt = ModelCheckpoint("net", str(tmp_path), CheckpointConfig(save_checkpoint_steps=BATCHES))
    model.train(2, make_batches(BATCHES), callbacks=[ckpt])
    final = ckpt.latest_ckpt_file_name
    assert final.endswith("net-2_4.ckpt")

    # on the CPU: every tensor of the file is a CPU tensor, and the weights are the trained ones
    state = load_checkpoint(final)
    assert all(v.device.type == "cpu" for v in state["network"].values())
    cpu_net = make_net()
    assert load_param_into_net(cpu_net, state, strict_load=True) == ([], [])
    assert _max_diff(cpu_net, net) == 0.0
    assert state["loss_scale"] == model.lit_model.loss_scale.state_dict()

    # back onto the device: equal weights, equal predictions
    dev_net = make_net().to(device)
    load_param_into_net(dev_net, load_checkpoint(final), strict_load=True)
    assert all(p.device.type == device.type for p in dev_net.parameters())
    assert _max_diff(dev_net, cpu_net) == 0.0
    x = make_batches(1, seed=5)[0][0]
    with torch.no_grad():
        d = (dev_net(x.to(device)).cpu() - cpu_net(x)).abs().max().item()
    assert d <= 1e-6, f"device vs CPU predictions of the loaded weights differ by {d:.3g}"

    # save_checkpoint of a network living on the device loads on the CPU as well
    path = str(tmp_path / "dev.ckpt")
    save_checkpoint(dev_net, path)
    again = make_net()
    load_param_into_net(again, load_checkpoint(path), strict_load=True)
    assert _max_diff(again, cpu_net) == 0.0

    # resume on the device from the epoch-1 file: a new Model (other initial weights) trains
    # epoch 2 and ends where the uninterrupted run ended (weights, momentum, loss scale)
    resumed, rnet, ropt = _model(accelerator, seed=3)
    load_checkpoint(str(tmp_path / "net-1_4.ckpt"), net=resumed.lit_model)
    resumed.train(2, make_batches(BATCHES), initial_epoch=1)
    d = _max_diff(rnet, net)
    assert d <= 1e-6, f"resumed weights differ from the uninterrupted run by {d:.3g}"
    mom = [s["momentum_buffer"] for s in opt.state_dict()["state"].values()]
    rmom = [s["momentum_buffer"] for s in ropt.state_dict()["state"].values()]
    assert max((a.cpu() - b.cpu()).abs().max().item() for a, b in zip(mom, rmom)) <= 1e-6
    assert resumed.lit_model.loss_scale.state_dict() == model.lit_model.loss_scale.state_dict()
