"""AMP levels on the device: which dtype each layer computes in, what is stored, what comes out.

``auto_mixed_precision`` at O1/O2/O3 in float16 and bfloat16 on a conv/BatchNorm/linear net,
``Model(amp_level=...)`` training on the device (its default dtype: float16 on CUDA), and
``auto`` (O2 with bfloat16 where the GPU supports it). Layer dtypes are observed with a forward
pre-hook registered after the conversion (it sees the cast inputs and the parameters swapped
in) and a forward hook with ``prepend=True`` (the raw output, before lit_amp casts it).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn

from lit_amp import Model, auto_mixed_precision
from lit_amp.amp.levels import cpu_has_native_bf16
from lit_amp.callbacks import Callback
from tests.helpers.data import make_batches

pytestmark = pytest.mark.cuda

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


class ConvNet(nn.Module):
    """Conv1d -> BatchNorm1d -> ReLU -> Linear -> BatchNorm1d -> ReLU -> Linear (4 -> 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm1d(4)
        self.fc = nn.Linear(16, 16)
        self.bn2 = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x.unsqueeze(1)))).flatten(1)
        return self.head(torch.relu(self.bn2(self.fc(h))))


LAYERS = ("conv", "bn", "fc", "bn2", "head")
BNS = ("bn", "bn2")


def observe(net: nn.Module, names=LAYERS) -> dict:
    """Per layer: the dtype of its input, of its weight during forward, of its raw output."""
    seen: dict[str, dict] = {}

    def pre(name):
        def hook(m, args):
            seen[name] = {"in": args[0].dtype, "w": m.weight.dtype, "dev": args[0].device.type}

        return hook

    def post(name):
        def hook(m, args, out):
            seen[name]["out"] = out.dtype

        return hook

    for name in names:
        mod = getattr(net, name)
        mod.register_forward_pre_hook(pre(name))
        mod.register_forward_hook(post(name), prepend=True)
    return seen


def expected(level: str, low: torch.dtype) -> dict[str, torch.dtype]:
    if level == "O1":  # torch.autocast: Linear / Conv compute low and hand it on, BatchNorm
        return dict.fromkeys(LAYERS, low)  # computes in fp32 from it and returns its dtype
    # O2: everything low except the black list, whose BatchNorm computes in fp32 from the low
    # activation (fp32 weights and statistics, see weights()); O3: BatchNorm low too
    return dict.fromkeys(LAYERS, low)


def weights(level: str, low: torch.dtype) -> dict[str, torch.dtype]:
    """The dtype of each layer's weight during forward: BatchNorm's stay fp32 at O1 and O2;
    at O1 every weight reaches the op in float32 (autocast casts it there)."""
    exp = expected(level, low)
    if level == "O1":
        return dict.fromkeys(LAYERS, F32)
    return {**exp, **dict.fromkeys(BNS, F32)} if level in ("O1", "O2") else exp


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_auto_mixed_precision_layer_dtypes_on_the_device(device, level, dtype):
    torch.manual_seed(0)
    net = ConvNet().to(device)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    auto_mixed_precision(net, level, dtype)
    seen = observe(net)
    x = torch.randn(8, 4, device=device)
    y = torch.randint(0, 2, (8,), device=device)
    out = net(x)
    exp = expected(level, dtype)
    for name in LAYERS:
        got = seen[name]
        assert got["dev"] == device.type, (name, got)
        first = level == "O1" and name == "conv"  # autocast casts the input inside the op
        assert got["in"] == (F32 if first else exp[name]), (level, name, got)
        assert got["w"] == weights(level, dtype)[name], (level, name, got)
        assert got["out"] == exp[name], (level, name, got)  # computed in that dtype
    assert out.dtype == F32  # the network's output is cast back to fp32
    loss = nn.functional.cross_entropy(out, y)
    assert loss.dtype == F32
    loss.backward()
    for n, p in net.named_parameters():
        assert p.dtype == F32 and p.device.type == device.type, n  # stored fp32 on the device
        assert p.grad is not None and p.grad.dtype == F32 and torch.isfinite(p.grad).all(), n
    for bn in BNS:  # BatchNorm's running statistics stay stored fp32 and were updated
        rm = getattr(net, bn).running_mean
        assert rm.dtype == F32 and not torch.equal(rm, before[f"{bn}.running_mean"]), (level, bn)
        assert getattr(net, bn).running_var.dtype == F32


