"""``Model.train`` / ``eval`` / ``predict`` on the device agree with the same run on the CPU.

fp32 (O0) on an MLP with TF32 off (``exact_fp32``): the per-step losses (recorded by a hook on
the loss module, so sink mode's inner steps count too) and the per-epoch losses MindSpore's
callbacks see, in sink and non-sink mode; after training, ``eval`` and ``predict`` on the device
against the CPU on the same weights.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp import Model
from lit_amp.callbacks import Callback
from tests.helpers.data import make_batches, make_net

pytestmark = pytest.mark.cuda


CPU = {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False,
       "enable_model_summary": False, "logger": False}


class _Losses(Callback):
    """Per-epoch losses: ``net_outputs`` at each epoch end (the sink's last step in sink mode)."""

    def __init__(self) -> None:
        self.epochs: list[float] = []
        self.devices: set[str] = set()

    def on_train_epoch_end(self, run_context) -> None:
        out = run_context.original_args().net_outputs
        self.epochs.append(float(out))
        self.devices.add(out.device.type)


def _train(trainer: dict, sink: bool, epochs: int = 3):
    torch.manual_seed(0)
    net = make_net(hidden=32)
    steps: list[float] = []
    loss_fn = nn.CrossEntropyLoss()
    loss_fn.register_forward_hook(lambda m, a, out: steps.append(float(out.detach())))
    model = Model(net, loss_fn, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                  metrics={"acc", "loss"}, trainer=trainer)
    cb = _Losses()
    model.train(epochs, make_batches(5), callbacks=[cb], dataset_sink_mode=sink)
    return model, net, steps, cb


def _max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))


def test_train_sink_and_non_sink_match_the_cpu(device, accelerator, exact_fp32):
    runs = {(where, sink): _train(kw, sink) for where, kw in (("cpu", CPU), ("dev", accelerator))
            for sink in (False, True)}
    for sink in (False, True):
        _, _, cpu_steps, cpu_cb = runs["cpu", sink]
        _, _, dev_steps, dev_cb = runs["dev", sink]
        assert len(cpu_steps) == 15 and len(cpu_cb.epochs) == 3
        assert dev_cb.devices == {device.type}  # the step ran on the device
        d = _max_diff(dev_steps, cpu_steps)
        assert d <= 1e-5, f"sink={sink}: per-step losses differ from the CPU's by {d:.3g}"
        d = _max_diff(dev_cb.epochs, cpu_cb.epochs)
        assert d <= 1e-5, f"sink={sink}: per-epoch losses differ from the CPU's by {d:.3g}"
        # the epoch loss MindSpore reports is the epoch's last step
        assert dev_cb.epochs == [dev_steps[i] for i in (4, 9, 14)]
    # sink mode (one sink of the dataset's size per epoch) trains exactly as non-sink
    d = _max_diff(runs["dev", True][2], runs["dev", False][2])
    assert d <= 1e-6, f"sink vs non-sink on the device: {d:.3g}"
    assert runs["dev", False][2][-1] < 0.5 * runs["dev", False][2][0]  # it learned


def _cpu_copy(net: nn.Module) -> nn.Module:
    cpu_net = make_net(hidden=32)
    cpu_net.load_state_dict({k: v.cpu() for k, v in net.state_dict().items()})
    return cpu_net.eval()


def test_eval_after_training_on_the_device(device, accelerator, exact_fp32):
    model, net, _, _ = _train(accelerator, sink=False)
    valid = make_batches(4, seed=7)
    seen: set = set()
    net[0].register_forward_pre_hook(lambda m, a: seen.add(a[0].device.type))
    res = model.eval(valid)
    assert seen == {device.type}  # evaluated on the device
    # a CPU Model with the same weights
    cpu_res = Model(_cpu_copy(net), nn.CrossEntropyLoss(), metrics={"acc", "loss"},
                    trainer=CPU).eval(valid)
    assert res["acc"] == cpu_res["acc"] and res["acc"] > 0.8, (res, cpu_res)
    assert res["loss"] == pytest.approx(cpu_res["loss"], rel=1e-5, abs=1e-6), (res, cpu_res)


def test_predict_after_training_on_the_device(device, accelerator, exact_fp32):
    model, net, _, _ = _train(accelerator, sink=False)
    x = make_batches(1, seed=7)[0][0]
    seen = []
    net[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].device.type))
    out = model.predict(x.to(device))
    # computed where the Model trains (MindSpore's predict runs on the device target), fp32
    assert seen == [device.type], f"Model.predict after training on {device} computed on {seen}"
    assert out.dtype == torch.float32 and out.device.type == device.type
    with torch.no_grad():
        ref = _cpu_copy(net)(x)
    d = (out.cpu() - ref).abs().max().item()
    assert d <= 1e-5, f"predictions differ from the CPU's by {d:.3g}"
