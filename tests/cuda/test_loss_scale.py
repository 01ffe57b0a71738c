"""Dynamic loss scaling with real float16 overflows on the device, and parity with GradScaler.

A float16 step at the initial scale 2**24 overflows for real: the scaled gradient of the
float16 logits (``2**24 * (p - y) / batch``) exceeds float16's maximum (65504). Each step is
checked against MindSpore's device rule (docs/semantics.md §2.6), transcribed here on its own:
on overflow the scale is divided by ``scale_factor`` (floor 1) and the step is skipped
(parameters and optimizer state unchanged); after ``scale_window`` good steps it grows by the
factor. The same fp16 run driven by lit_amp's ``LossScaleController`` and by
``torch.amp.GradScaler`` (same initial scale, factor 2, backoff 0.5, window = growth_interval)
gives the same scale trajectory, the same skipped steps and the same weights.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_amp import DynamicLossScaleManager, Model, build_train_network
from lit_amp.amp.loss_scale.controller import LossScaleController
from lit_amp.callbacks import Callback
from tests.helpers.data import make_batches, make_net

pytestmark = pytest.mark.cuda

F16 = torch.float16


class MindSporeRule:
    """MindSpore's device-side dynamic loss-scale update (semantics §2.6), in floats."""

    def __init__(self, scale: float, factor: float, window: int) -> None:
        self.scale, self.factor, self.window = scale, factor, window
        self.cur_iter, self.last_overflow_iter = 1, 0

    def __call__(self, overflow: bool) -> float:
        """Update with this step's overflow flag; returns the scale of the next step."""
        after = max(self.scale / self.factor, 1.0) if overflow else self.scale
        grow = (self.cur_iter - self.last_overflow_iter) >= self.window
        if overflow or grow:
            self.last_overflow_iter = self.cur_iter
        self.scale = after * self.factor if (grow and not overflow) else after
        self.cur_iter += 1
        return self.scale