def test_auto_mixed_precision_auto_picks_the_hardwares_dtype(device, on_cuda):
    net = ConvNet().to(device)
    seen = observe(net)
    auto_mixed_precision(net, "auto")
    out = net(torch.randn(8, 4, device=device))
    if on_cuda:  # O2 with bfloat16 where the GPU supports it (H100/H200: yes), else float16
        low = BF16 if torch.cuda.is_bf16_supported() else F16
    else:  # a CPU: bfloat16 where it is native (avx512_bf16 / AMX), else fp32 (O0)
        low = BF16 if cpu_has_native_bf16() else F32
    assert seen["fc"]["w"] == low and seen["head"]["in"] == low
    assert seen["bn"]["w"] == F32 and seen["bn2"]["in"] == F32  # O2 keeps BatchNorm fp32
    assert out.dtype == F32


class _Watch(L.Callback):
    """Hooks registered when training starts (after Model converted the network)."""

    def __init__(self, net: nn.Module) -> None:
        self.net = net
        self.seen: dict = {}

    def on_train_start(self, trainer, pl_module) -> None:
        self.seen = observe(self.net)


class _Outputs(Callback):
    def __init__(self) -> None:
        self.outs: list = []

    def on_train_step_end(self, run_context) -> None:
        self.outs.append(run_context.original_args().net_outputs)


@pytest.mark.parametrize("level", ["O1", "O2", "O3", "auto"])
def test_model_trains_at_each_level_on_the_device(device, on_cuda, accelerator, level):
    torch.manual_seed(0)
    net = ConvNet()
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1,
                                                              momentum=0.9),
                  metrics={"acc"}, amp_level=level, trainer=accelerator)
    watch, outs = _Watch(net), _Outputs()
    model.train(3, make_batches(8), callbacks=[watch, outs])
    cfg = model.lit_model.amp_config
    if level == "auto":
        bf16_ok = torch.cuda.is_bf16_supported() if on_cuda else cpu_has_native_bf16()
        # O2 on a GPU; on a CPU only where bfloat16 is native, else fp32 (O0)
        eff = "O2" if on_cuda or bf16_ok else "O0"
        assert cfg.level == eff and cfg.requested_level == "auto"
        low = (BF16 if bf16_ok else F16) if eff == "O2" else F32
    else:
        eff, low = level, F16 if on_cuda else BF16  # MindSpore's default fp16 on CUDA; CPU bf16
    if eff != "O0":
        assert cfg.dtype == low
    exp = expected(eff, low)
    for name in LAYERS:
        got = watch.seen[name]
        assert got["dev"] == device.type, (name, got)
        assert got["w"] == weights(eff, low)[name] and got["out"] == exp[name], (level, name, got)
    # O2 with float16 (and only then) gets MindSpore's DynamicLossScaleManager by default
    scaled = eff == "O2" and low == F16
    assert (model.lit_model.loss_scale is not None) == scaled
    losses = [o[0] if isinstance(o, tuple) else o for o in outs.outs]
    if scaled:
        assert all(len(o) == 3 for o in outs.outs)  # (loss, overflow, scale)
        assert float(outs.outs[0][2]) == 2.0**24  # MindSpore's default initial scale
    assert all(t.dtype == F32 and torch.isfinite(t) for t in losses)  # the loss is fp32
    assert all(p.dtype == F32 and torch.isfinite(p).all() for p in net.parameters())
    for bn in BNS:
        assert getattr(net, bn).running_mean.dtype == F32
    assert model.predict(torch.randn(3, 4)).dtype == F32  # output cast back to fp32
    assert model.eval(make_batches(4, seed=2))["acc"] > 0.7, level