def _params(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def _same_params(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _same_opt_state(a: dict, b: dict) -> bool:
    sa, sb = a["state"], b["state"]
    return sa.keys() == sb.keys() and all(
        torch.equal(torch.as_tensor(sa[k][n]), torch.as_tensor(sb[k][n]))
        for k in sa for n in sa[k]
    )


def _on(device, batches):
    return [(x.to(device), y.to(device)) for x, y in batches]


def test_fp16_overflow_skips_the_step_and_follows_mindspores_rule(device):
    torch.manual_seed(0)
    net = make_net().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    step = build_train_network(
        net, opt, nn.CrossEntropyLoss(), "O2", dtype=F16,
        loss_scale_manager=DynamicLossScaleManager(2.0**24, scale_factor=2, scale_window=2))
    rule = MindSporeRule(2.0**24, 2.0, 2)
    overflows, grew = [], 0
    for i, (x, y) in enumerate(_on(device, make_batches(30))):
        before, opt_before = _params(net), copy.deepcopy(opt.state_dict())
        loss, overflow, scale = step(x, y)
        assert overflow.device.type == device.type and scale.dtype == torch.float32
        assert loss.dtype == torch.float32 and torch.isfinite(loss), i  # the forward is fine
        assert float(scale) == rule.scale, (i, float(scale), rule.scale)  # the scale it used
        ovf = bool(overflow)
        overflows.append(ovf)
        nxt = rule(ovf)
        grew += nxt > float(scale)
        assert step.controller.scale == nxt, (i, step.controller.scale, nxt)
        if ovf:  # the whole step is skipped: parameters and momentum untouched
            assert _same_params(before, _params(net)), i
            assert _same_opt_state(opt_before, opt.state_dict()), i
        else:
            assert not _same_params(before, _params(net)), i
        assert all(torch.isfinite(p).all() for p in net.parameters()), i
    assert overflows[0], "2**24 times the fp16 logits' gradient must overflow float16"
    assert not all(overflows) and grew >= 1, overflows
    assert step.controller.skipped_steps == sum(overflows)


class _Steps(Callback):
    """Per step: the outputs, and whether parameters / optimizer state changed."""

    def __init__(self, net: nn.Module, opt: torch.optim.Optimizer) -> None:
        self.net, self.opt = net, opt
        self.rows: list[dict] = []

    def on_train_step_begin(self, run_context) -> None:
        self._before = (_params(self.net), copy.deepcopy(self.opt.state_dict()))

    def on_train_step_end(self, run_context) -> None:
        loss, overflow, scale = run_context.original_args().net_outputs
        params, state = self._before
        self.rows.append({
            "loss": loss, "overflow": bool(overflow), "scale": float(scale),
            "params_same": _same_params(params, _params(self.net)),
            "opt_same": _same_opt_state(state, self.opt.state_dict()),
            "finite": all(bool(torch.isfinite(p).all()) for p in self.net.parameters()),
            "device": loss.device.type,
        })


def test_model_o2_dynamic_loss_scale_on_the_device(device, on_cuda, accelerator):
    torch.manual_seed(0)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model = Model(net, nn.CrossEntropyLoss(), opt, amp_level="O2", trainer=accelerator,
                  loss_scale_manager=DynamicLossScaleManager(2.0**24, scale_factor=2,
                                                             scale_window=2))
    rec = _Steps(net, opt)
    model.train(2, make_batches(12), callbacks=[rec])
    rule = MindSporeRule(2.0**24, 2.0, 2)
    for i, r in enumerate(rec.rows):
        assert r["device"] == device.type and r["loss"].dtype == torch.float32, (i, r)
        assert r["scale"] == rule.scale, (i, r, rule.scale)
        rule(r["overflow"])
        assert r["params_same"] == r["opt_same"] == r["overflow"], (i, r)  # skipped iff overflow
        assert r["finite"], i
    overflows = [r["overflow"] for r in rec.rows]
    ctl = model.lit_model.loss_scale
    assert ctl.scale == rule.scale and ctl.skipped_steps == sum(overflows)
    if on_cuda:  # float16, MindSpore's CUDA default: 2**24 overflows for real, then it trains
        assert model.lit_model.amp_config.dtype == F16
        assert overflows[0] and not all(overflows), overflows
    else:  # bfloat16 has float32's range: nothing overflows
        assert not any(overflows)


def _run(engine: str, device: torch.device, data, window: int):
    """The same fp16 autocast run, its steps driven by lit_amp or by torch's GradScaler."""
    torch.manual_seed(0)
    net = make_net().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    if engine == "lit_amp":
        ctl = LossScaleController(DynamicLossScaleManager(2.0**24, scale_factor=2,
                                                          scale_window=window))
    else:
        scaler = torch.amp.GradScaler(device.type, init_scale=2.0**24, growth_factor=2.0,
                                      backoff_factor=0.5, growth_interval=window)
    scales, skipped, losses = [], [], []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=F16):
            loss = F.cross_entropy(net(x), y)
        before = _params(net)
        if engine == "lit_amp":
            _, overflow, scale = ctl.step(opt, loss)
            scales.append(float(scale))
            assert bool(overflow) == ctl.last_skipped
        else:
            scales.append(float(scaler.get_scale()))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        skipped.append(_same_params(before, _params(net)))
        losses.append(float(loss.detach()))
    return scales, skipped, losses, net


def test_same_run_as_torch_grad_scaler(device):
    data = _on(device, make_batches(30))
    ours = _run("lit_amp", device, data, window=2)
    torchs = _run("torch", device, data, window=2)
    assert ours[0] == torchs[0], (ours[0], torchs[0])  # the scale each step used
    assert ours[1] == torchs[1]  # the same steps skipped
    assert any(ours[1]) and not all(ours[1]), ours[1]  # real overflows, and real steps
    assert ours[2] == torchs[2]  # the same losses step by step
    diff = max((a - b).abs().max().item()
               for a, b in zip(ours[3].parameters(), torchs[3].parameters()))
    assert diff <= 1e-6, f"final weights differ from GradScaler's run by {diff:.3g}"
